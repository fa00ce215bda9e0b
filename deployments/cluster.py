"""A local cluster from real processes: the docker-compose topology on one machine.

``scripts/cluster.sh up|down|status`` runs this module. ``up`` starts PostgreSQL (Debian's
package: its own data folder and port), ``prefect server`` on it (UI on), Redis, an S3 endpoint
(moto's server) with the bucket, the model server (the scripted server by default, llama.cpp with
``--models llama``) and N ``prefect worker --type process`` workers, then registers the work pool
and the deployments with ``deployments/register.sh``, as compose's ``register`` service does.

Settings come from ``deployments/cluster.env`` (shared with docker-compose.yml); a variable set in
the environment overrides the file. Everything the cluster keeps (pids, ports, URLs, logs, the
database, Redis' append-only file) lives in one state folder, ``.cluster/`` in the project root
unless ``--state`` or ``REFUSALBENCH_CLUSTER_STATE`` says otherwise; ``state.json`` there says what
runs. ``down`` stops all of it (and any flow-run process a worker left behind) and can be run any
number of times; ``down --purge`` also deletes the state folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from refusalbench.deployments.cluster_processes import (
    MEMBER_VAR,
    ClusterError,
    http_ok,
    log_tail,
    member_pids,
    pid_alive,
    port_in_use,
    process_start,
    service_alive,
    spawn,
    start_postgres,
    stop_group,
    stop_postgres,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_FILE = ROOT / "deployments" / "cluster.env"
DEFAULT_STATE = ROOT / ".cluster"
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


# Each service's loopback port and the setting that gives it.
PORT_SETTINGS = {
    "api": "PREFECT_PORT",
    "s3": "MINIO_PORT",
    "postgres": "CLUSTER_POSTGRES_PORT",
    "redis": "CLUSTER_REDIS_PORT",
    "models": "CLUSTER_MODELS_PORT",
}


# ---------------------------------------------------------------- settings


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an env file (compose's format: ``#`` comments, optional quotes)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def cluster_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """deployments/cluster.env, each value overridden by the same variable in the environment."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    return {key: env.get(key, value) for key, value in read_env_file(SETTINGS_FILE).items()}


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


# ---------------------------------------------------------------- up


def base_env(state: Path, settings: dict[str, str]) -> dict[str, str]:
    """The caller's environment with the cluster's settings; no Prefect location of the caller's own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILE", "PREFECT_API_DATABASE_CONNECTION_URL")
    }
    env.update(settings)
    env.update(
        {
            MEMBER_VAR: str(state),
            "PYTHONUNBUFFERED": "1",
            "REFUSALBENCH_PROJECT_DIR": str(ROOT),
            # `prefect`, `refusalbench` of this interpreter's environment for scripts (register.sh)
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)]),
        }
    )
    return env


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


def up(
    state: Path,
    *,
    workers: int,
    models: str = "scripted",
    models_latency_s: float = 0.0,
    settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start the cluster (or return the record of the one that runs) and register the deployments."""
    settings = cluster_settings() if settings is None else settings
    state = state.resolve()
    running = read_state(state)
    if running and running.get("ready"):
        dead = [name for name, s in running["services"].items() if not service_alive(s)]
        if not dead:
            return running
        if set(dead) <= set(running["workers"]):  # only workers died: start them again, keep the rest
            fenv, since = flow_env(base_env(state, settings), running), time.time() - 1
            running["_t0"], running["timings"] = time.monotonic(), {}
            for name in dead:
                start_worker(running, state, fenv, name, settings["WORKER_LIMIT"])
            wait_for_workers(running, state, since)
            took(running, f"restarted {', '.join(dead)}")
            del running["_t0"]
            write_state(state, running)
            return running
    down(state)  # what a cluster that died there left behind
    (state / "logs").mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # PostgreSQL's user must reach its folder inside
    ports = {name: int(settings[variable]) for name, variable in PORT_SETTINGS.items()}
    record: dict[str, Any] = {
        "state_dir": str(state),
        "ready": False,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pool": settings["REFUSALBENCH_POOL"],
        "bucket": settings["REFUSALBENCH_BUCKET"],
        "models": models,
        "api_url": f"http://127.0.0.1:{ports['api']}/api",
        "ui_url": f"http://127.0.0.1:{ports['api']}",
        "s3_endpoint": f"http://127.0.0.1:{ports['s3']}",
        "redis_url": f"redis://127.0.0.1:{ports['redis']}/0",
        "models_url": f"http://127.0.0.1:{ports['models']}/v1",
        "ports": ports,
        "services": {},
        "workers": [],
    }
    # A port taken by something else would answer in our service's place (another Prefect server on 4200).
    taken = [f"{port} ({PORT_SETTINGS[name]})" for name, port in ports.items() if port_in_use(port)]
    if taken:
        raise ClusterError(
            f"port {', '.join(taken)} already in use on 127.0.0.1: set the variable to a free port "
            "(e.g. PREFECT_PORT=4300 scripts/cluster.sh up) or stop what uses it"
        )
    env = base_env(state, settings)
    record["_t0"] = time.monotonic()
    try:
        start_all(state, record, env, settings, workers=workers, models=models, models_latency_s=models_latency_s)
    except BaseException:
        write_state(state, record)
        down(state)
        raise
    record["ready"] = True
    del record["_t0"]
    write_state(state, record)
    return record


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


