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
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from refusalbench.deployments.cluster_processes import (
    MEMBER_VAR,
    ClusterError,
    member_pids,
    pid_alive,
    port_in_use,
    service_alive,
    stop_group,
    stop_postgres,
)
from refusalbench.deployments.cluster_startup import (
    ROOT,
    flow_env,
    read_state,
    start_all,
    start_worker,
    took,
    wait_for_workers,
    write_state,
)

SETTINGS_FILE = ROOT / "deployments" / "cluster.env"
DEFAULT_STATE = ROOT / ".cluster"

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
