"""Python's garbage collector tuned for the ``refusalbench`` process (not for in-process callers).

Importing Prefect, pandas, pyarrow and matplotlib leaves ~240,000 long-lived objects, and
CPython's full collections rescan every one of them: measured on a cached 200-item
evaluate (2 cores), the full collections during start-up took ~0.35 s and the
interpreter's final collection at exit ~0.5 s, for objects that die with the process anyway.

- ``start_up``: no collection while the command imports its modules and checks its inputs
  (little cyclic garbage is made then).
- ``flow_starts``: what start-up built is frozen (``gc.freeze``: left out of every later
  collection) and collection resumes, so a long run still collects its own cycles.
- ``at_exit``: everything is frozen once more, which leaves the final collection nothing
  to scan. Files, logs and Prefect's queues are flushed before then by their own close
  calls and exit handlers, which do not depend on the collector.

Only the command line calls ``start_up``; without it the other two do nothing, so a
test or notebook that calls ``main`` in-process keeps its collector as it was.
"""

from __future__ import annotations

import gc

_tuned = False


def start_up() -> None:
    global _tuned
    _tuned = True
    gc.disable()


def flow_starts() -> None:
    if _tuned and not gc.isenabled():
        gc.freeze()
        gc.enable()


def at_exit() -> None:
    if _tuned:
        gc.freeze()
