"""Starting the local cluster's services (deployments/cluster.py ``up``), each recorded in state.json.

``start_all`` starts them in compose's order: Redis, the S3 endpoint (moto) with the bucket, the
model server, PostgreSQL and ``prefect server`` on it, then ``deployments/register.sh`` and the
process workers. Every service is written to ``state.json`` in the state folder as soon as it
runs, so that ``down`` stops it even when a later one fails to start. ``took`` records where the
start-up time goes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from refusalbench.deployments.cluster_processes import (
    ClusterError,
    http_ok,
    log_tail,
    process_start,
    service_alive,
    spawn,
    start_postgres,
    wait_until,
)

# The project root: register.sh and the model server run from it (their paths are relative to it).
ROOT = Path(__file__).resolve().parent.parent
# A worker may share nothing with the others but the services: its own home, temp and cache folders.
WORKER_FOLDERS = ("home", "tmp", "cache")
# moto's S3 takes any keys. In the artifact store's own variables (tasks/core/store.py), as compose
# sets them for MinIO: the AWS_* ones would reach the model providers (Bedrock) too.
S3_REGION = "us-east-1"
S3_KEYS = {
    "REFUSALBENCH_S3_ACCESS_KEY_ID": "testing",
    "REFUSALBENCH_S3_SECRET_ACCESS_KEY": "testing",
    "REFUSALBENCH_S3_REGION": S3_REGION,
}


# ---------------------------------------------------------------- state


def read_state(state: Path) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] | None = json.loads((state / "state.json").read_text())
        return record
    except (OSError, ValueError):
        return None


def write_state(state: Path, record: dict[str, Any]) -> None:
    tmp = state / "state.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(state / "state.json")


# ---------------------------------------------------------------- start


def flow_env(env: dict[str, str], record: dict[str, Any]) -> dict[str, str]:
    """What workers (hence flow runs) and the register script see: the API, S3, Redis, the models."""
    return {
        **env,
        **S3_KEYS,
        "PREFECT_API_URL": record["api_url"],
        "REFUSALBENCH_S3_ENDPOINT_URL": record["s3_endpoint"],
        "BUCKET": record["bucket"],
        "REFUSALBENCH_REDIS_URL": record["redis_url"],
        "REFUSALBENCH_MODELS_URL": record["models_url"],
    }


def models_command(kind: str, port: int, latency_s: float, settings: dict[str, str], state: Path) -> list[str]:
    if kind == "scripted":  # answers every model name with replies that fit its role (dry-run responder)
        return [
            sys.executable,
            "-m",
            "refusalbench.tasks.llm.scripted_server",
            "--port",
            str(port),
            "--latency",
            str(latency_s),
            "--log",
            str(state / "logs" / "model-requests.jsonl"),
        ]
    names = settings["REFUSALBENCH_SERVE_MODELS"].split()
    cli = [str(Path(sys.executable).parent / "refusalbench"), "models"]
    config = ["--config", "configs/models.yaml"]
    # As compose's models service: fetch the weights (once), then serve them.
    return [
        "sh",
        "-c",
        '"$@" pull '
        + " ".join(config + names)
        + ' && exec "$@" serve '
        + " ".join([*config, "--host", "127.0.0.1", "--port", str(port), *names]),
        "models",
        *cli,
    ]


def start_service(
    record: dict[str, Any],
    state: Path,
    name: str,
    argv: list[str],
    env: dict[str, str],
    cwd: Path | None = None,
    **extra: Any,
) -> dict[str, Any]:
    log = state / "logs" / f"{name}.log"
    pid = spawn(argv, env, log, cwd or state)
    service = {"pid": pid, "start": process_start(pid), "log": str(log), **extra}
    record["services"][name] = service
    write_state(state, record)
    return service


def create_bucket(endpoint: str, bucket: str) -> bool:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=S3_REGION,
        aws_access_key_id=S3_KEYS["REFUSALBENCH_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["REFUSALBENCH_S3_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=bucket)
    return True


def worker_heartbeats(api_url: str, pool: str) -> dict[str, float]:
    """Each worker of the pool by name: its last heartbeat as a Unix time."""
    import datetime as dt

    reply = httpx.post(f"{api_url}/work_pools/{pool}/workers/filter", json={}, timeout=5)
    if reply.status_code != 200:
        return {}
    return {
        w["name"]: dt.datetime.fromisoformat(w["last_heartbeat_time"]).timestamp()
        for w in reply.json()
        if w.get("last_heartbeat_time")
    }


def start_all(
    state: Path,
    record: dict[str, Any],
    env: dict[str, str],
    settings: dict[str, str],
    *,
    workers: int,
    models: str,
    models_latency_s: float,
) -> None:
    """The services in compose's order; those that need nothing of each other start together."""
    ports = record["ports"]
    (state / "redis").mkdir(exist_ok=True)
    redis = start_service(
        record,
        state,
        "redis",
        [
            shutil.which("redis-server") or "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(ports["redis"]),
            "--dir",
            str(state / "redis"),
            "--appendonly",
            "yes",
            "--save",
            "",
        ],
        env,
        port=ports["redis"],
        url=record["redis_url"],
    )
    s3 = start_service(
        record,
        state,
        "s3",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(ports["s3"])],
        env,
        port=ports["s3"],
        url=record["s3_endpoint"],
    )
    model_server = start_service(
        record,
        state,
        "models",
        models_command(models, ports["models"], models_latency_s, settings, state),
        env,
        cwd=ROOT,
        port=ports["models"],
        url=record["models_url"],
    )
    pg_pid, database_url = start_postgres(state, ports["postgres"], env)
    took(record, "postgres")
    record["services"]["postgres"] = {
        "pid": pg_pid,
        "start": process_start(pg_pid),
        "port": ports["postgres"],
        "log": str(state / "logs" / "postgres.log"),
    }
    server_home = state / "prefect-server"
    server_env = {
        **env,
        "PREFECT_HOME": str(server_home),
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_UI_API_URL": record["api_url"],
        # Its own copy of the UI files: site-packages may not be writable.
        "PREFECT_UI_STATIC_DIRECTORY": str(server_home / "ui"),
    }
    server = start_service(
        record,
        state,
        "prefect-server",
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(ports["api"])],
        server_env,
        port=ports["api"],
        url=record["ui_url"],
    )
    wait_until(lambda: redis_ping(record["redis_url"]), "redis-server", 30, redis["pid"], Path(redis["log"]))
    wait_until(lambda: http_ok(f"{record['s3_endpoint']}/"), "the S3 endpoint (moto)", 60, s3["pid"], Path(s3["log"]))
    create_bucket(record["s3_endpoint"], record["bucket"])
    wait_until(
        lambda: http_ok(f"{record['api_url']}/health"), "prefect server", 300, server["pid"], Path(server["log"])
    )
    took(record, "prefect server")
    fenv = flow_env(env, record)
    with (state / "logs" / "register.log").open("w") as register_log:
        register = subprocess.Popen(
            ["sh", "deployments/register.sh"], env=fenv, cwd=ROOT, stdout=register_log, stderr=subprocess.STDOUT
        )
    # The workers start once register.sh has made the pool (a worker would make one of its own,
    # and the script's create would then fail), while it registers the deployments.
    wait_until(
        lambda: httpx.get(f"{record['api_url']}/work_pools/{record['pool']}", timeout=5).status_code == 200,
        "the work pool (deployments/register.sh)",
        120,
        register.pid,
        state / "logs" / "register.log",
    )
    for index in range(1, workers + 1):
        record["workers"].append(f"worker-{index}")
        start_worker(record, state, fenv, f"worker-{index}", settings["WORKER_LIMIT"])
    if register.wait(timeout=600) != 0:
        raise ClusterError(
            "deployments/register.sh failed; the end of its log:\n" + log_tail(state / "logs" / "register.log")
        )
    ready_s = 1200 if models == "llama" else 60  # the first llama start downloads ~2 GB of weights
    wait_until(
        lambda: http_ok(f"{record['models_url']}/models"),
        f"the {models} model server",
        ready_s,
        model_server["pid"],
        Path(model_server["log"]),
    )
    took(record, "register.sh")
    wait_for_workers(record, state, since=0)
    took(record, "workers")


