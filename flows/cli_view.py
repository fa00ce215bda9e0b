"""``refusalbench view``: explore run folders item by item in a browser (``tasks/viewer/``).

The folders are checked and read before the server starts: a folder that is no run folder is
one line naming it (exit 2). The server listens on loopback unless ``--host`` says otherwise,
prints its URL, and runs until interrupted (Ctrl-C exits 0).
"""

from __future__ import annotations

import socket
import sys

import typer

from refusalbench.tasks.core.errors import InputError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _bound(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), or an InputError naming the option."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"{host}:{port}", f"cannot listen there: {exc.strerror or exc}", field="--port") from None
    sock.listen(128)
    return sock


def view(
    runs: list[str] = typer.Argument(..., metavar="RUN", help="run folders: local paths or s3://bucket/prefix"),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="port to listen on (0: any free port)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (default: loopback only)"),
) -> None:
    """Explore run folders in a browser: leaderboards, items with filters and search, two runs compared.

    Each item shows its change, the verifiers' votes, every model's reply and the judge's view. Read-only.
    """
    import uvicorn

    from refusalbench.tasks.viewer.app import create_app, load_runs
    from refusalbench.tasks.viewer.folders import open_folders

    folders = open_folders(runs)
    print(f"loading {len(folders)} run folder{'s' if len(folders) != 1 else ''} ...", file=sys.stderr, flush=True)
    app = create_app(load_runs(folders))
    sock = _bound(host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"refusalbench view: http://{shown}:{sock.getsockname()[1]}/  (Ctrl-C stops)", flush=True)
    if host not in LOOPBACK:
        print(f"warning: listening on {host}: anyone who can reach it can read these runs", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn stops on Ctrl-C and raises it again once shut down: stopping is this command's normal end
    finally:
        sock.close()
