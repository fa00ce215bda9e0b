"""Prefect's API in embedded mode: Prefect's own background server, with its UI, one per user.

With no ``PREFECT_API_URL``, Prefect would boot a temporary API server without a UI for
every process that runs a flow and stop it at exit (~3 s on 2 cores each time), leaving
nothing to look at. Instead the first command that needs an API runs ``prefect server start
--background`` under the user's embedded ``PREFECT_HOME`` (``server_state.embedded_home``: the
user's data folder, ``REFUSALBENCH_HOME/prefect`` if that is set; a ``PREFECT_HOME`` set by hand
wins), so commands from any folder share one server and no folder gets a ``.prefect`` of its
own. Prefect records the server's pid in ``PREFECT_HOME/server.pid``; this module records the
rest beside it (``server_state.RECORD``: port, URL, started_at, pid, pinned, idle period,
watchdog), and every later command finds it there and uses it at once. It serves the Prefect
UI at http://127.0.0.1:PORT.

- The server stops itself once idle: a small watchdog process started with it
  (``tasks/pipeline/api_watchdog.py``) stops it after ``REFUSALBENCH_API_IDLE_MINUTES``
  (default 60; 0: never) in which no command used it (each marks its use as it starts and
  ends, and holds a shared lock while it runs) and no flow run on it was running, pending or
  scheduled to start. ``refusalbench api start`` pins it (no idle stop) and ``refusalbench
  api stop`` stops it and its watchdog.
- The server is started as the command starts, so it boots while the flow's modules import
  and the inputs are checked; the flow waits for it (``wait_until_ready``) just before it
  starts. Prefect's own ``start`` process holds this module's start lock until it has
  written the pid file, so commands started together start one server.
- Port: ``PREFECT_SERVER_API_PORT`` if set, else Prefect's 4200 if free, else a free one.
- The settings a server was started under (database URL and other server settings,
  ``PREFECT_PROFILE``, Prefect version, Python) are recorded beside the pid file. A server
  started under others is not reused: it is stopped and a new one started, unless another
  command is using it (a shared lock each command holds while it lives), which is an error.
  A server started by hand with ``prefect server start --background`` is used if its Prefect
  version is this one (and is never stopped for being idle).
- A command that fails its input checks (exit 2) before any flow used a server it started
  stops that server again (unless another command has begun to use it): a typo leaves
  nothing behind.
- A user who set ``PREFECT_API_URL`` (a server, Prefect Cloud, a test harness) keeps it:
  nothing is started then.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any, TypeVar

from refusalbench.tasks.core.clocks import timed
from refusalbench.tasks.pipeline.preload import preload

# The server's files and record, and stopping it, live in server_state; callers also import
# running_server and stop_background_server from here.
from refusalbench.tasks.pipeline.server_state import (  # noqa: F401
    DEFAULT_PORT,
    LOG,
    PID_FILE,
    START_LOCK,
    USERS_LOCK,
    WATCHDOG_LOG,
    WATCHDOG_MODULE,
    idle_minutes,
    mark_use,
    prefect_home,
    running_server,
    server_urls,
    stop_background_server,
    stop_server,
    watchdog_pid,
    write_record,
)

Launch = TypeVar("Launch", bound=Callable[..., Any])

# Settings that shape what the server is (which database, which Prefect): a server started
# under others is not reused.
_SERVER_SETTINGS = ("PREFECT_SERVER_", "PREFECT_API_DATABASE_", "PREFECT_PROFILE")

_users: IO[str] | None = None  # this process's shared lock on USERS_LOCK: held while it uses the server
_entry: dict[str, Any] | None = None  # the server this process uses
_spawned: subprocess.Popen[bytes] | None = None  # this process's `prefect server start`, if it started one
_used = False  # a flow has been started against it


def prefect_version() -> str:
    return metadata.version("prefect")


def server_fingerprint() -> str:
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith(_SERVER_SETTINGS))
    return hashlib.sha256(repr((sys.executable, prefect_version(), settings)).encode()).hexdigest()[:16]


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
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()  # where Prefect itself looks
    files = [
        Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser(),
        cwd / "prefect.toml",
        cwd / ".env",
        cwd / "pyproject.toml",
    ]
    for file in files:
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "PREFECT_API_URL" in text or _API_TABLE.search(text):
            return True
    return False


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as `prefect server start` checks it
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _choose_port(host: str) -> int:
    configured = os.environ.get("PREFECT_SERVER_API_PORT")
    if configured:
        return int(configured)
    if _port_free(host, DEFAULT_PORT):
        return DEFAULT_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ui_static_directory(home: Path) -> str | None:
    """Where the server may copy Prefect's UI files: Prefect's own folder in site-packages
    unless this user cannot write there (a shared or system install), then ``PREFECT_HOME/ui``.
    Prefect copies them on a server's first start and serves no UI where the copy fails."""
    if os.environ.get("PREFECT_UI_STATIC_DIRECTORY") or os.environ.get("PREFECT_SERVER_UI_STATIC_DIRECTORY"):
        return None
    spec = importlib.util.find_spec("prefect")
    server_folder = Path(spec.origin).parent / "server" if spec and spec.origin else None
    if server_folder is None or os.access(server_folder, os.W_OK):
        return None
    return str(home / "ui")


