"""scripts/cluster.sh: one set of settings with docker-compose.yml (fast), and the running local
cluster answers as compose's services do (marked cluster: the session's ``local_cluster``)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from refusalbench.deployments.cluster import (
    SETTINGS_FILE,
    cluster_settings,
    read_env_file,
)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def test_compose_defaults_are_the_cluster_settings():
    """Every ``${NAME:-default}`` of docker-compose.yml whose NAME is a cluster setting has its value."""
    settings = read_env_file(SETTINGS_FILE)
    defaults = re.findall(r"\$\{([A-Z0-9_]+):-([^}]*)\}", COMPOSE.read_text())
    shared = {(name, default) for name, default in defaults if name in settings}
    assert {name for name, _ in shared} >= {"REFUSALBENCH_BUCKET", "WORKER_REPLICAS", "WORKER_LIMIT", "PREFECT_PORT"}
    for name, default in shared:
        assert default == settings[name], (
            f"docker-compose.yml says ${{{name}:-{default}}}, cluster.env {settings[name]}"
        )
    # The services that run Prefect read the tuning from the same file.
    assert "deployments/cluster.env" in COMPOSE.read_text()


def test_the_environment_overrides_the_settings_file():
    settings = cluster_settings({"WORKER_LIMIT": "7"})
    assert settings["WORKER_LIMIT"] == "7"
    assert settings["REFUSALBENCH_POOL"] == read_env_file(SETTINGS_FILE)["REFUSALBENCH_POOL"] == "refusalbench"


def test_down_and_status_without_a_cluster(tmp_path):
    state = tmp_path / "none"
    for _ in range(2):  # down is idempotent
        done = subprocess.run(
            ["bash", "scripts/cluster.sh", "down", "--state", str(state)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "nothing runs" in done.stdout, done.stderr
    done = subprocess.run(
        ["bash", "scripts/cluster.sh", "status", "--state", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3 and "no cluster" in done.stdout


@pytest.mark.cluster
@pytest.mark.slow
def test_local_cluster_runs_the_compose_services(local_cluster):
    import redis

    done = local_cluster.cli("status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert set(record["services"]) == {"postgres", "prefect-server", "redis", "s3", "models", "worker-1", "worker-2"}
    assert all(service["running"] for service in record["services"].values())
    # The Prefect server keeps its data in PostgreSQL and serves the UI.
    assert httpx.get(f"{local_cluster.ui_url}/", timeout=10).status_code == 200
    postgres = record["services"]["postgres"]
    password = (local_cluster.state_dir / "secrets" / "postgres-password").read_text()
    from refusalbench.deployments.cluster_processes import postgres_bin

    rows = subprocess.run(
        [
            postgres_bin("psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(postgres["port"]),
            "-U",
            "prefect",
            "-tAc",
            "select name from deployment order by name",
        ],
        env={"PGPASSWORD": password},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert rows.stdout.split() == ["batch-watcher", "evaluate", "generate", "knowornot", "refresh"], rows.stderr
    workers = local_cluster.api("POST", "/work_pools/refusalbench/workers/filter", json={})
    assert {w["name"] for w in workers} == {"worker-1", "worker-2"}
    deployments = {d["name"] for d in local_cluster.api("POST", "/deployments/filter", json={})}
    assert deployments >= {"refresh", "generate", "evaluate", "knowornot"}
    local_cluster.s3_client().head_bucket(Bucket=local_cluster.bucket)
    assert redis.Redis.from_url(local_cluster.redis_url).ping()
    assert httpx.get(f"{local_cluster.models_url}/models", timeout=10).status_code == 200
    # Each worker has a folder of its own for its home, temp files and call cache.
    assert all(
        (w.folder / "tmp").is_dir() and w.folder.parent.parent == local_cluster.state_dir for w in local_cluster.workers
    )
