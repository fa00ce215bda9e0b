"""Prefect's API in embedded mode: one local server per ``PREFECT_HOME``, shared by the commands run there.

With no ``PREFECT_API_URL``, Prefect itself would boot an API server in a subprocess for
every process that runs a flow, and stop it at exit. That boot takes about 3 s on 2
cores: more than a cached re-run of a 200-item evaluation needs for everything else. So
the first command starts one server (``tasks/pipeline/local_api_server.py``: Prefect's API app, as Prefect
serves it) and records it in ``PREFECT_HOME/refusalbench-api/server.json``; later commands
find it there and use it at once. Prefect sees it through ``PREFECT_API_URL``.

- The server is started as the command starts, so a first command's server boots while
  the flow's modules import and the inputs are checked; the flow waits for it
  (``wait_until_ready``) just before it starts.
- A command holds a shared lock on the server's ``users-PORT.lock`` while its process
  lives, and the server keeps running while anyone holds it, then
  ``REFUSALBENCH_PREFECT_API_IDLE_S`` seconds more (default 600; 0 stops it as soon as the
  last command ends) before it exits (``tasks/pipeline/local_api_server.py`` has the locking in full).
- A command that fails its input checks before any flow used a server it started stops
  that server again at once (unless another command has begun to use it).
- A server started under other server settings (database URL, profile, Prefect version,
  Python) is not reused: the command starts a new one, which becomes the recorded one; the
  old one exits once its last command has ended.
- A user who set ``PREFECT_API_URL`` (a server, Prefect Cloud, a test harness) keeps it:
  nothing is started then.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Callable, Iterator, TypeVar

from refusalbench.tasks.pipeline.local_api_server import (START_LOCK, forget_entry, log_path, read_entry, users_lock_path,
                                             write_entry)
from refusalbench.tasks.pipeline.preload import preload

Launch = TypeVar("Launch", bound=Callable[..., Any])

IDLE_ENV = "REFUSALBENCH_PREFECT_API_IDLE_S"
DEFAULT_IDLE_S = 600.0
SERVER_MODULE = "refusalbench.tasks.pipeline.local_api_server"
# Settings that shape what the server is (which database, which Prefect): a server started
# under others is not reused.
_SERVER_SETTINGS = ("PREFECT_SERVER_", "PREFECT_API_DATABASE_", "PREFECT_PROFILE")

_users: IO[str] | None = None  # this process's shared lock on the server's users lock: held while it uses it
_entry: dict[str, Any] | None = None  # the server this process uses
_spawned: subprocess.Popen[bytes] | None = None  # set when this process started that server
_used = False  # a flow has been started against it


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()


def api_folder() -> Path:
    return prefect_home() / "refusalbench-api"


def idle_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S)))
    except ValueError:
        return DEFAULT_IDLE_S


def server_fingerprint() -> str:
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith(_SERVER_SETTINGS))
    return hashlib.sha256(repr((sys.executable, metadata.version("prefect"), settings)).encode()).hexdigest()[:16]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_alive(entry: dict[str, Any]) -> bool:
    """The entry's process still runs and is a server of ours (not a process that reused its pid)."""
    pid = int(entry.get("pid") or 0)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, ValueError, OverflowError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or SERVER_MODULE.encode() in cmdline.read_bytes()


def _api_configured() -> bool:
    """An API URL in the environment, or in Prefect's settings (a test harness sets it there; a
    profile or settings file may too: then Prefect is asked, at the price of importing it first)."""
    if os.environ.get("PREFECT_API_URL"):
        return True
    if "prefect.settings" in sys.modules or settings_files_mention_api():
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value())
    return False


_API_TABLE = re.compile(r"^\s*\[(tool\.prefect\.)?api\]", re.MULTILINE)


def settings_files_mention_api(cwd: Path | None = None) -> bool:
    """Whether a file Prefect reads its settings from (the active profiles file, ./prefect.toml,
    ./.env, ./pyproject.toml) may set the API URL."""
    cwd = cwd or Path.cwd()
    home = prefect_home()
    files = [Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser(),
             cwd / "prefect.toml", cwd / ".env", cwd / "pyproject.toml"]
    for file in files:
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "PREFECT_API_URL" in text or _API_TABLE.search(text):
            return True
    return False


def _spawn_server(folder: Path, fingerprint: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    port = _free_port()
    log = log_path(folder, port)
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    with open(log, "wb") as output:
        # Its own session: a Ctrl-C in the terminal stops the command, not the server other commands use.
        process = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "--port", str(port), "--folder", str(folder), "--idle-s", str(idle_seconds())],
            env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True)
    entry = {"pid": process.pid, "port": port, "url": f"http://127.0.0.1:{port}/api", "fingerprint": fingerprint,
             "idle_s": idle_seconds(), "log": str(log), "started_at": time.time()}
    write_entry(folder, entry)
    return process, entry