def _spawn_server(home: Path, fingerprint: str, start_lock: IO[str]) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Run ``prefect server start --background`` without waiting for it. It inherits the start
    lock and holds it until it has written the pid file and exited."""
    host = os.environ.get("PREFECT_SERVER_API_HOST") or "127.0.0.1"
    port = _choose_port(host)
    # The UI asks its API where its settings say: without these, Prefect's default port (4200) even
    # when this server listens elsewhere, so the UI would show another server's runs, or none.
    urls = server_urls(host, port)
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_API_PORT=str(port), PREFECT_UI_API_URL=urls["url"])
    static = _ui_static_directory(home)
    if static:
        env["PREFECT_UI_STATIC_DIRECTORY"] = static
    idle = idle_minutes()
    entry = {
        "port": port,
        "host": host,
        **urls,
        "fingerprint": fingerprint,
        "prefect": prefect_version(),
        "log": str(home / LOG),
        "home": str(home),
        "started_at": time.time(),
        "pinned": False,
        "idle_minutes": idle,
        "watchdog_pid": _spawn_watchdog(home) if idle > 0 else None,
    }
    write_record(home, entry)
    with open(home / LOG, "wb") as output:
        # Its own session: a Ctrl-C in the terminal stops the command, not the server.
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "--no-prompt", "server", "start", "--background", "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(start_lock.fileno(),),
        )
    return process, entry


def _spawn_watchdog(home: Path) -> int:
    """Start the process that stops ``home``'s server once idle (``api_watchdog``); its pid. It
    waits for the start lock, so it looks at the server only once the start is over."""
    with open(home / WATCHDOG_LOG, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", WATCHDOG_MODULE, str(home)],
            env=dict(os.environ, PREFECT_HOME=str(home)),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process.pid


def _in_use_by_others(users: IO[str]) -> bool:
    """Whether another command holds its shared lock (this process's own becomes exclusive
    only if no one else holds one; it is made shared again at once)."""
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(users, fcntl.LOCK_SH)
    return False


def start_embedded_api() -> bool:
    """Use this PREFECT_HOME's background server, starting one if there is none (or none that
    fits); True if this call pointed PREFECT_API_URL at it, False if an API was configured."""
    global _users, _entry, _spawned, _used
    if _entry is not None or _api_configured():
        return False
    idle_minutes()  # a bad setting fails here, before anything is started
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    fingerprint = server_fingerprint()
    users = open(home / USERS_LOCK, "a+")
    with open(home / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)  # one command at a time finds or starts the server
        fcntl.flock(users, fcntl.LOCK_SH)  # from here on no other command stops it under this one
        entry, spawned = running_server(home), None
        if entry is not None and entry["fingerprint"] not in (None, fingerprint):
            if _in_use_by_others(users):
                users.close()
                raise RuntimeError(
                    f"Prefect's background server for {home} (pid {entry['pid']}) was started under other server "
                    "settings and another command is using it: wait for that command, or give this one its own "
                    "PREFECT_HOME"
                )
            stop_server(entry["pid"], home)
        if entry is None or entry["fingerprint"] not in (None, fingerprint):
            (home / PID_FILE).unlink(missing_ok=True)  # a stale one: `prefect server start` refuses to start beside it
            spawned, entry = _spawn_server(home, fingerprint, start)
        else:
            _replace_lost_watchdog(home, entry)
        mark_use(home)
    _users, _entry, _spawned, _used = users, entry, spawned, False
    os.environ["PREFECT_API_URL"] = entry["url"]
    return True


def _replace_lost_watchdog(home: Path, entry: dict[str, Any]) -> None:
    """A server this module started whose watchdog is gone (killed) gets a new one, so it still
    stops once idle. Called under the start lock."""
    record = entry.get("record") or {}
    if entry.get("fingerprint") is None or not float(record.get("idle_minutes") or 0) > 0:
        return  # started by hand, or never to stop by itself
    if watchdog_pid(record) is None:
        write_record(home, {**record, "watchdog_pid": _spawn_watchdog(home)})


def embedded_api(launch: Launch) -> Launch:
    """Decorator for the CLI's ``run_*``: the server is found or started as the call starts and
    this process stops using it as the call ends. A call that fails before its flow used a
    server it started (bad input: exit 2) stops that server, unless another command uses it."""

    @functools.wraps(launch)
    def call(*args: Any, **kwargs: Any) -> Any:
        with timed("api_start"):  # find the server, or spawn one (not waiting for it to answer)
            started = start_embedded_api()
        unused = True
        try:
            with local_server_settings() if _entry is not None else contextlib.nullcontext():
                result = launch(*args, **kwargs)
            unused = False
            return result
        finally:
            if started:
                release_embedded_api(stop_unused=unused and not _used)

    return call  # type: ignore[return-value]


@contextlib.contextmanager
def local_server_settings() -> Iterator[None]:
    """Prefect settings for flows run against the embedded server: no flow-run heartbeats.
    They serve an automation that marks runs whose heartbeats stop as crashed (server mode
    deploys one: ``deployments/automations.py``); the embedded server has none, yet every
    flow run's end waits up to a second for its heartbeat thread."""
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield


