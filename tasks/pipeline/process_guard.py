"""A flow-run process that a worker (or a serve runner) started ends when that parent ends.

A worker killed alone leaves the flow-run process it started alive (Prefect's default starts it
in its own session; and a killed parent never signals its children): it keeps sending model
calls that nobody watches while the server marks the run Crashed and a retry starts the same
round elsewhere. :func:`follow_parent` ties the
process to its parent: on Linux the kernel sends SIGTERM when the parent dies
(``PR_SET_PDEATHSIG``); elsewhere a daemon thread watches ``getppid()``. Prefect's engine turns
that SIGTERM into a Crashed state for the run, so the crash is reported at once. (The kernel
watches the parent *thread* that started the process: Prefect's workers and runners start flow
runs from their event-loop thread, which lives as long as they do.)

It acts only in a process that Prefect started for a flow run (``PREFECT__FLOW_RUN_ID`` in the
environment); a flow run in the CLI's own process is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"
WATCH_INTERVAL_S = 1.0

_armed: str | None = None


def _set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when the parent dies (Linux); False where prctl is absent."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        armed: bool = libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
        return armed
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, signum: int, interval_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval_s)
    os.kill(os.getpid(), signum)


def follow_parent(
    *, signum: int = signal.SIGTERM, interval_s: float = WATCH_INTERVAL_S, force: bool = False
) -> str | None:
    """Make this process end with its parent; returns how ("prctl", "watchdog") or None.

    Runs once per process and only in a flow-run process Prefect started (``force`` skips
    that check, for tests). If the parent is already gone when this runs (the process was
    re-parented between its start and here), the signal is sent at once.
    """
    global _armed
    if _armed or not (force or os.environ.get(FLOW_RUN_ENV)):
        return _armed
    parent = os.getppid()
    if _set_parent_death_signal(signum):
        _armed = "prctl"
    else:
        threading.Thread(
            target=_watch_parent, args=(parent, signum, interval_s), daemon=True, name="follow-parent"
        ).start()
        _armed = "watchdog"
    if os.getppid() != parent:  # the parent died before the kernel was told
        os.kill(os.getpid(), signum)
    return _armed


__all__ = ["follow_parent"]
