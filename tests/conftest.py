"""Shared fixtures: a real fake OpenAI-compatible server, Prefect's test harness, paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Embedded Prefect for tests: project-local home, no telemetry, patient start-up.
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect-test"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# LiteLLM fetches its Anthropic beta-header config on the first anthropic/ call; use the bundled copy offline.
os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
os.environ.pop("PREFECT_API_URL", None)
# A command a test runs in embedded mode leaves no local API server behind once it has ended.
os.environ.setdefault("REFUSALBENCH_PREFECT_API_IDLE_S", "0")


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test API (temporary SQLite database) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


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
