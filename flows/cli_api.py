"""``refusalbench api``: Prefect's background server that embedded-mode commands start and share.

Thin wrappers of ``prefect server start --background`` / ``prefect server stop`` under the
project's ``PREFECT_HOME`` (``./.prefect`` unless set), which a plain ``prefect`` in the shell
does not use (it looks in ``~/.prefect``). The mechanism is ``tasks/pipeline/prefect_server.py``.
"""

from __future__ import annotations

import typer
from rich.console import Console

api_app = typer.Typer(help="Prefect's background server and UI, which embedded-mode commands start and share.",
                      no_args_is_help=True)

out = Console(soft_wrap=True)


@api_app.command("status")
def api_status() -> None:
    """Where this PREFECT_HOME's background Prefect server and its UI run (the first command that runs a flow starts it)."""
    from refusalbench.tasks.pipeline.prefect_server import prefect_home, running_server

    server = running_server()
    if server is None:
        out.print(f"no background Prefect server for {prefect_home()}", highlight=False)
        return
    out.print(f"Prefect UI: {server['ui']}  (API {server['url']}, pid {server['pid']}; "
              "`refusalbench api stop` stops it)", highlight=False)


@api_app.command("start")
def api_start() -> None:
    """Start the server now, or find it, and print its UI address (to look at earlier runs)."""
    from refusalbench.tasks.pipeline.prefect_server import release_embedded_api, start_embedded_api, wait_until_ready

    if not start_embedded_api():
        out.print("PREFECT_API_URL is set: commands use that API, there is nothing to start", highlight=False)
        return
    try:
        wait_until_ready()
    finally:
        release_embedded_api()
    api_status()


@api_app.command("stop")
def api_stop() -> None:
    """Stop the server as `prefect server stop` does, and wait for it to exit (a command still using it fails)."""
    from refusalbench.tasks.pipeline.prefect_server import prefect_home, stop_background_server

    stopped = stop_background_server()
    out.print(f"no background Prefect server was running for {prefect_home()}" if stopped is None
              else f"stopped the Prefect server at {stopped['ui']} (pid {stopped['pid']})", highlight=False)
