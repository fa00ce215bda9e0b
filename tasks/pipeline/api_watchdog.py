"""The watchdog of embedded mode's background Prefect server: stops it once idle, then exits.

``python -m refusalbench.tasks.pipeline.api_watchdog PREFECT_HOME`` is started, detached,
together with the server (``prefect_server._spawn_server``). A server that nobody stops
would run for good: one per working folder, each using a few percent of a core, piled up
before the server became one per user. The watchdog stops it once, for the record's idle
period (``REFUSALBENCH_API_IDLE_MINUTES`` when the server started), all of these held:

- no command marked a use (``server_state.mark_use``: as a command starts and ends using it);
- no command is using it now (each holds a shared lock on ``USERS_LOCK`` while it does);
- its API reports no flow run running, pending or cancelling, and none scheduled to start
  within the idle period (a run started some other way, e.g. ``prefect`` by hand, counts too).
  While some are, the use mark is renewed, so the idle period counts from the last one seen.
  An API that stops answering for a whole idle period counts as idle (it serves no one).

It does nothing while the server is pinned (``refusalbench api start``), and exits as soon as
the server is gone or another watchdog took over (a newer server's). It stops the server under
the start lock, with no command holding a use lock, so a command starting at that moment
finds no server and starts a new one rather than using one that is going away. It imports no
Prefect: it costs a sleeping Python process.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from refusalbench.tasks.pipeline.server_state import (
    START_LOCK,
    USERS_LOCK,
    last_use,
    mark_use,
    read_record,
    running_server,
    stop_server,
    write_record,
)

ACTIVE_STATES = ["RUNNING", "PENDING", "CANCELLING"]


def poll_interval(idle_s: float) -> float:
    """A tenth of the idle period, between 0.5 s and 30 s: a stop comes at most that late."""
    return min(30.0, max(0.5, idle_s / 10))


def _count(url: str, flow_runs: dict[str, Any]) -> int:
    request = urllib.request.Request(
        url + "/flow_runs/count",
        data=json.dumps({"flow_runs": flow_runs}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return int(json.loads(reply.read()))


def flow_runs_active(url: str, horizon_s: float) -> bool | None:
    """Whether the API at ``url`` has a flow run under way or scheduled within ``horizon_s`` of
    now (a run late by more than that has no one to start it); None if it did not answer."""
    now = datetime.now(UTC)
    scheduled = {
        "state": {"type": {"any_": ["SCHEDULED"]}},
        "expected_start_time": {
            "after_": (now - timedelta(seconds=horizon_s)).isoformat(),
            "before_": (now + timedelta(seconds=horizon_s)).isoformat(),
        },
    }
    try:
        return _count(url, {"state": {"type": {"any_": ACTIVE_STATES}}}) > 0 or _count(url, scheduled) > 0
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


def _nobody_using(users_lock: Any) -> bool:
    try:
        fcntl.flock(users_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _still_ours(home: Path, me: int) -> dict[str, Any] | None:
    record = read_record(home)
    return record if record.get("watchdog_pid") == me else None


def _stop_if_still_idle(home: Path, me: int, pid: int) -> bool:
    """Stop the server unless it was used meanwhile; True once it is gone (the watchdog's work is done)."""
    with open(home / START_LOCK, "a+") as start, open(home / USERS_LOCK, "a+") as users:
        fcntl.flock(start, fcntl.LOCK_EX)  # no command finds the server while it stops
        record = _still_ours(home, me)
        server = running_server(home)
        if record is None or server is None or server["pid"] != pid:
            return True
        idle_s = float(record.get("idle_minutes") or 0) * 60
        if record.get("pinned") or idle_s <= 0 or time.time() - last_use(home, record) < idle_s:
            return False
        if not _nobody_using(users):
            return False
        stop_server(pid, home)
        write_record(home, {**record, "stopped_at": time.time(), "stopped_by": f"idle for {idle_s / 60:g} min"})
        print(
            f"{datetime.now().isoformat(timespec='seconds')} stopped the server (pid {pid}): "
            f"idle for {idle_s / 60:g} min",
            flush=True,
        )
        return True


def watch(home: Path) -> int:
    me = os.getpid()
    with open(home / START_LOCK, "a+") as start:
        fcntl.flock(start, fcntl.LOCK_EX)  # held by the start until the server wrote its pid file
        record = _still_ours(home, me)
        server = running_server(home)
        if record is None or server is None:
            return 0  # the start failed or was undone, or a newer server has its own watchdog
        pid = server["pid"]
        write_record(home, {**record, "pid": pid})
    last_answer = time.monotonic()
    while True:
        record = _still_ours(home, me)
        if record is None:
            return 0
        idle_s = float(record.get("idle_minutes") or 0) * 60
        if idle_s <= 0:
            return 0
        time.sleep(poll_interval(idle_s))
        server = running_server(home)
        record = _still_ours(home, me)
        if server is None or server["pid"] != pid or record is None:
            return 0  # stopped (`api stop`, a restart under other settings) or taken over
        if record.get("pinned") or time.time() - last_use(home, record) < idle_s:
            continue
        with open(home / USERS_LOCK, "a+") as users:
            if not _nobody_using(users):
                continue
        active = flow_runs_active(server["url"], idle_s)
        if active is not None:
            last_answer = time.monotonic()
        if active:
            mark_use(home)  # the idle period counts from the last run seen under way
            continue
        if active is None and time.monotonic() - last_answer < idle_s:
            continue  # not answering (busy, or hung): ask again later
        if _stop_if_still_idle(home, me, pid):
            return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m refusalbench.tasks.pipeline.api_watchdog PREFECT_HOME", file=sys.stderr)
        return 2
    return watch(Path(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())
