"""``refusalbench deploy``: the refresh of the user's config registered for a work pool on a real
Prefect API (the session's test server), with its schedule; bad schedules and options exit 2
before the API is touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.deployments.test_deployments import prefect_env

ROOT = Path(__file__).resolve().parents[2]
POOL = "some-pool"


def write_config(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.jsonl").write_text(
        '{"id": "a", "question": "When did the bridge open?", "answers": ["1932"], '
        '"context": "The bridge opened in 1932."}\n'
    )
    config = folder / "weekly.yaml"
    config.write_text(
        "models:\n"
        "  rules: {model: rules/v1}\n"
        "  judge: {model: openai/judge, api_base: 'http://127.0.0.1:9/v1'}\n"
        "generation:\n  base_set: base.jsonl\n  generators: [rules]\n  verifiers: [judge]\n"
        "evaluation:\n  targets: [judge]\n  judge: judge\n"
    )
    return config


@pytest.fixture
def api(tmp_path, prefect_harness):
    """The session's Prefect test API, its URL and an environment for CLI processes; the pool
    and the deployments the test registers on it are deleted after it."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    yield url, prefect_env(tmp_path, url)
    in_pool = {"work_pools": {"name": {"any_": [POOL]}}}
    for deployment in httpx.post(f"{url}/deployments/filter", json=in_pool, timeout=30).json():
        httpx.delete(f"{url}/deployments/{deployment['id']}", timeout=30)
    httpx.delete(f"{url}/work_pools/{POOL}", timeout=30)


def deploy(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "deploy", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def read_deployment(url: str, name: str) -> dict:
    response = httpx.get(f"{url}/deployments/name/refusalbench-refresh/{name}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_deploy_registers_the_users_config_with_a_cron_or_an_interval(tmp_path, api):
    url, env = api
    config = write_config(tmp_path / "project")
    # Relative paths, as a user types them from the project folder: stored absolute for the workers.
    done = deploy(env, config.parent, "--config", "weekly.yaml", "--cron", "0 4 * * 1", "--pool", POOL)
    assert done.returncode == 0, done.stderr
    assert f"for work pool {POOL}" in done.stdout
    deployment = read_deployment(url, "refresh")
    assert deployment["parameters"]["config_path"] == str(config)
    assert deployment["parameters"]["out_root"] == str(config.parent / "runs" / "rounds")
    assert deployment["work_pool_name"] == POOL
    assert deployment["entrypoint"] == "refusalbench.flows.refresh.refresh_flow"
    assert deployment["job_variables"]["command"] == "python -m prefect.engine"
    (schedule,) = deployment["schedules"]
    assert schedule["schedule"]["cron"] == "0 4 * * 1"

    done = deploy(
        env,
        tmp_path,
        "--config",
        str(config),
        "--interval",
        "3600",
        "--pool",
        POOL,
        "--name",
        "hourly",
        "--out",
        "s3://b/r",
    )
    assert done.returncode == 0, done.stderr
    hourly = read_deployment(url, "hourly")
    assert hourly["parameters"]["config_path"] == str(config)
    assert hourly["parameters"]["out_root"] == "s3://b/r"
    (schedule,) = hourly["schedules"]
    assert schedule["schedule"]["interval"] == 3600


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "61 4 * * 1"], "--cron: '61 4 * * 1' is not a cron expression"),
        (["--cron", "0 4 * * 1", "--interval", "7d"], "--cron/--interval: give exactly one of --cron and --interval"),
        ([], "--cron/--interval: give exactly one"),
        (["--interval", "weekly"], "--interval: 'weekly' is not a positive interval"),
        (["--cron", "0 4 * * 1", "--serve", "--pool", POOL], "--serve/--pool: give one of"),
    ],
)
def test_bad_schedules_exit_2_before_the_api_is_touched(tmp_path, args, message):
    config = write_config(tmp_path)
    env = prefect_env(tmp_path, "http://127.0.0.1:9/api")  # nothing listens: any API call would fail otherwise
    done = deploy(env, tmp_path, "--config", str(config), *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_config_that_cannot_run_a_round_exits_2_first(tmp_path):
    config = write_config(tmp_path)
    config.write_text(config.read_text().split("evaluation:")[0])
    env = prefect_env(tmp_path, "http://127.0.0.1:9/api")
    done = deploy(env, tmp_path, "--config", str(config), "--cron", "bad cron", "--pool", POOL)
    assert done.returncode == 2
    assert done.stderr.strip() == f"{config}: evaluation: the config has no evaluation section"


def test_the_serve_script_builds_its_refresh_as_deploy_does():
    from refusalbench.deployments.deploy import refresh_deployment
    from refusalbench.deployments.serve import build_deployments

    served = build_deployments(cron="0 4 * * 1", config_path="c.yaml", out_root="o")[0]
    made = refresh_deployment(name="refresh", config_path="c.yaml", out_root="o", schedules=served.schedules)
    for field in ("name", "parameters", "concurrency_limit", "tags", "entrypoint", "description"):
        assert getattr(made, field) == getattr(served, field), field
