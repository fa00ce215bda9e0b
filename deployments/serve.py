"""Serve the RefusalBench flows from one long-running process: ``python -m refusalbench.deployments.serve``.

The alternative to ``deployments/prefect.yaml`` + work pool + workers: this process
registers the same deployments (refresh on a cron schedule; the batch watcher every five
minutes; generate, evaluate and knowornot ad hoc) with the Prefect API in ``PREFECT_API_URL`` and runs their flow runs
itself, as subprocesses, until stopped (Ctrl-C pauses the schedule). Good for one machine;
use the work pool when runs should spread over several.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m refusalbench.deployments.serve --cron "0 4 * * 1"

``refusalbench deploy`` does the same for the refresh of one config of the user's, served or
registered for a work pool. Defaults here come from the environment so a container needs no arguments:
REFUSALBENCH_REFRESH_CRON, REFUSALBENCH_CONFIG, REFUSALBENCH_KNOWORNOT_CONFIG, REFUSALBENCH_REFRESH_OUT,
REFUSALBENCH_SERVE_LIMIT. The knowornot deployment has a config of its own (the RefusalBench
configs have no knowornot section).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

DEFAULT_CRON = "0 4 * * 1"  # Mondays 04:00 UTC, as in prefect.yaml
DEFAULT_CONFIG = "configs/demo.yaml"
DEFAULT_KNOWORNOT_CONFIG = "configs/knowornot-demo.yaml"  # as in prefect.yaml
DEFAULT_OUT_ROOT = "runs/refresh"
TAGS = ["refusalbench"]

log = logging.getLogger("refusalbench")


def build_deployments(
    *,
    cron: str | None,
    config_path: str,
    out_root: str,
    rounds_to_compare: int = 5,
    timezone: str = "UTC",
    knowornot_config_path: str | None = None,
) -> list[Any]:
    """The deployments of prefect.yaml as RunnerDeployments (no API call is made here).

    ``cron=None`` registers the refresh without a schedule (trigger it by hand). The
    knowornot deployment gets ``knowornot_config_path``, or ``config_path`` when that is None.
    """
    from prefect.client.schemas.schedules import CronSchedule

    from refusalbench.deployments.deploy import refresh_deployment, watcher_deployment
    from refusalbench.flows.evaluation import evaluation_flow
    from refusalbench.flows.generation import generation_flow
    from refusalbench.flows.knowornot import knowornot_flow

    adhoc: dict[str, Any] = {"parameters": {"config_path": config_path}, "tags": [*TAGS, "adhoc"]}
    return [
        refresh_deployment(
            name="refresh",
            config_path=config_path,
            out_root=out_root,
            schedules=[CronSchedule(cron=cron, timezone=timezone)] if cron else None,
            rounds_to_compare=rounds_to_compare,
        ),
        watcher_deployment(),
        generation_flow.to_deployment(name="generate", description="Generation flow (ad hoc).", **adhoc),
        evaluation_flow.to_deployment(name="evaluate", description="Evaluation flow (ad hoc).", **adhoc),
        knowornot_flow.to_deployment(
            name="knowornot",
            description="KnowOrNot pipeline (ad hoc).",
            parameters={"config_path": knowornot_config_path or config_path},
            tags=adhoc["tags"],
        ),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m refusalbench.deployments.serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--cron",
        default=env.get("REFUSALBENCH_REFRESH_CRON", DEFAULT_CRON),
        help="refresh schedule, cron syntax (UTC); 'none' for no schedule [%(default)s]",
    )
    parser.add_argument("--timezone", default="UTC")
    parser.add_argument(
        "--config", default=env.get("REFUSALBENCH_CONFIG", DEFAULT_CONFIG), help="run config [%(default)s]"
    )
    parser.add_argument(
        "--knowornot-config",
        default=env.get("REFUSALBENCH_KNOWORNOT_CONFIG", DEFAULT_KNOWORNOT_CONFIG),
        help="the knowornot deployment's config [%(default)s]",
    )
    parser.add_argument(
        "--out-root",
        default=env.get("REFUSALBENCH_REFRESH_OUT", DEFAULT_OUT_ROOT),
        help="folder (or s3://...) holding the refresh rounds [%(default)s]",
    )
    parser.add_argument("--rounds-to-compare", type=int, default=5)
    parser.add_argument(
        "--limit",
        type=int,
        default=int(env.get("REFUSALBENCH_SERVE_LIMIT", "2")),
        help="flow runs executed at once by this process [%(default)s]",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        log.warning(
            "PREFECT_API_URL is not set: serving against a temporary local API (no UI). "
            "Start `prefect server start` and export PREFECT_API_URL to watch runs."
        )
    from prefect import serve

    cron = None if str(args.cron).lower() in ("", "none", "off") else args.cron
    deployments = build_deployments(
        cron=cron,
        config_path=args.config,
        out_root=args.out_root,
        rounds_to_compare=args.rounds_to_compare,
        timezone=args.timezone,
        knowornot_config_path=args.knowornot_config,
    )
    serve(*deployments, limit=args.limit)


if __name__ == "__main__":
    main()