def start_embedded_api() -> bool:
    """Use this PREFECT_HOME's shared server, starting one if there is none (or none that fits);
    True if this call pointed PREFECT_API_URL at it, False if an API was configured already."""
    global _users, _entry, _spawned, _used
    if _entry is not None or _api_configured():
        return False
    folder = api_folder()
    folder.mkdir(parents=True, exist_ok=True)
    fingerprint = server_fingerprint()
    with open(folder / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)  # one command at a time finds or starts the server
        entry = read_entry(folder)
        spawned = None
        if not (entry and entry.get("fingerprint") == fingerprint and "port" in entry and server_alive(entry)):
            spawned, entry = _spawn_server(folder, fingerprint)
        users = open(users_lock_path(folder, entry["port"]), "a+")
        fcntl.flock(users, fcntl.LOCK_SH)  # from here on the server cannot retire under this process
    _users, _entry, _spawned, _used = users, entry, spawned, False
    os.environ["PREFECT_API_URL"] = entry["url"]
    atexit.register(release_embedded_api)
    return True


def embedded_api(launch: Launch) -> Launch:
    """Decorator for the CLI's ``run_*``: the server is found or started as the call starts. A
    call that fails before its flow used the server (bad input: exit 2) stops using it at once,
    and stops it if this call started it and no other command has begun to use it."""
    @functools.wraps(launch)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = start_embedded_api()
        try:
            with local_server_settings() if _entry is not None else contextlib.nullcontext():
                return launch(*args, **kwargs)
        except BaseException:
            if started and not _used:
                release_embedded_api(stop_unused=True)
            raise

    return call  # type: ignore[return-value]


@contextlib.contextmanager
def local_server_settings() -> Iterator[None]:
    """Prefect settings for flows run against the local server: no flow-run heartbeats. They
    are there for a server's services to mark crashed runs, and the local server runs none
    (Prefect's ephemeral mode), yet every flow run's end waits up to a second for its
    heartbeat thread, which sleeps in one-second steps."""
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield


def wait_until_ready(timeout_s: float | None = None) -> None:
    """Return once the server this process uses answers its health check (at once if it uses none)."""
    global _used
    if _entry is None:
        return
    _used = True
    limit = timeout_s or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"))
    url = _entry["url"] + "/health"
    deadline = time.monotonic() + limit
    waiting = False
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if not waiting:  # the server is still booting: load what the flow needs later meanwhile
            waiting = True
            preload()
        running = _spawned.poll() is None if _spawned is not None else server_alive(_entry)
        if not running:
            raise RuntimeError(f"Prefect's API server (pid {_entry['pid']}) exited while starting: {_log_tail(_entry)}")
        time.sleep(0.05)
    raise RuntimeError(f"Prefect's API server did not answer within {limit:.0f} s: {_log_tail(_entry)}")


def _log_tail(entry: dict[str, Any]) -> str:
    try:
        text = Path(entry["log"]).read_text(encoding="utf-8", errors="replace")
    except (OSError, KeyError):
        text = ""
    return text[-1500:].strip() or "(nothing in its log)"


def release_embedded_api(stop_unused: bool = False) -> None:
    """Stop using the server (idempotent): PREFECT_API_URL is unset and this process's lock dropped.
    With ``stop_unused``, a server this process started is stopped if no other command uses it."""
    global _users, _entry, _spawned
    users, entry, spawned = _users, _entry, _spawned
    _users = _entry = _spawned = None
    if entry is not None and os.environ.get("PREFECT_API_URL") == entry["url"]:
        del os.environ["PREFECT_API_URL"]  # a later flow in this process must not look for a stopped server
    if users is None:
        return
    with users:
        if stop_unused and spawned is not None:
            _stop_if_unused(spawned, users)


def _stop_if_unused(process: subprocess.Popen[bytes], users: IO[str]) -> None:
    """Stop the server this process started, unless another command has begun to use it.
    Under the start lock no command can be finding it meanwhile; this process's own shared
    lock becomes exclusive only if no one else holds one."""
    folder = api_folder()
    with open(folder / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another command uses it: it stays
        forget_entry(folder, process.pid)
        _terminate(process)


def _terminate(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_shared_server(timeout_s: float = 10.0) -> tuple[dict[str, Any], bool] | None:
    """Stop this PREFECT_HOME's shared server now (``refusalbench api stop``): its entry and
    whether it was still running, or None if none was recorded. The entry goes first, under
    the start lock, so no command finds the server as it stops."""
    folder = api_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)
        entry = read_entry(folder)
        if entry is None:
            return None
        forget_entry(folder, int(entry["pid"]))
    running = server_alive(entry)
    if running:
        os.kill(int(entry["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while server_alive(entry) and time.monotonic() < deadline:
            time.sleep(0.1)
        if server_alive(entry):
            os.kill(int(entry["pid"]), signal.SIGKILL)
    return entry, running
