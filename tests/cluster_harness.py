"""The ``local_cluster`` fixture: ``scripts/cluster.sh up`` once per test session, ``down`` at its end.

The cluster is the compose topology from real processes (deployments/cluster.py): PostgreSQL,
``prefect server``, Redis, moto's S3 server, the scripted model server and two process workers,
with the work pool and deployments registered by deployments/register.sh. It gets its own state
folder and free loopback ports, and Prefect settings that make it quick (the scheduler looks
every few seconds, workers ask for runs every second). Tests that use it are marked ``cluster``
(and ``slow``); where PostgreSQL or redis-server is not installed they are skipped.

    pytestmark = [pytest.mark.cluster, pytest.mark.slow]

    def test_x(local_cluster):
        run = local_cluster.run_deployment("refusalbench-evaluate/evaluate", {"benchmark": ..., "out": ...})
        assert run["state_type"] == "COMPLETED"
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# Settings that make the test cluster quick; scripts/cluster.sh takes them from the environment.
FAST_SETTINGS = {
    "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
    "PREFECT_WORKER_QUERY_SECONDS": "1",
    "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "3",
    "PREFECT_LOGGING_LEVEL": "INFO",
}


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Worker:
    """One ``prefect worker`` of the cluster: its process and its own folder (home, tmp, cache)."""

    name: str
    pid: int
    folder: Path
    log: Path


@dataclass
class LocalCluster:
    """A running local cluster: where its services are, and helpers to run deployments on it."""

    state_dir: Path
    api_url: str  # http://127.0.0.1:PORT/api
    ui_url: str  # http://127.0.0.1:PORT
    s3_endpoint: str
    bucket: str
    redis_url: str
    models_url: str  # the scripted server's OpenAI base URL (.../v1)
    models_log: Path  # every request the scripted server answered, one JSON object a line
    workers: list[Worker]
    env: dict[str, str] = field(repr=False)  # the environment cluster.sh ran with (ports, settings)

    @classmethod
    def from_state(cls, state_dir: Path, env: dict[str, str] | None = None) -> LocalCluster:
        """The cluster a state folder describes (also one started by hand: ``LocalCluster.from_state(Path(".cluster"))``)."""
        from refusalbench.deployments.cluster import read_state

        record = read_state(state_dir)
        if record is None:
            raise RuntimeError(f"no cluster state in {state_dir}")
        services = record["services"]
        return cls(
            state_dir=Path(state_dir),
            api_url=record["api_url"],
            ui_url=record["ui_url"],
            s3_endpoint=record["s3_endpoint"],
            bucket=record["bucket"],
            redis_url=record["redis_url"],
            models_url=record["models_url"],
            models_log=Path(state_dir) / "logs" / "model-requests.jsonl",
            workers=[
                Worker(name, services[name]["pid"], Path(services[name]["folder"]), Path(services[name]["log"]))
                for name in record["workers"]
            ],
            env=dict(os.environ if env is None else env),
        )

    def restart_workers(self) -> None:
        """Start again every worker that is not running (``scripts/cluster.sh up`` on a running cluster)."""
        done = self.cli("up")
        assert done.returncode == 0, done.stdout + done.stderr
        self.workers = LocalCluster.from_state(self.state_dir, self.env).workers

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def flow_env(self) -> dict[str, str]:
        """Environment for a process of the test that talks to the cluster (Prefect CLI, S3, Redis)."""
        from refusalbench.deployments.cluster_startup import S3_KEYS

        return {
            **self.env,
            **S3_KEYS,
            "PREFECT_API_URL": self.api_url,
            "REFUSALBENCH_S3_ENDPOINT_URL": self.s3_endpoint,
            "REFUSALBENCH_REDIS_URL": self.redis_url,
            "REFUSALBENCH_MODELS_URL": self.models_url,
        }

    def s3_client(self):
        import boto3

        from refusalbench.deployments.cluster_startup import S3_KEYS, S3_REGION

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            region_name=S3_REGION,
            aws_access_key_id=S3_KEYS["REFUSALBENCH_S3_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_KEYS["REFUSALBENCH_S3_SECRET_ACCESS_KEY"],
        )

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call to the Prefect REST API (``path`` after ``/api``); the decoded JSON reply."""
        reply = httpx.request(method, f"{self.api_url}{path}", timeout=30, **kwargs)
        reply.raise_for_status()
        return reply.json() if reply.content else None

    def deployment(self, name: str) -> dict[str, Any]:
        """A deployment by ``flow-name/deployment-name``, e.g. ``refusalbench-refresh/refresh``."""
        return self.api("GET", f"/deployments/name/{name}")

    def trigger(self, name: str, parameters: dict[str, Any] | None = None, **fields: Any) -> str:
        """Create a flow run of a deployment (as ``prefect deployment run`` does); its id."""
        deployment = self.deployment(name)
        body = {"parameters": parameters or {}, **fields}
        return self.api("POST", f"/deployments/{deployment['id']}/create_flow_run", json=body)["id"]

    def flow_run(self, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"/flow_runs/{run_id}")

    def wait_for(self, run_id: str, timeout_s: float = 240) -> dict[str, Any]:
        """Wait until a flow run is in a terminal state; the flow run (fails with the worker logs if not)."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.flow_run(run_id)
            if run["state_type"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"flow run {run_id} still {run['state_type']} after {timeout_s:.0f} s\n" + self.logs_tail()
                )
            time.sleep(0.5)

    def run_deployment(
        self, name: str, parameters: dict[str, Any] | None = None, timeout_s: float = 240
    ) -> dict[str, Any]:
        """Trigger a deployment and wait for its flow run to end; the finished flow run."""
        return self.wait_for(self.trigger(name, parameters), timeout_s)

    def flow_runs(self, deployment: str | None = None, **flow_run_filter: Any) -> list[dict[str, Any]]:
        """Flow runs, oldest expected start first; of one deployment (by name) if given."""
        body: dict[str, Any] = {"sort": "EXPECTED_START_TIME_ASC", "flow_runs": dict(flow_run_filter)}
        if deployment is not None:
            body["deployments"] = {"id": {"any_": [self.deployment(deployment)["id"]]}}
        return self.api("POST", "/flow_runs/filter", json=body)

    def run_logs(self, run_id: str) -> list[str]:
        """The log messages of one flow run as the UI shows them."""
        logs = self.api(
            "POST", "/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC"}
        )
        return [entry["message"] for entry in logs]

    def kill_worker(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one worker's process group (a lost machine: ``sig`` SIGKILL), nothing else."""
        worker = next(w for w in self.workers if w.name == name)
        try:
            os.killpg(worker.pid, sig)
        except ProcessLookupError:
            pass

    def cli(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        """``scripts/cluster.sh ARGS --state <this cluster>`` with the cluster's settings."""
        return subprocess.run(
            ["bash", str(ROOT / "scripts" / "cluster.sh"), *args, "--state", str(self.state_dir)],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def logs_tail(self, chars: int = 2000) -> str:
        """The end of every service log: what a failing test prints."""
        parts = []
        for log in sorted((self.state_dir / "logs").glob("*.log")):
            text = log.read_text(errors="replace")[-chars:]
            parts.append(f"--- {log.name}\n{text}")
        return "\n".join(parts)


def cluster_env(state_dir: Path, workers: int) -> dict[str, str]:
    """The environment for cluster.sh: the test's own minus its Prefect settings, free ports, fast settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    ports = free_ports(5)
    env.update(FAST_SETTINGS)
    env.update(
        {
            "PREFECT_PORT": str(ports[0]),
            "MINIO_PORT": str(ports[1]),
            "CLUSTER_POSTGRES_PORT": str(ports[2]),
            "CLUSTER_REDIS_PORT": str(ports[3]),
            "CLUSTER_MODELS_PORT": str(ports[4]),
            "WORKER_REPLICAS": str(workers),
            "REFUSALBENCH_CLUSTER_STATE": str(state_dir),
            "PYTHON": sys.executable,
        }
    )
    return env


def missing_programs() -> list[str]:
    from refusalbench.deployments.cluster_processes import ClusterError, postgres_bin

    missing = [name for name in ("redis-server",) if shutil.which(name) is None]
    try:
        postgres_bin("initdb")
    except ClusterError:
        missing.append("postgresql")
    return missing


def start_local_cluster(workers: int = 2) -> LocalCluster:
    """``scripts/cluster.sh up`` in a new state folder; the running cluster (stop it with ``stop_local_cluster``)."""
    # Not under pytest's tmp folder: that one is private to its user, and PostgreSQL runs as another.
    state_dir = Path(tempfile.mkdtemp(prefix="refusalbench-cluster-"))
    env = cluster_env(state_dir, workers)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "cluster.sh"), "up", "--state", str(state_dir)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not (state_dir / "state.json").exists():
        stop_local_cluster_at(state_dir, env)
        raise RuntimeError(f"scripts/cluster.sh up failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return LocalCluster.from_state(state_dir, env)


def stop_local_cluster_at(state_dir: Path, env: dict[str, str]) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "cluster.sh"), "down", "--purge", "--state", str(state_dir)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    shutil.rmtree(state_dir, ignore_errors=True)


def stop_local_cluster(cluster: LocalCluster) -> None:
    stop_local_cluster_at(cluster.state_dir, cluster.env)


@pytest.fixture(scope="session")
def local_cluster():
    """The session's local cluster (two workers, scripted models); ``down`` when the session ends."""
    missing = missing_programs()
    if missing:
        pytest.skip(f"the local cluster needs {', '.join(missing)} (Debian packages; .ci/run installs them)")
    cluster = start_local_cluster()
    try:
        yield cluster
    finally:
        started = time.monotonic()
        stop_local_cluster(cluster)
        SESSION_TEARDOWN_S["local_cluster"] = time.monotonic() - started


# Seconds each session fixture took to stop (conftest prints them at the end: where the last test's teardown goes).
SESSION_TEARDOWN_S: dict[str, float] = {}
