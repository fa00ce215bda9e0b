"""The local Prefect API server that embedded-mode commands share (started by ``tasks.prefect_api``).

``python -m refusalbench.tasks.api_server --port P --folder DIR --idle-s S`` serves Prefect's
API app on loopback the way Prefect's own ephemeral server does (SQLite in ``PREFECT_HOME``,
no UI, no background services). Booting it costs ~3.5 s of CPU on 2 cores, more than a
cached re-run of a 200-item evaluation needs for everything else; one server per
``PREFECT_HOME`` shared by the commands run there pays that once, not once per command.

Every command that uses the server holds a shared ``flock`` on ``DIR/users.lock`` for as long
as its process lives (the kernel drops it when the process ends, however it ends). The
server polls for an exclusive lock: while it cannot get one, a command is using it. Once it
has gone ``S`` seconds without a user it removes its entry (``DIR/server.json``, if that
still names it) while holding the lock, so no command can find it any more, and exits.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

POLL_S = 0.5
ENTRY = "server.json"
USERS_LOCK = "users.lock"


def log_path(folder: Path, port: int) -> Path:
    return folder / f"server-{port}.log"


def read_entry(folder: Path) -> dict[str, Any] | None:
    """The current server's entry: pid, url, fingerprint, idle_s, log (None if there is none)."""
    try:
        return json.loads((folder / ENTRY).read_text())
    except (OSError, ValueError):
        return None


def write_entry(folder: Path, entry: dict[str, Any]) -> None:
    staging = folder / f".{ENTRY}.{os.getpid()}"
    staging.write_text(json.dumps(entry))
    staging.replace(folder / ENTRY)  # readers see the old entry or the new one, never half of one


def forget_entry(folder: Path, pid: int) -> None:
    """Remove the entry if it names ``pid`` (a newer server may have replaced it)."""
    entry = read_entry(folder)
    if entry is not None and entry.get("pid") == pid:
        (folder / ENTRY).unlink(missing_ok=True)


def retire_when_unused(server: Any, folder: Path, idle_s: float) -> None:
    """Watcher thread: stop ``server`` (a uvicorn.Server) once no command has used it for ``idle_s``."""
    with open(folder / USERS_LOCK, "a+") as users:
        unused_since: float | None = None
        while not server.should_exit:
            time.sleep(POLL_S)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a command holds its shared lock: in use
                unused_since = None
                continue
            try:
                unused_since = time.monotonic() if unused_since is None else unused_since
                if time.monotonic() - unused_since >= idle_s:
                    # Still holding the lock: no command can find the entry before it is gone.
                    forget_entry(folder, os.getpid())
                    server.should_exit = True
            finally:
                fcntl.flock(users, fcntl.LOCK_UN)


def freeze_after_start(server: Any) -> None:
    """Garbage collection is off while Prefect's server package imports (CPython's full
    collections rescan every object the imports leave, ~0.7 s of the boot here); once the
    app answers, those objects are frozen out of later collections and collection resumes."""
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    gc.freeze()
    gc.enable()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--folder", required=True, help="where the entry and the users lock live")
    parser.add_argument("--idle-s", type=float, required=True, help="seconds without a user before it exits")
    args = parser.parse_args(argv)
    gc.disable()
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=args.port,
                            log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    folder = Path(args.folder)
    threading.Thread(target=retire_when_unused, args=(server, folder, args.idle_s), daemon=True).start()
    threading.Thread(target=freeze_after_start, args=(server,), daemon=True).start()
    try:
        server.run()
    finally:
        forget_entry(folder, os.getpid())
    # A clean stop: nothing in the log is worth keeping (after a crash it stays, for the next command's error).
    log_path(folder, args.port).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
