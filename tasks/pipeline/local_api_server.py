"""The local Prefect API server that embedded-mode commands share (started by ``tasks.prefect_api``).

``python -m refusalbench.tasks.pipeline.local_api_server --port P --folder DIR --idle-s S`` serves Prefect's
API app on loopback the way Prefect's own ephemeral server does (SQLite in ``PREFECT_HOME``,
no UI, no background services). Booting it takes about 3 s on 2 cores, more than a
cached re-run of a 200-item evaluation needs for everything else; one server per
``PREFECT_HOME`` shared by the commands run there pays that once, not once per command.

Two locks (``flock``) in DIR keep finding and retiring apart:

- ``start.lock``: a command holds it while it reads ``server.json`` (the current server's
  entry) and takes its place among the server's users, or starts a new server;
- ``users-P.lock``: every command using the server on port P holds a shared lock on it for
  as long as its process lives (the kernel drops it when the process ends, however it ends).

Every half second the server tries both without waiting. While a command is choosing, or
one holds a shared lock, it is in use. Once it has been unused for ``S`` seconds, or at
once if a newer server has replaced its entry, it removes its entry while it still holds
both locks, so no command can find it any more, and exits.
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
START_LOCK = "start.lock"


def log_path(folder: Path, port: int) -> Path:
    return folder / f"server-{port}.log"


def users_lock_path(folder: Path, port: int) -> Path:
    return folder / f"users-{port}.lock"


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


def _try_lock(file: Any) -> bool:
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def retire_when_unused(server: Any, folder: Path, port: int, idle_s: float) -> None:
    """Watcher thread: stop ``server`` (a uvicorn.Server) once no command has used it for
    ``idle_s`` seconds, or as soon as it is unused if a newer server has taken its entry."""
    me = os.getpid()
    with open(folder / START_LOCK, "a+") as start, open(users_lock_path(folder, port), "a+") as users:
        unused_since: float | None = None
        while not server.should_exit:
            time.sleep(POLL_S)
            if not _try_lock(start):
                continue  # a command is choosing a server: ask again next time
            try:
                if not _try_lock(users):
                    unused_since = None  # a command holds its shared lock: in use
                    continue
                unused_since = time.monotonic() if unused_since is None else unused_since
                entry = read_entry(folder)
                replaced = entry is None or entry.get("pid") != me
                if replaced or time.monotonic() - unused_since >= idle_s:
                    forget_entry(folder, me)
                    server.should_exit = True
                fcntl.flock(users, fcntl.LOCK_UN)
            finally:
                fcntl.flock(start, fcntl.LOCK_UN)


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
    parser.add_argument("--folder", required=True, help="where the entry and the locks live")
    parser.add_argument("--idle-s", type=float, required=True, help="seconds without a user before it exits")
    args = parser.parse_args(argv)
    gc.disable()
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=args.port,
                            log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    folder = Path(args.folder)
    threading.Thread(target=retire_when_unused, args=(server, folder, args.port, args.idle_s), daemon=True).start()
    threading.Thread(target=freeze_after_start, args=(server,), daemon=True).start()
    try:
        server.run()
    finally:
        forget_entry(folder, os.getpid())
        users_lock_path(folder, args.port).unlink(missing_ok=True)
    # A clean stop: nothing in the log is worth keeping (after a crash it stays, for the next command's error).
    log_path(folder, args.port).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
