"""What is known of embedded mode's background Prefect server, read from its PREFECT_HOME, and
how it is stopped: nothing here starts one (``prefect_server`` does) or imports Prefect, so
``refusalbench api status``, ``api stop`` and the idle watchdog (``api_watchdog``) stay light.

- ``prefect_home``: a ``PREFECT_HOME`` set by hand, else ``embedded_home`` (one per user:
  ``REFUSALBENCH_HOME/prefect``, else ``prefect`` in the user's data folder).
- Prefect's own pid file names the server; ``RECORD`` keeps the rest of what its starter
  knew (port, URL, settings fingerprint, started_at, pid, pinned, idle period, watchdog pid,
  when and why it last stopped), and ``USED``'s modification time is its last use.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

PID_FILE = "server.pid"  # Prefect's own (prefect.cli._server_utils.SERVER_PID_FILE_NAME)
RECORD = "refusalbench-server.json"  # what prefect_server knew of the server it started (port, settings, ...)
START_LOCK = "refusalbench-server.lock"
USERS_LOCK = "refusalbench-server.users"
LOG = "refusalbench-server.log"  # what `prefect server start` printed (the server's own output goes nowhere)
USED = "refusalbench-server.used"  # its modification time: when a command last began or ended using the server
WATCHDOG_LOG = "refusalbench-watchdog.log"
WATCHDOG_MODULE = "refusalbench.tasks.pipeline.api_watchdog"
IDLE_ENV = "REFUSALBENCH_API_IDLE_MINUTES"
DEFAULT_IDLE_MINUTES = 60.0
SERVER_APP = b"prefect.server.api.server:create_app"  # in the background server's command line
DEFAULT_PORT = 4200


def embedded_home() -> Path:
    """The embedded server's PREFECT_HOME when none is set: one per user, whatever the working
    folder (``REFUSALBENCH_HOME/prefect``, else ``prefect`` in the user's data folder)."""
    base = os.environ.get("REFUSALBENCH_HOME")
    if base:
        return Path(base).expanduser().resolve() / "prefect"
    import platformdirs

    return Path(platformdirs.user_data_dir("refusalbench")) / "prefect"


def prefect_home() -> Path:
    configured = os.environ.get("PREFECT_HOME")
    return Path(configured).expanduser() if configured else embedded_home()


def idle_minutes() -> float:
    """How long a server this process starts may sit unused before it stops itself (0: never)."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    try:
        minutes = float(raw) if raw else DEFAULT_IDLE_MINUTES
    except ValueError:
        minutes = -1.0
    if not minutes >= 0:  # also NaN
        raise ValueError(f"{IDLE_ENV} must be a number of minutes (0: never stop), not {raw!r}")
    return minutes


# ---------------------------------------------------------------- the server Prefect recorded


def alive(pid: int) -> bool:
    """Whether the process runs (an exited child its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def command_line(pid: int) -> list[bytes] | None:
    """The process's arguments, or None where there is no /proc to read them from."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return None if not Path("/proc/self").exists() else []
    except OSError:
        return []


def _option(arguments: list[bytes] | None, name: str) -> str | None:
    if arguments and name.encode() in arguments[:-1]:
        return arguments[arguments.index(name.encode()) + 1].decode()
    return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def read_record(home: Path) -> dict[str, Any]:
    """What ``prefect_server`` recorded of the last server it started in ``home`` ({} if none)."""
    return _read_json(home / RECORD) or {}


def write_record(home: Path, record: dict[str, Any]) -> None:
    staging = home / f".{RECORD}.{os.getpid()}"
    staging.write_text(json.dumps(record))
    staging.replace(home / RECORD)


def mark_use(home: Path | None = None) -> None:
    """Note that a command uses the server now (the watchdog's idle clock starts again)."""
    with contextlib.suppress(OSError):
        ((home or prefect_home()) / USED).touch()


def last_use(home: Path, record: dict[str, Any]) -> float:
    """When the server was last used: a command's mark, or its start."""
    try:
        used = (home / USED).stat().st_mtime
    except OSError:
        used = 0.0
    return max(used, float(record.get("started_at") or 0.0))


def watchdog_pid(record: dict[str, Any]) -> int | None:
    """The recorded watchdog's pid if that process is still a watchdog."""
    pid = record.get("watchdog_pid")
    if not isinstance(pid, int) or not alive(pid):
        return None
    arguments = command_line(pid)
    if arguments is not None and WATCHDOG_MODULE.encode() not in arguments:
        return None
    return pid


def server_urls(host: str, port: int) -> dict[str, str]:
    base = f"http://{_connect_host(host)}:{port}"
    return {"url": f"{base}/api", "ui": base}


def running_server(home: Path | None = None) -> dict[str, Any] | None:
    """The background server Prefect recorded for ``home`` (pid, port, url, ui, and the
    fingerprint and record if ``prefect_server`` started it), or None if none runs."""
    home = home or prefect_home()
    try:
        pid = int((home / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not alive(pid):
        return None
    arguments = command_line(pid)
    if arguments is not None and SERVER_APP not in arguments:
        return None  # the pid now belongs to another process
    record = _read_json(home / RECORD) or {}
    port = _option(arguments, "--port") or record.get("port") or DEFAULT_PORT
    host = _option(arguments, "--host") or record.get("host") or "127.0.0.1"
    ours = str(record.get("port")) == str(port)
    return {
        "pid": pid,
        "port": int(port),
        "host": host,
        **server_urls(host, int(port)),
        "fingerprint": record.get("fingerprint") if ours else None,
        "log": str(home / LOG),
        "home": str(home),
        "record": record if ours else {},
    }


def stop_server(pid: int, home: Path, timeout_s: float = 10.0) -> None:
    """What `prefect server stop` does (SIGTERM, pid file removed), then wait for the exit; the
    server's watchdog goes too (unless this is it)."""
    (home / PID_FILE).unlink(missing_ok=True)
    _terminate(pid, timeout_s)
    watchdog = watchdog_pid(read_record(home))
    if watchdog is not None and watchdog != os.getpid():
        _terminate(watchdog, timeout_s)


def _terminate(pid: int, timeout_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Reap it if it is this process's child; else give its parent (init) a moment to, so that
    # the pid is gone, not a zombie, once the caller goes on.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.02)


def stop_background_server(home: Path | None = None, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """Stop ``home``'s background server (``refusalbench api stop``) and wait for it to exit:
    its entry, or None if none ran. The pid file goes first, under the start lock, so no
    command finds the server as it stops."""
    home = home or prefect_home()
    if not home.is_dir():
        return None
    with open(home / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)
        entry = running_server(home)
        (home / PID_FILE).unlink(missing_ok=True)
        if entry is not None:
            stop_server(entry["pid"], home, timeout_s)
            if entry["fingerprint"] is not None:
                write_record(home, {**read_record(home), "stopped_at": time.time(), "stopped_by": "api stop"})
        else:  # a watchdog whose server is gone stops by itself; one left from a killed server goes now
            _stop_orphan_watchdog(home)
    return entry


def _stop_orphan_watchdog(home: Path) -> None:
    watchdog = watchdog_pid(read_record(home))
    if watchdog is not None and watchdog != os.getpid():
        _terminate(watchdog, 10.0)


def pin(home: Path, pinned: bool) -> dict[str, Any] | None:
    """Keep ``home``'s server up until ``api stop`` (pinned) or let it stop once idle again: its
    record, or None for a server ``prefect_server`` did not start (it never stops by itself)."""
    with open(home / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)  # a server still starting has written its pid file once this is granted
        server = running_server(home)
        if server is None or server["fingerprint"] is None:
            return None
        record = {**server["record"], "pinned": pinned}
        write_record(home, record)
    return record
