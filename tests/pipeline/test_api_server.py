"""Embedded mode's one background Prefect server per user (tasks/pipeline/prefect_server.py, server_state.py):
commands from any folder share it, ``api status`` only looks, and the server stops itself once
idle (tasks/pipeline/api_watchdog.py).

Real processes: the CLI and the server run as subprocesses under a user data folder of the
test's own (``REFUSALBENCH_HOME``; ``PREFECT_HOME`` unset, as for a user). One server serves
the whole module (its start takes 20-40 s on 2 cores): the tests run in order on it, the last
one waiting for it to stop itself, and the fixture stops whatever is left.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from refusalbench.tasks.pipeline.server_state import USERS_LOCK, read_record, running_server, stop_background_server

ROOT = Path(__file__).resolve().parents[2]
IDLE_MINUTES = 0.1  # 6 s: the watchdog looks every 0.6 s
STARTED = "Prefect server started in the background"

ENSURE = """
import json, os
from refusalbench.tasks.pipeline.runtime import configure_prefect_env
configure_prefect_env()
from refusalbench.tasks.pipeline import prefect_server
prefect_server.start_embedded_api()
prefect_server.wait_until_ready()
server = prefect_server.running_server()
print(json.dumps({"pid": server["pid"], "url": os.environ["PREFECT_API_URL"], "home": os.environ["PREFECT_HOME"]}))
prefect_server.release_embedded_api()
"""


@dataclass
class Shared:
    base: Path
    env: dict[str, str]
    home: Path
    first: dict[str, Any]  # what the command that started the server saw
    first_stderr: str
    users: IO[str]  # a use lock the fixture holds, as a long command would: no idle stop until released


def user_env(base: Path) -> dict[str, str]:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        REFUSALBENCH_HOME=str(base / "user-data"),
        REFUSALBENCH_API_IDLE_MINUTES=str(IDLE_MINUTES),
    )
    env.pop("PREFECT_HOME", None)
    env.pop("PREFECT_API_URL", None)
    return env


def folder(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir()
    return path


def cli(*argv: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat[stat.rfind(")") :]


def api(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read()
    return json.loads(text) if text else None


def wait_for(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return bool(condition())


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    base = tmp_path_factory.mktemp("api-server")
    env = user_env(base)
    home = base / "user-data" / "prefect"
    home.mkdir(parents=True)
    users = open(home / USERS_LOCK, "a+")
    fcntl.flock(users, fcntl.LOCK_SH)
    try:
        work = folder(base, "project-a")
        done = subprocess.run(
            [sys.executable, "-c", ENSURE], capture_output=True, text=True, env=env, cwd=work, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        yield Shared(base, env, home, json.loads(done.stdout.strip().splitlines()[-1]), done.stderr, users)
    finally:
        users.close()
        stop_background_server(home)


def test_commands_in_two_folders_share_one_server(shared: Shared) -> None:
    assert STARTED in shared.first_stderr and Path(shared.first["home"]) == shared.home
    elsewhere = folder(shared.base, "project-b")
    done = cli("api", "start", "--no-keep", env=shared.env, cwd=elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    assert STARTED not in done.stderr  # found, not started
    assert f"pid: {shared.first['pid']}" in done.stdout and shared.first["url"] in done.stdout, done.stdout
    assert f"PREFECT_HOME: {shared.home}" in done.stdout
    server = running_server(shared.home)
    assert server is not None and server["pid"] == shared.first["pid"] and server["url"] == shared.first["url"]
    # Its state lives in the user's data folder, none in the working folders.
    assert (shared.home / "prefect.db").exists()
    assert not any((shared.base / name / ".prefect").exists() for name in ("project-a", "project-b"))


def test_status_in_a_fresh_folder_only_looks(shared: Shared) -> None:
    fresh = folder(shared.base, "fresh")
    state_files = ("refusalbench-server.json", "refusalbench-server.used", "server.pid")

    def snapshot() -> dict[str, tuple[int, int]]:
        return {
            name: ((shared.home / name).stat().st_mtime_ns, (shared.home / name).stat().st_size) for name in state_files
        }

    before = snapshot()
    done = cli("api", "status", env=shared.env, cwd=fresh, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    server = running_server(shared.home)
    assert server is not None
    lines = done.stdout
    assert f"Prefect UI: {server['ui']}" in lines and f"API {server['url']}" in lines
    assert f"pid: {server['pid']}" in lines and f"PREFECT_HOME: {shared.home}" in lines
    assert "started: " in lines and "(up " in lines
    assert f"stops itself once idle for {IDLE_MINUTES:g} min" in lines, lines
    assert list(fresh.iterdir()) == []  # no .prefect, nothing
    assert snapshot() == before  # not even a use of the server


def test_status_with_no_server_says_so_and_creates_nothing(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    done = cli("api", "status", env=env, cwd=folder(tmp_path, "work"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("Prefect server: not running") and str(tmp_path / "user-data" / "prefect") in done.stdout
    )
    assert not (tmp_path / "user-data").exists() and list((tmp_path / "work").iterdir()) == []


def test_the_server_stops_itself_once_idle_unless_busy_or_pinned(shared: Shared) -> None:
    server = running_server(shared.home)
    assert server is not None
    pid, url = server["pid"], server["url"]
    watchdog = read_record(shared.home)["watchdog_pid"]
    assert alive(watchdog)
    flow = api(f"{url}/flows/", {"name": "idle-test"})
    run = api(f"{url}/flow_runs/", {"flow_id": flow["id"], "state": {"type": "RUNNING", "name": "Running"}})

    # No command uses it any more, but a flow run is under way: the watchdog sees it and keeps the server.
    released = time.time()
    shared.users.close()
    used = shared.home / "refusalbench-server.used"
    assert wait_for(lambda: used.stat().st_mtime > released, 60), "the watchdog never saw the run"
    assert running_server(shared.home)["pid"] == pid

    # Pinned by `api start`, it stays though the run is over and nothing uses it.
    pinned = cli("api", "start", env=shared.env, cwd=folder(shared.base, "project-c"))
    assert pinned.returncode == 0 and "kept up until `refusalbench api stop`" in pinned.stdout, pinned.stdout
    assert "pinned by `refusalbench api start`" in pinned.stdout
    api(f"{url}/flow_runs/{run['id']}/set_state", {"state": {"type": "COMPLETED", "name": "Completed"}, "force": True})
    time.sleep(IDLE_MINUTES * 60 * 2 + 2)
    assert running_server(shared.home)["pid"] == pid and alive(watchdog)

    # Let go again: idle, it stops, and so does its watchdog.
    unpinned = cli("api", "start", "--no-keep", env=shared.env, cwd=shared.base / "project-c")
    assert unpinned.returncode == 0 and "stops itself once idle" in unpinned.stdout, unpinned.stdout
    assert wait_for(lambda: running_server(shared.home) is None, IDLE_MINUTES * 60 + 60), "still running"
    assert wait_for(lambda: not alive(pid) and not alive(watchdog), 15)
    status = cli("api", "status", env=shared.env, cwd=shared.base / "project-c", timeout=60)
    assert status.returncode == 0 and status.stdout.startswith("Prefect server: not running"), status.stdout
    assert f"idle for {IDLE_MINUTES:g} min" in status.stdout
