"""Where a run's time goes besides its model calls: named clocks the pipeline fills as it runs.

A clock adds up the wall seconds, the CPU seconds of the thread that ran it, and how many
times it ran, across every thread of the process (``with timed("parquet_write"): ...``).
Clocks run under the scope of the code around them (``with clock_scope("score"): ...``,
a context variable, so each task thread keeps its own): the store's Parquet clocks in a
respond task count as ``respond/parquet_write``, in the score stage as ``score/parquet_write``.
A clock costs two ``perf_counter`` and two ``thread_time`` reads and a lock: cheap enough
for every file the store reads or writes, not for every model call.

The manifest records what the clocks counted during its run under ``timings``
(``ManifestRecorder``); ``benchmarks/paper_scale.py`` prints them per stage. Threads run
at once, so a clock's seconds are thread-seconds and may exceed the wall time around them.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_scope: contextvars.ContextVar[str] = contextvars.ContextVar("clock_scope", default="")
_lock = threading.Lock()
# name -> [wall seconds, CPU seconds of the timing thread, times run]
_totals: dict[str, list[float]] = {}


@contextmanager
def clock_scope(name: str) -> Iterator[None]:
    """Count the clocks run inside this block (this thread, and tasks it starts with a copy of
    its context) under ``name``: ``name/clock``."""
    token = _scope.set(name)
    try:
        yield
    finally:
        _scope.reset(token)


def add(name: str, wall: float, cpu: float = 0.0, times: int = 1) -> None:
    """Add to clock ``name`` (already scoped)."""
    with _lock:
        total = _totals.setdefault(name, [0.0, 0.0, 0])
        total[0] += wall
        total[1] += cpu
        total[2] += times


@contextmanager
def timed(clock: str) -> Iterator[None]:
    """Time the block on ``clock``, under the current scope."""
    scope = _scope.get()
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        add(f"{scope}/{clock}" if scope else clock, time.perf_counter() - wall, time.thread_time() - cpu)


def snapshot() -> dict[str, tuple[float, float, int]]:
    """Every clock now: {name: (wall s, CPU s, times)}."""
    with _lock:
        return {name: (w, c, int(n)) for name, (w, c, n) in _totals.items()}


def since(start: dict[str, tuple[float, float, int]]) -> dict[str, dict[str, float]]:
    """What the clocks counted after the snapshot ``start``: {name: {wall_s, cpu_s, n}}, names sorted."""
    counted: dict[str, dict[str, float]] = {}
    for name, (wall, cpu, times) in sorted(snapshot().items()):
        w0, c0, n0 = start.get(name, (0.0, 0.0, 0))
        if times != n0:
            counted[name] = {"wall_s": round(wall - w0, 4), "cpu_s": round(cpu - c0, 4), "n": times - n0}
    return counted