def wait_until_ready(timeout_s: float | None = None) -> None:
    """Return once the server this process uses answers its health check (at once if it uses none)."""
    if _entry is None:
        return
    with timed("api_wait"):  # a server this command spawned boots meanwhile (the flow's modules load)
        _wait_until_ready(timeout_s)


def _wait_until_ready(timeout_s: float | None) -> None:
    global _used
    assert _entry is not None, "wait_until_ready returns at once without a server"
    first_wait = not _used
    _used = True
    limit = timeout_s or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"))
    deadline = time.monotonic() + limit
    waiting = False
    while not _answers(_entry["url"] + "/health"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prefect's background server did not answer within {limit:.0f} s: {_log_tail(_entry)}")
        if not waiting:  # the server is still booting: load what the flow needs later meanwhile
            waiting = True
            preload()
        _check_still_starting(_entry)
        time.sleep(0.05)
    # A server started by hand is checked for its version; one this command spawned is asked it too: Prefect
    # sets that route up at its first request (~0.5 s, seconds on a busy machine), and every flow run's client
    # asks it first, so the spawning command takes that wait here and later commands find it answered.
    if first_wait and (_entry.get("fingerprint") is None or _spawned is not None):
        _check_version(_entry)
    if first_wait and _spawned is not None:
        print(
            f"Prefect server started in the background for {prefect_home()}: UI at {_entry['ui']} "
            "(stop it with `refusalbench api stop`)",
            file=sys.stderr,
            flush=True,
        )


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            ok: bool = reply.status == 200
            return ok
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _check_still_starting(entry: dict[str, Any]) -> None:
    if _spawned is not None:
        code = _spawned.poll()
        if code is None:
            return  # `prefect server start` itself is still at work
        if code != 0:
            raise RuntimeError(f"`prefect server start --background` failed (exit {code}): {_log_tail(entry)}")
    server = running_server()
    if server is None or server["port"] != entry["port"]:
        raise RuntimeError(
            f"Prefect's background server exited while starting; to see why, run `prefect server "
            f"start` in the foreground with PREFECT_HOME={prefect_home()}"
        )


def _check_version(entry: dict[str, Any]) -> None:
    """The server's Prefect must be this one (a server started by hand may run another)."""
    try:
        with urllib.request.urlopen(entry["url"] + "/admin/version", timeout=5) as reply:
            version = json.loads(reply.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return
    if version != prefect_version():
        raise RuntimeError(
            f"the background Prefect server for {prefect_home()} (pid {entry.get('pid')}) runs Prefect "
            f"{version}, this command Prefect {prefect_version()}: stop it with `refusalbench api stop`"
        )


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
    mark_use(Path(entry["home"]) if entry and entry.get("home") else None)
    with users:
        if stop_unused and spawned is not None:
            _stop_if_unused(spawned, users)


def _stop_if_unused(spawned: subprocess.Popen[bytes], users: IO[str]) -> None:
    home = prefect_home()
    if spawned.poll() is None:
        # `prefect server start` still holds the start lock, so no other command has found the
        # server yet: its process group (it and the server it started) goes.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(spawned.pid, signal.SIGKILL)
        spawned.wait()
        (home / PID_FILE).unlink(missing_ok=True)
        return
    with open(home / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)  # no command is finding it meanwhile
        if _in_use_by_others(users):
            return
        server = running_server(home)
        if server is not None:
            stop_server(server["pid"], home)
