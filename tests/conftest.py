"""Shared fixtures: a real fake OpenAI-compatible server, Prefect's test harness, a throwaway redis-server, paths."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster_harness import (
    SESSION_TEARDOWN_S,
    local_cluster,  # noqa: F401  (the session's local cluster, for tests marked cluster)
)

ROOT = Path(__file__).resolve().parent.parent

# Embedded Prefect for tests: project-local home (never the user's own server and data
# folder, which REFUSALBENCH_HOME would otherwise default to), no telemetry, patient start-up.
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect-test"))
os.environ.setdefault("REFUSALBENCH_HOME", str(ROOT / ".refusalbench-test"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# LiteLLM fetches its Anthropic beta-header config on the first anthropic/ call; use the bundled copy offline.
os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
os.environ.pop("PREFECT_API_URL", None)


def _background_server_pid() -> int | None:
    from refusalbench.tasks.pipeline.prefect_server import running_server

    server = running_server(Path(os.environ["PREFECT_HOME"]))
    return server["pid"] if server else None


_SERVER_BEFORE_SESSION = _background_server_pid()


def pytest_sessionfinish(session, exitstatus):
    """Commands a test runs in embedded mode start Prefect's background server in the suite's
    PREFECT_HOME, and later ones reuse it; the session stops it at its end (one that ran
    before the session began is left alone). Tests with a PREFECT_HOME of their own stop theirs."""
    from refusalbench.tasks.pipeline.prefect_server import stop_background_server

    pid = _background_server_pid()
    if pid is not None and pid != _SERVER_BEFORE_SESSION:
        stop_background_server(Path(os.environ["PREFECT_HOME"]))


def pytest_collection_modifyitems(items):
    """The tests on the session's local cluster run last, together (each file's order kept): the
    cluster then runs only while they do. Idle beside the rest of the suite it burned ~17% of a core
    (its server's loops, two workers asking for runs every second) for the ~20 minutes after the
    first cluster test."""
    on_cluster = [item for item in items if "local_cluster" in getattr(item, "fixturenames", ())]
    if on_cluster:
        moved = {id(item) for item in on_cluster}
        items[:] = [item for item in items if id(item) not in moved] + on_cluster


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test API (temporary SQLite database) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
        started = time.monotonic()
    SESSION_TEARDOWN_S["prefect_harness"] = time.monotonic() - started


def pytest_terminal_summary(terminalreporter):
    """How long each session fixture took to stop: the last test's teardown time, explained."""
    if SESSION_TEARDOWN_S:
        terminalreporter.write_line(
            "session teardown: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in SESSION_TEARDOWN_S.items())
        )


@pytest.fixture
def fake_llm():
    """A fake OpenAI-compatible server on loopback; tests set ``.responder`` and faults."""
    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An isolated call-cache folder per test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("REFUSALBENCH_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def redis_url(tmp_path):
    """A throwaway redis-server on a free loopback port (no persistence)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian package redis-server; .ci/run installs it)")
    import redis

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