# ---------------------------------------------------------------- down, status

# Reverse start order: workers first (no new runs), the database last.
STOP_ORDER = ("worker", "prefect-server", "models", "s3", "redis")


def down(state: Path) -> list[str]:
    """Stop everything the cluster in ``state`` started; a no-op when nothing runs. Returns what it stopped."""
    state = state.resolve()
    record = read_state(state) or {"services": {}}
    env = base_env(state, {})
    stopped = []
    services = record["services"]
    for prefix in STOP_ORDER:
        for name, service in services.items():
            if name.startswith(prefix) and service_alive(service):
                stop_group(service["pid"])
                stopped.append(name)
    # Flow-run processes a worker started in their own session, and anything else of ours still there.
    for pid in member_pids(state):
        if not pid_alive(pid) or _is_postgres(pid):  # PostgreSQL's own processes: pg_ctl stops them below
            continue
        try:
            if os.getpgid(pid) == pid:
                stop_group(pid)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        stopped.append(f"pid {pid}")
    if (state / "postgres" / "data" / "postmaster.pid").exists():
        stop_postgres(state, env)
        stopped.append("postgres")
    if record.get("services"):
        record["ready"] = False
        write_state(state, record)
    return stopped


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("postgres", "postmaster")
    except OSError:
        return True


def status(state: Path) -> dict[str, Any] | None:
    """The record with each service's ``running`` flag; None where no cluster was ever started."""
    state = state.resolve()
    record = read_state(state)
    if record is None:
        return None
    for service in record["services"].values():
        service["running"] = service_alive(service)
    record["running"] = bool(record["services"]) and all(s["running"] for s in record["services"].values())
    return record


def print_status(record: dict[str, Any] | None, state: Path) -> None:
    if record is None:
        print(f"no cluster in {state}")
        return
    for name, service in record["services"].items():
        where = service.get("url") or (f"port {service['port']}" if service.get("port") else "")
        print(f"  {name:<15} {'running' if service['running'] else 'stopped':<8} pid {service['pid']:<8} {where}")
    if record["running"] and record.get("ready"):
        print(
            f"Prefect UI: {record['ui_url']}\n"
            f"  export PREFECT_API_URL={record['api_url']}\n"
            f"  S3: {record['s3_endpoint']} bucket {record['bucket']}; Redis: {record['redis_url']}; "
            f"models: {record['models_url']} ({record['models']})\n  state and logs: {record['state_dir']}"
        )
    else:
        print(f"the cluster in {state} is not (fully) running: scripts/cluster.sh up starts it")


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    settings = cluster_settings()
    parser = argparse.ArgumentParser(prog="scripts/cluster.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--state",
        type=Path,
        default=Path(os.environ.get("REFUSALBENCH_CLUSTER_STATE", DEFAULT_STATE)),
        help="the cluster's state folder (default .cluster/ in the project)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(settings["WORKER_REPLICAS"]),
        help="process workers to start (default WORKER_REPLICAS of deployments/cluster.env)",
    )
    parser.add_argument(
        "--models",
        choices=["scripted", "llama"],
        default="scripted",
        help="the models service: the scripted server (default) or llama.cpp with the local models",
    )
    parser.add_argument("--models-latency", type=float, default=0.0, help="scripted server: seconds per reply")
    parser.add_argument("--purge", action="store_true", help="down: also delete the state folder")
    parser.add_argument("--json", action="store_true", help="status: print the state record as JSON")
    args = parser.parse_args(argv)
    state = args.state.resolve()
    if args.command == "up":
        started = time.monotonic()
        try:
            record = up(
                state, workers=args.workers, models=args.models, models_latency_s=args.models_latency, settings=settings
            )
        except ClusterError as exc:
            print(f"cluster did not start: {exc}", file=sys.stderr)
            return 1
        timings = ", ".join(f"{phase} {seconds:g} s" for phase, seconds in record.get("timings", {}).items())
        print(f"cluster up in {time.monotonic() - started:.0f} s ({timings})")
        print_status(status(state), state)
        return 0
    if args.command == "down":
        stopped = down(state)
        print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing runs in {state}")
        if args.purge and state.exists():
            shutil.rmtree(state)
            print(f"deleted {state}")
        return 0
    current = status(state)
    if args.json:
        print(json.dumps(current, indent=2))
    else:
        print_status(current, state)
    return 0 if current and current["running"] else 3


if __name__ == "__main__":
    sys.exit(main())
