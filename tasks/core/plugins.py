"""Plugins: a user's own registrations (a provider profile, a metric, a retrieval strategy, ...).

A plugin is a Python module that adds entries to the project's registries when it is imported
(``refusalbench.extend`` gathers them, with a how-to). There are two ways to name one:

- **an entry point** in the group ``refusalbench.plugins`` of an installed distribution (its
  ``pyproject.toml``: ``[project.entry-points."refusalbench.plugins"]``, ``acme = "acme_rb.plugin"``).
  An entry point naming a module imports it; one naming a function (``"acme_rb:register"``) imports
  its module and calls the function with no arguments. Every entry point of the group is loaded.
- **the config's** ``plugins:`` key: a list of module names, for code that is not packaged. A name
  is imported from ``sys.path`` first; a name not found there is looked for in the folder of the
  config file that lists it, and that folder then stays at the *end* of ``sys.path`` (so the
  plugin's own imports of modules beside it work, and nothing installed is shadowed).

When they load: :func:`refusalbench.tasks.core.config.load_config` loads both before it validates
the config (so a config may name what a plugin registers), and every task of the pipeline loads
its config's plugins first, in whatever process it runs (a Dask worker process never reads the
config file); the CLI loads the entry points as it starts. Loading is idempotent: an entry point
is loaded, and a module imported, once per process.

A plugin that cannot be loaded is bad input (exit 2): :class:`PluginError` says why, and the
caller says where (the config's file, line and ``plugins`` key; the distribution and entry point).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from refusalbench.tasks.core.errors import InputError

ENTRY_POINT_GROUP = "refusalbench.plugins"
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

# Thread workers may start tasks at once: one plugin import at a time, and sys.path edited by one.
_lock = threading.RLock()
_loaded_entry_points: set[tuple[str, str]] = set()  # (distribution, entry point name) loaded in this process
# Every entry point loaded: later calls return at once (reading every distribution's metadata costs
# milliseconds, and every task calls this).
_all_loaded = False


class PluginError(Exception):
    """Why a plugin could not be loaded (the caller adds where it was named)."""


def load_entry_points() -> list[str]:
    """Load the ``refusalbench.plugins`` entry points not loaded yet in this process.

    Returns ``distribution:name`` of those loaded by this call. A failing entry point is an
    :class:`InputError` naming its distribution and entry point; the ones before it stay loaded.
    """
    global _all_loaded
    done: list[str] = []
    if _all_loaded:
        return done
    with _lock:
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            distribution = entry.dist.name if entry.dist is not None else "unknown distribution"
            key = (distribution, entry.name)
            if key in _loaded_entry_points:
                continue
            try:
                loaded = entry.load()
                # A function is a registration to run; a module (or a class) registered by being imported.
                if callable(loaded) and not isinstance(loaded, (ModuleType, type)):
                    loaded()
            except Exception as exc:  # noqa: BLE001 - any failure of a plugin is the plugin's input problem
                raise InputError(
                    f"distribution {distribution}",
                    f"entry point {entry.name} = {entry.value}: {_described(exc)}",
                    field=ENTRY_POINT_GROUP,
                ) from exc
            _loaded_entry_points.add(key)
            done.append(f"{distribution}:{entry.name}")
        _all_loaded = True
    return done


def import_plugin(name: str, folder: str | Path | None = None) -> ModuleType:
    """Import the plugin module ``name`` (dotted), from ``sys.path`` or else from ``folder``.

    Raises :class:`PluginError` when ``name`` is no module name, no such module exists, or
    importing it fails (the error of the plugin's own code, in one line).
    """
    if not MODULE_NAME.fullmatch(name):
        raise PluginError(f"{name!r} is not a module name (dotted Python identifiers, e.g. my_metrics)")
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        try:
            return _import(name)
        except ModuleNotFoundError as exc:
            if not _names_the_plugin(exc, name):
                raise PluginError(f"plugin module {name!r} failed to import: {_described(exc)}") from exc
        where = "on sys.path"
        if folder is not None:
            where += f" or in {folder}"
            module = _import_from(name, str(Path(folder).resolve()))
            if module is not None:
                return module
        raise PluginError(f"no plugin module {name!r} {where}")


def _import(name: str) -> ModuleType:
    """``import name``; a failure other than the module itself missing is the plugin's error."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - the plugin's own code failed
        raise PluginError(f"plugin module {name!r} failed to import: {_described(exc)}") from exc


def _import_from(name: str, folder: str) -> ModuleType | None:
    """``name`` imported with ``folder`` at the end of sys.path (left there on success); None if not found."""
    added = folder not in sys.path
    if added:
        sys.path.append(folder)
        importlib.invalidate_caches()
    found = False
    try:
        module = _import(name)
        found = True
        return module
    except ModuleNotFoundError as exc:
        if not _names_the_plugin(exc, name):
            raise PluginError(f"plugin module {name!r} failed to import: {_described(exc)}") from exc
        return None
    finally:
        if added and not found:  # a folder that gave no plugin is not left on sys.path
            sys.path.remove(folder)


def _names_the_plugin(exc: ModuleNotFoundError, name: str) -> bool:
    """Whether ``exc`` says ``name`` (or a package above it) is missing, not a module the plugin imports."""
    parts = name.split(".")
    return exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _described(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


__all__ = ["ENTRY_POINT_GROUP", "MODULE_NAME", "PluginError", "import_plugin", "load_entry_points"]
