"""``refusalbench deploy --serve`` end to end: the command serves the refresh of the user's config
from its own process on a real Prefect API, a run of that deployment is carried out by that
process (a round folder with its metrics), and an interrupt stops it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.deployments.test_deployments import prefect_env
from tests.pipeline.test_refresh_flow import write_config
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply

NAME = "served-weekly"


def _deployment(url: str) -> dict | None:
    response = httpx.get(f"{url}/deployments/name/refusalbench-refresh/{NAME}", timeout=10)
    return response.json() if response.status_code == 200 else None


def _wait(what: str, probe, timeout_s: float, process: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{what} (exit {process.poll()}):\n{log.read_text(errors='replace')[-4000:]}")


@pytest.mark.slow
def test_deploy_serve_runs_the_users_rounds_until_interrupted(tmp_path, fake_llm, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    fake_llm.responder = by_model(
        {
            "gen-a": generator_reply,
            "ver-a": lambda r: verifier_reply("PASS"),
            "t1": lambda r: "REFUSE_MISSING",
            "judge": judge_by_reference,
        }
    )
    config = write_config(tmp_path, fake_llm.url, ["t1"])
    url = PREFECT_API_URL.value()
    env = prefect_env(tmp_path, url)
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        served = subprocess.Popen(
            [sys.executable, "-m", "refusalbench.flows.cli", "deploy", "--config", config.name]
            + ["--interval", "7d", "--serve", "--name", NAME, "--out", "rounds"],
            env=env,
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deployment = _wait("the served deployment never appeared", lambda: _deployment(url), 120, served, log)
        assert deployment["parameters"]["config_path"] == str(config)
        assert deployment["parameters"]["out_root"] == str(tmp_path / "rounds")
        assert deployment["schedules"][0]["schedule"]["interval"] == 7 * 24 * 3600

        # A run asked for now (as "Quick run" in the UI does) is picked up by the serving process.
        # The serving process registers its deployments while it starts: ask by name until one takes the run.
        def created() -> dict | None:
            current = _deployment(url)
            if current is None:
                return None
            response = httpx.post(f"{url}/deployments/{current['id']}/create_flow_run", json={}, timeout=10)
            return response.json() if response.status_code == 201 else None

        run = _wait("no run could be created", created, 60, served, log)

        def finished() -> dict | None:
            state = httpx.get(f"{url}/flow_runs/{run['id']}", timeout=10).json()["state"]
            return state if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

        state = _wait("the run never finished", finished, 300, served, log)
        assert state["type"] == "COMPLETED", (state, log.read_text(errors="replace")[-4000:])
        (metrics,) = (tmp_path / "rounds").glob("*/metrics.json")
        assert set(json.loads(metrics.read_text())["models"]) == {"t1"}
        assert f"serving refusalbench-refresh/{NAME}" in log.read_text()

        os.killpg(served.pid, signal.SIGINT)  # Ctrl-C
        assert served.wait(timeout=60) in (0, 1, 130, -signal.SIGINT), log.read_text(errors="replace")[-3000:]
        assert "Traceback" not in log.read_text(errors="replace")
    finally:
        if served.poll() is None:
            os.killpg(served.pid, signal.SIGKILL)
            served.wait(timeout=10)
        if found := _deployment(url):
            httpx.delete(f"{url}/deployments/{found['id']}", timeout=10)
