"""Python's garbage collector tuned for the ``refusalbench`` process (not for in-process callers).

Importing Prefect, pandas, pyarrow and matplotlib leaves ~240,000 long-lived objects, and
CPython's full collections rescan every one of them: measured on a cached 200-item
evaluate (2 cores), the full collections during start-up took ~0.35 s and the
interpreter's final collection at exit ~0.5 s, for objects that die with the process anyway.

- ``start_up``: full collections are put off while the command imports its modules and
  checks its inputs; young objects are still collected as usual, so a command that runs
  no flow (a long ``data import``, a labelling session) keeps its memory in check.
- ``flow_starts``: what start-up built is frozen (``gc.freeze``: left out of every later
  collection) and the usual thresholds return, so a long run collects its own cycles.
- ``at_exit``: everything is frozen once more, which leaves the interpreter's final
  collection nothing to scan. Files, logs and Prefect's queues are flushed before then by
  their own close calls and exit handlers, which do not depend on the collector.

Only the command line calls ``start_up``; without it the other two do nothing, so a
test or notebook that calls ``main`` in-process keeps its collector as it was.
"""

from __future__ import annotations

import gc

# A full collection once the middle generation has been collected this many times (the
# default is 10): at start-up, practically never.
_START_UP_FULL_EVERY = 1000

_usual: tuple[int, int, int] | None = None  # the thresholds start_up replaced


def start_up() -> None:
    global _usual
    _usual = gc.get_threshold()
    gc.set_threshold(_usual[0], _usual[1], _START_UP_FULL_EVERY)


def flow_starts() -> None:
    if _usual is not None and gc.get_threshold() != _usual:
        gc.freeze()
        gc.set_threshold(*_usual)


def at_exit() -> None:
    if _usual is not None:
        gc.freeze()
