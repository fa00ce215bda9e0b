"""Prefect's ephemeral API, started as the command starts instead of when the flow needs it.

In embedded mode (no ``PREFECT_API_URL``) Prefect starts its API server in a subprocess the
first time a client needs one. Measured on 2 cores for a cached 200-item evaluate (11.3 s in
all), that cost ~6 s: the CLI process first imported Prefect's whole server package (~3 s)
only to launch the subprocess, then waited, doing nothing, for it to boot (~3 s). Here the
same server (uvicorn serving ``prefect.server.api.server:create_app``, as Prefect launches
it) is started before the flow's modules are imported, so its boot overlaps the imports and
the input checks, and ``PREFECT_API_URL`` points Prefect at it. The flow waits for it to
answer (``wait_until_ready``) just before it starts.

The server belongs to the command: it stops when the process exits (Prefect's own exit
handlers, registered later, run first and flush logs and events to it), and dies with the
process if that is killed (Linux). A user who set ``PREFECT_API_URL`` (a server, Prefect
Cloud, a test harness) keeps it: nothing is started then.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, Callable, TypeVar

Launch = TypeVar("Launch", bound=Callable[..., Any])

_process: subprocess.Popen[bytes] | None = None
_url: str | None = None
_used = False  # a flow has been started against it (its logs and events are flushed at exit)
_log: IO[bytes] | None = None  # the server's stderr (for a start-up failure's message)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG; Linux only).
    Strictly, when the thread that started it ends: the CLI starts it from the main thread."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


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
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
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


def start_embedded_api() -> bool:
    """Launch the ephemeral API server unless an API is configured or one was started already;
    True if this call started it."""
    global _process, _log, _url, _used
    if _process is not None or _api_configured():
        return False
    port = _free_port()
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    _log = tempfile.TemporaryFile()
    _process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "error", "--lifespan", "on"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=_log,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    _url = os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    _used = False
    atexit.register(stop_embedded_api)
    return True


def embedded_api(launch: Launch) -> Launch:
    """Decorator for the CLI's ``run_*``: the server starts as the call starts. A call that fails
    before its flow used the server (bad input: exit 2) stops it again at once, so an in-process
    caller is left as it was; otherwise the server lives until the process exits."""
    @functools.wraps(launch)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = start_embedded_api()
        try:
            return launch(*args, **kwargs)
        except BaseException:
            if started and not _used:
                stop_embedded_api()
            raise

    return call  # type: ignore[return-value]


def wait_until_ready(timeout_s: float | None = None) -> None:
    """Return once the started server answers its health check (at once if none was started here)."""
    global _used
    if _process is None:
        return
    _used = True
    limit = timeout_s or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"))
    url = os.environ["PREFECT_API_URL"] + "/health"
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if _process.poll() is not None:
            raise RuntimeError(f"Prefect's API server exited with code {_process.returncode} while starting: {_stderr_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"Prefect's API server did not answer within {limit:.0f} s: {_stderr_tail()}")


def _stderr_tail() -> str:
    if _log is None:
        return ""
    _log.seek(0)
    return _log.read().decode("utf-8", "replace")[-1500:].strip() or "(nothing on stderr)"


def stop_embedded_api() -> None:
    """Stop the server this process started (idempotent)."""
    global _process, _url
    process, _process = _process, None
    if _url is not None and os.environ.get("PREFECT_API_URL") == _url:
        del os.environ["PREFECT_API_URL"]  # a later flow in this process must not look for the stopped server
    _url = None
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
