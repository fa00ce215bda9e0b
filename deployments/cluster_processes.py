"""The processes of the local cluster (deployments/cluster.py): start, wait for, stop, find; PostgreSQL.

Each service runs in its own session so that it outlives ``scripts/cluster.sh up``; ``stop_group``
ends one with its children. PostgreSQL comes from Debian's package and refuses to run as root: as
root it runs as the package's ``postgres`` user.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

# Every process the cluster starts carries this variable (flow runs inherit it from their worker):
# ``down`` finds what a worker left behind by it, and never touches anything else.
MEMBER_VAR = "REFUSALBENCH_CLUSTER_MEMBER"


class ClusterError(RuntimeError):
    """A service did not start; the message names it and ends with its log."""


# ---------------------------------------------------------------- processes


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


def spawn(argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> int:
    """Start ``argv`` in its own session (so it outlives this command), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process.pid


def stop_group(pid: int, grace_s: float = 15) -> None:
    """SIGTERM the process group ``pid`` leads, SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pid_alive(pid):
            return


def member_pids(state: Path) -> list[int]:
    """Processes (not this one or its ancestors) whose environment names this cluster as theirs."""
    ours, pid = set(), os.getpid()
    while pid > 1:  # never this command or whatever started it
        ours.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) not in ours and is_member(int(entry.name), state)
    ]


def is_member(pid: int, state: Path) -> bool:
    """Whether ``pid`` is a process of the cluster in ``state`` (not a later process that got its number)."""
    try:
        return f"{MEMBER_VAR}={state}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def process_start(pid: int) -> int | None:
    """When a process started (clock ticks since boot): with its pid, what names it uniquely."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def service_alive(service: dict[str, Any]) -> bool:
    """A recorded service still runs: its pid is alive and is still the process started then
    (not a later one that got the number; redis and PostgreSQL overwrite their environment)."""
    pid: int | None = service.get("pid")
    return pid is not None and pid_alive(pid) and service.get("start") in (None, process_start(pid))


def port_in_use(port: int) -> bool:
    """Whether something listens on (or holds) 127.0.0.1:``port``, so a service could not bind it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def log_tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_until(
    ready: Callable[[], bool], what: str, timeout_s: float, pid: int | None = None, log: Path | None = None
) -> None:
    """Poll ``ready()`` until true; fail early if ``pid`` exits, with the end of ``log``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except (httpx.HTTPError, OSError):
            pass
        if (pid is not None and not pid_alive(pid)) or time.monotonic() > deadline:
            why = "exited" if pid is not None and not pid_alive(pid) else f"not ready after {timeout_s:.0f} s"
            raise ClusterError(f"{what} {why}" + (f"; the end of {log}:\n{log_tail(log)}" if log else ""))
        time.sleep(0.2)


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=2).status_code == 200


# ---------------------------------------------------------------- PostgreSQL


def postgres_bin(name: str) -> str:
    """A PostgreSQL server program: Debian keeps them in /usr/lib/postgresql/<major>/bin, off PATH."""
    folders = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0
    )
    for folder in reversed(folders):
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql; .ci/run does)")
    return found


def as_postgres_user(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` user of Debian's package."""
    if os.geteuid() != 0:
        return argv
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterError(
            "running as root needs a 'postgres' user for the database (Debian's postgresql package creates it)"
        ) from None
    return ["runuser", "-u", "postgres", "--", *argv]


def give_to_postgres(*paths: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)


def start_postgres(state: Path, port: int, env: dict[str, str]) -> tuple[int, str]:
    """Initialise (first time) and start the database; returns its pid and Prefect's database URL."""
    folder, data = state / "postgres", state / "postgres" / "data"
    password_file = state / "secrets" / "postgres-password"
    log = state / "logs" / "postgres.log"
    folder.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    give_to_postgres(folder, log)
    if os.geteuid() == 0 and subprocess.run(as_postgres_user(["test", "-w", str(folder)]), check=False).returncode != 0:
        raise ClusterError(
            f"user postgres cannot write {folder}: use a state folder every user can reach "
            "(--state under /tmp or the project folder)"
        )
    first_start = not (data / "PG_VERSION").exists()
    if first_start:
        password_file.parent.mkdir(mode=0o700, exist_ok=True)
        password_file.write_text(secrets.token_urlsafe(24))
        password_file.chmod(0o600)
        initdb_password = folder / "initdb-password"
        initdb_password.write_text(password_file.read_text())
        initdb_password.chmod(0o600)
        give_to_postgres(initdb_password)
        try:
            run_checked(
                as_postgres_user(
                    [
                        postgres_bin("initdb"),
                        "-D",
                        str(data),
                        "-U",
                        "prefect",
                        "-E",
                        "UTF8",
                        "--no-locale",
                        "--no-sync",
                        "--auth=scram-sha-256",
                        f"--pwfile={initdb_password}",
                    ]
                ),
                "initdb",
                env,
            )
        finally:
            initdb_password.unlink()
        # Loopback TCP only: no socket folder to create under /var/run.
        with (data / "postgresql.conf").open("a") as conf:
            conf.write("\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n")
    run_checked(
        as_postgres_user(
            [postgres_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", f"-p {port}", "start"]
        ),
        "pg_ctl start",
        env,
    )
    password = password_file.read_text().strip()
    if first_start:
        run_checked(
            [postgres_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "prefect"],
            "createdb",
            {**env, "PGPASSWORD": password},
        )
    pid = int((data / "postmaster.pid").read_text().split()[0])
    return pid, f"postgresql+asyncpg://prefect:{password}@127.0.0.1:{port}/prefect"


def stop_postgres(state: Path, env: dict[str, str]) -> None:
    data = state / "postgres" / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            as_postgres_user([postgres_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            env=env,
            capture_output=True,
            check=False,
        )


def run_checked(argv: list[str], what: str, env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/", check=False)
    if done.returncode != 0:
        raise ClusterError(f"{what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
