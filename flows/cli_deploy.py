"""``refusalbench deploy``: schedule refresh rounds of a config on the Prefect API in use.

The config and the schedule are checked first (exit 2, before the API is touched); then the
refresh deployment and the batch watcher (which resumes rounds suspended while their batch jobs
run) are served from this process (``--serve``, the default) or registered for a work pool
(``--pool``) and the command returns. The logic lives in ``deployments/deploy.py``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from refusalbench.tasks.core.errors import OptionError

out = Console(soft_wrap=True)


def deploy(
    config: Path = typer.Option(..., "--config", help="run config of the rounds (generation and evaluation)"),
    cron: str | None = typer.Option(None, "--cron", help='schedule as cron, e.g. "0 4 * * 1" (Mondays 04:00)'),
    interval: str | None = typer.Option(None, "--interval", help="schedule as an interval: 7d, 12h, 30m or seconds"),
    out_root: str = typer.Option("runs/rounds", "--out", help="folder (or s3://...) holding one sub-folder per round"),
    name: str = typer.Option("refresh", "--name", help="the deployment's name (one per config you schedule)"),
    timezone: str = typer.Option("UTC", "--timezone", help="time zone of the cron schedule"),
    serve: bool = typer.Option(False, "--serve", help="run the rounds from this process until Ctrl-C (default)"),
    pool: str | None = typer.Option(None, "--pool", help="register for this work pool instead; its workers run it"),
    watch_every: str = typer.Option(
        "5m", "--watch-every", help="how often the batch watcher resumes runs whose batch jobs ended"
    ),
) -> None:
    """Schedule refresh rounds of a config: served from here, or registered for a work pool's workers."""
    from refusalbench.deployments.deploy import absolute, checked_config, parse_interval, refresh_schedule

    if serve and pool:
        raise OptionError("--serve/--pool", "give one of --serve (run here) and --pool (a pool's workers run it)")
    checked_config(str(config))
    schedule = refresh_schedule(cron, interval, timezone)
    parse_interval(watch_every, "--watch-every")  # checked before the API is touched, as the schedule is
    _deploy(name, absolute(str(config)), absolute(out_root), schedule, pool, watch_every)


def _deploy(name: str, config_path: str, out_root: str, schedule: object, pool: str | None, watch_every: str) -> None:
    from refusalbench.deployments.deploy import (
        ensure_work_pool,
        refresh_deployment,
        register_for_pool,
        serve_here,
        watcher_deployment,
    )
    from refusalbench.tasks.pipeline.prefect_server import embedded_api, wait_until_ready

    @embedded_api
    def register() -> None:
        from prefect.settings import PREFECT_API_URL

        wait_until_ready()
        when = _describe(schedule)
        deployment = refresh_deployment(
            name=name, config_path=config_path, out_root=out_root, schedules=[schedule], for_pool=pool is not None
        )
        watcher = watcher_deployment(watch_every, for_pool=pool is not None)
        api = PREFECT_API_URL.value()
        if pool is None:
            out.print(
                f"serving refusalbench-refresh/{name} ({when}) and the batch watcher (every {watch_every}) on {api}; "
                "Ctrl-C stops",
                highlight=False,
            )
            serve_here(deployment, watcher)
            return
        if ensure_work_pool(pool):
            out.print(f"work pool {pool}: created (type process)", highlight=False)
        register_for_pool(deployment, pool)
        register_for_pool(watcher, pool)
        out.print(
            f"registered refusalbench-refresh/{name} ({when}) and the batch watcher (every {watch_every}) "
            f"for work pool {pool} on {api}\n"
            f"its runs start once a worker polls the pool: prefect worker start --pool {pool}",
            highlight=False,
        )

    register()


def _describe(schedule: object) -> str:
    cron = getattr(schedule, "cron", None)
    if cron:
        return f"cron {cron} {getattr(schedule, 'timezone', None) or 'UTC'}"
    return f"every {getattr(schedule, 'interval', '?')}"
