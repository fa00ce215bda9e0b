"""``refusalbench api``: Prefect's background server that embedded-mode commands start and share.

One server per user, whatever the working folder: its ``PREFECT_HOME`` is in the user's data
folder (``REFUSALBENCH_HOME/prefect`` if that is set; a ``PREFECT_HOME`` you set wins), which a
plain ``prefect`` in the shell does not use (it looks in ``~/.prefect``). It stops itself
after ``REFUSALBENCH_API_IDLE_MINUTES`` unused (default 60, 0: never) unless ``api start``
pinned it. The mechanism is ``tasks/pipeline/prefect_server.py`` (start, use), ``server_state.py`` (find, stop)
and ``api_watchdog.py`` (the idle stop).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import typer
from rich.console import Console

api_app = typer.Typer(
    help="Prefect's background server and UI, which embedded-mode commands start and share.", no_args_is_help=True
)

out = Console(soft_wrap=True)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).isoformat(sep=" ", timespec="seconds")


def _span(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def status_lines(server: dict[str, Any] | None, home: Any, record: dict[str, Any], now: float) -> list[str]:
    """What ``api status`` says: where the server runs, since when, and when it stops."""
    from refusalbench.tasks.pipeline.server_state import last_use, watchdog_pid

    if server is None:
        lines = [
            f"Prefect server: not running (PREFECT_HOME {home}); the next command that runs a flow, "
            "or `refusalbench api start`, starts it"
        ]
        if record.get("stopped_at"):
            lines.append(f"  last stopped: {_when(record['stopped_at'])} ({record.get('stopped_by', 'stopped')})")
        return lines
    lines = [f"Prefect UI: {server['ui']}  (API {server['url']})", f"  PREFECT_HOME: {home}", f"  pid: {server['pid']}"]
    ours = server["record"]
    if not ours:
        lines.append("  started outside refusalbench (`prefect server start`): it runs until `refusalbench api stop`")
        return lines
    started = float(ours.get("started_at") or now)
    lines.append(f"  started: {_when(started)} (up {_span(now - started)})")
    idle_minutes = float(ours.get("idle_minutes") or 0)
    watchdog = watchdog_pid(ours)
    if ours.get("pinned"):
        lines.append("  pinned by `refusalbench api start`: runs until `refusalbench api stop`")
    elif idle_minutes <= 0:
        lines.append(
            "  no idle stop (REFUSALBENCH_API_IDLE_MINUTES=0 when it started): runs until `refusalbench api stop`"
        )
    elif watchdog is None:
        lines.append("  its idle watchdog is gone: the next command that uses the server starts a new one")
    else:
        used = last_use(home, ours)
        lines.append(
            f"  stops itself once idle for {idle_minutes:g} min: at {_when(used + idle_minutes * 60)} if no "
            f"command uses it and no flow run is under way (last used {_when(used)}; watchdog pid {watchdog})"
        )
    return lines


@api_app.command("status")
def api_status() -> None:
    """Where the background Prefect server and its UI run, since when, and when it stops (changes nothing)."""
    from refusalbench.tasks.pipeline.server_state import prefect_home, read_record, running_server

    home = prefect_home()
    server = running_server(home)
    for line in status_lines(server, home, read_record(home), time.time()):
        out.print(line, highlight=False)


@api_app.command("start")
def api_start(
    keep: bool = typer.Option(
        True, "--keep/--no-keep", help="keep it up until `api stop` (default), or let it stop once idle"
    ),
) -> None:
    """Start the server now, or find it, and print its UI address (to look at earlier runs)."""
    from refusalbench.tasks.pipeline.prefect_server import release_embedded_api, start_embedded_api, wait_until_ready
    from refusalbench.tasks.pipeline.server_state import pin, prefect_home

    if not start_embedded_api():
        out.print("PREFECT_API_URL is set: commands use that API, there is nothing to start", highlight=False)
        return
    try:
        wait_until_ready()
        pinned = pin(prefect_home(), keep)
    finally:
        release_embedded_api()
    if pinned is not None:
        out.print(
            "kept up until `refusalbench api stop`"
            if keep
            else "stops itself once idle (`refusalbench api start` keeps it up)",
            highlight=False,
        )
    api_status()


@api_app.command("stop")
def api_stop() -> None:
    """Stop the server and its idle watchdog, as `prefect server stop` does, and wait for it to exit (a command still
    using it fails)."""
    from refusalbench.tasks.pipeline.server_state import prefect_home, stop_background_server

    stopped = stop_background_server()
    out.print(
        f"no background Prefect server was running for {prefect_home()}"
        if stopped is None
        else f"stopped the Prefect server at {stopped['ui']} (pid {stopped['pid']})",
        highlight=False,
    )
