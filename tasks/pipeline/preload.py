"""Modules a later stage needs, loaded in a background thread while the command waits.

A session's first command waits for Prefect's background server to boot (``prefect_server``,
a few seconds here) before its flow can start. The report package (a fraction of a second
of imports on 2 cores) loads meanwhile instead of after the last stage. Only while the command waits: a thread importing beside one that works and
talks to the API slows both (the GIL hands over every 5 ms), which measured ~0.1 s
slower on a cached re-run. Python's import locks make the report stage's own import wait
for this one to finish, never run it twice; a module that fails here is left to fail
there, with its real error.
"""

from __future__ import annotations

import importlib
import threading

REPORT_MODULES = ("refusalbench.tasks.refusalbench.report",)


def _load(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the stage that needs it imports it again and reports the failure
            return


def preload(modules: tuple[str, ...] = REPORT_MODULES) -> None:
    """Import ``modules`` in a daemon thread."""
    threading.Thread(target=_load, args=(modules,), name="refusalbench-preload", daemon=True).start()
