"""``refusalbench deploy``: the refresh deployment of a user's config, on a schedule, on the Prefect API in use.

Served from the calling process (Prefect's ``serve``, as ``deployments/serve.py`` does for the
shipped deployments) or registered for a work pool whose workers run it; the batch watcher
(``watcher_deployment``, which resumes runs suspended while their batch jobs run) goes with it. The schedule is a
cron expression or an interval (``7d``, ``12h``, ``3600``). Both are checked before the API is
touched: a bad one is an ``InputError`` (exit 2).

A pool's workers may start in any folder: the deployment names the flow by its module
(``refusalbench.flows.refresh.refresh_flow``, found wherever RefusalBench is installed) and
its parameters carry absolute local paths.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from refusalbench.tasks.core.errors import OptionError

PREFECT_YAML = Path(__file__).with_name("prefect.yaml")
DEFAULT_NAME = "refresh"
WATCHER_NAME = "batch-watcher"
WATCH_EVERY = "5m"  # how often the batch watcher looks at the jobs of suspended runs (as in prefect.yaml)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_INTERVAL = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_interval(text: str, option: str = "--interval") -> timedelta:
    """``3600`` (seconds), ``90s``, ``30m``, ``12h``, ``7d`` or ``2w`` as a positive time span (``option``: the
    command-line option it came from, named by the error)."""
    match = _INTERVAL.match(str(text))
    seconds = int(match.group(1)) * _UNITS[(match.group(2) or "s").lower()] if match else 0
    if seconds <= 0:
        raise OptionError(
            option, f"{text!r} is not a positive interval: seconds (3600) or a number with s, m, h, d or w (7d)"
        )
    return timedelta(seconds=seconds)


def refresh_schedule(cron: str | None, interval: str | None, timezone: str = "UTC") -> Any:
    """The Prefect schedule for ``--cron`` or ``--interval`` (exactly one is given)."""
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

    if (cron is None) == (interval is None):
        raise OptionError("--cron/--interval", "give exactly one of --cron and --interval")
    if interval is not None:
        return IntervalSchedule(interval=parse_interval(interval), timezone=timezone)
    try:
        return CronSchedule(cron=str(cron), timezone=timezone)
    except ValueError:  # pydantic's ValidationError is one
        raise OptionError(
            "--cron",
            f"{cron!r} is not a cron expression (five fields: minute hour day-of-month month day-of-week, "
            'e.g. "0 4 * * 1" for Mondays 04:00)',
        ) from None


def checked_config(config: str) -> Any:
    """The config a refresh round runs, loaded and checked as far as it can be without a model call."""
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.refusalbench.basesets import base_set_import_hint

    cfg = load_config(config)
    generation = cfg.generation_section()
    cfg.evaluation_section()
    written = generation.base_set
    cfg.input_path(written, ("generation", "base_set"), hint=base_set_import_hint(cfg.resolve_path(written)))
    return cfg


def absolute(path: str) -> str:
    """A local path made absolute (a worker starts elsewhere); a URL (s3://...) as it is."""
    return path if "://" in path else os.path.abspath(path)


def refresh_deployment(
    *,
    name: str,
    config_path: str,
    out_root: str,
    schedules: list[Any] | None,
    rounds_to_compare: int = 5,
    for_pool: bool = False,
) -> Any:
    """The refresh flow as a RunnerDeployment (no API call): what ``serve`` runs or a pool registers."""
    from prefect.types.entrypoint import EntrypointType

    from refusalbench.flows.refresh import refresh_flow

    pool_only: dict[str, Any] = {}
    if for_pool:
        pool_only = {"entrypoint_type": EntrypointType.MODULE_PATH, "job_variables": pool_job_variables()}
    return refresh_flow.to_deployment(
        name=name,
        schedules=schedules,
        parameters={"config_path": config_path, "out_root": out_root, "rounds_to_compare": rounds_to_compare},
        concurrency_limit=1,  # rounds compare with their predecessors: never two at once
        tags=["refusalbench"],  # on every run; the scheduler's own runs also get Prefect's `auto-scheduled`
        description="Scheduled refresh round - generate, verify, evaluate, compare with earlier rounds.",
        **pool_only,
    )


def watcher_deployment(every: str = WATCH_EVERY, for_pool: bool = False) -> Any:
    """The batch watcher as a RunnerDeployment: it resumes the runs suspended while their batch jobs run
    (``flows/batch_watch.py``); one per Prefect API is enough, whatever the configs."""
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.types.entrypoint import EntrypointType

    from refusalbench.flows.batch_watch import batch_watch_flow

    pool_only: dict[str, Any] = {}
    if for_pool:
        pool_only = {"entrypoint_type": EntrypointType.MODULE_PATH, "job_variables": pool_job_variables()}
    return batch_watch_flow.to_deployment(
        name=WATCHER_NAME,
        schedules=[IntervalSchedule(interval=parse_interval(every, "--watch-every"))],
        concurrency_limit=1,  # one look at a time is enough
        tags=["refusalbench"],
        description="Resumes the runs suspended while their batch jobs run, once the jobs end.",
        **pool_only,
    )


def pool_job_variables() -> dict[str, Any]:
    """The job variables prefect.yaml gives its deployments (the engine command, the heartbeat)."""
    spec = yaml.safe_load(PREFECT_YAML.read_text(encoding="utf-8"))
    return dict(spec["definitions"]["work_pool"].get("job_variables") or {})


def ensure_work_pool(pool: str) -> bool:
    """The work pool, created as a process pool if it is missing; True if it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
            return False
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            return True


def register_for_pool(deployment: Any, pool: str) -> str:
    """Register ``deployment`` for ``pool`` on the API in use; its id."""
    return str(deployment.apply(work_pool_name=pool))


def serve_here(*deployments: Any, limit: int = 2) -> None:
    """Register ``deployments`` and run their flow runs from this process until stopped (Ctrl-C)."""
    from prefect import serve

    serve(*deployments, limit=limit)
