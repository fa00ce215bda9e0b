"""Python's garbage collector tuned for the ``refusalbench`` process (not for in-process callers).

Importing Prefect, pandas, pyarrow and matplotlib leaves ~240,000 long-lived objects, and
CPython's collections keep rescanning them: measured on a cached 200-item evaluate (2
cores), collections during start-up took ~0.45 s (~0.12 s of them young-generation ones)
and the interpreter's final collection at exit ~0.5 s, for objects that die with the
process anyway.

- ``start_up``: the collector is off while the command imports its modules (little
  cyclic garbage is made then).
- ``no_flow_ahead``: on again at once for a command that starts no flow (a long
  ``data import``, a labelling session), as soon as the command line knows which it is.
- ``flow_starts``: what start-up built is frozen (``gc.freeze``: left out of every later
  collection) and the collector is on again, so a long run collects its own cycles.
- ``at_exit``: everything is frozen once more, which leaves the interpreter's final
  collection nothing to scan. Files, logs and Prefect's queues are flushed before then by
  their own close calls and exit handlers, which do not depend on the collector.

Only the command line calls ``start_up``; without it the others do nothing, so a test or
notebook that calls ``main`` in-process keeps its collector as it was.
"""

from __future__ import annotations

import gc

_tuned = False  # start_up has run: this process is the command line


def start_up() -> None:
    global _tuned
    _tuned = True
    gc.disable()


def no_flow_ahead() -> None:
    if _tuned:
        gc.enable()


def flow_starts() -> None:
    if _tuned and not gc.isenabled():
        gc.freeze()
        gc.enable()


def at_exit() -> None:
    if _tuned:
        gc.freeze()