def took(record: dict[str, Any], phase: str) -> None:
    """Seconds from the start of ``up`` to the end of ``phase`` (state.json ``timings``: where start-up time goes)."""
    record.setdefault("timings", {})[phase] = round(time.monotonic() - record["_t0"], 1)


def start_worker(record: dict[str, Any], state: Path, fenv: dict[str, str], name: str, limit: str) -> None:
    """One process worker with a folder of its own (home, temp files, call cache), as on its own machine."""
    folder = state / "workers" / name
    for sub in WORKER_FOLDERS:
        (folder / sub).mkdir(parents=True, exist_ok=True)
    worker_env = {
        **fenv,
        "PREFECT_HOME": str(folder / "home"),
        "TMPDIR": str(folder / "tmp"),
        "REFUSALBENCH_CACHE_DIR": str(folder / "cache"),
    }
    start_service(
        record,
        state,
        name,
        [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            record["pool"],
            "--type",
            "process",
            "--limit",
            limit,
            "--name",
            name,
        ],
        worker_env,
        cwd=folder,
        folder=str(folder),
    )


def wait_for_workers(record: dict[str, Any], state: Path, since: float) -> None:
    """Until every worker has sent the server a heartbeat after ``since`` (a Unix time)."""

    def all_there() -> bool:
        seen = worker_heartbeats(record["api_url"], record["pool"])
        return all(seen.get(name, 0) >= since for name in record["workers"])

    wait_until(all_there, "the workers", 90, None, state / "logs" / "worker-1.log")
    for name in record["workers"]:
        if not service_alive(record["services"][name]):
            raise ClusterError(f"{name} exited; the end of its log:\n{log_tail(Path(record['services'][name]['log']))}")


def redis_ping(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
