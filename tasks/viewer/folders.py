"""Which run folders the viewer shows: each opened through the artifact store, checked, named.

A run folder is one a run wrote: it holds a ``manifest.json`` or one of the tables a method
writes. Anything else (a missing path, an empty or unrelated folder) is refused with one
InputError naming it, before the server starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.viewer import contamination_view

Method = Literal["refusalbench", "knowornot"]

# The tables that make a folder a run folder of each method.
KNOWORNOT_MARKERS = (kon_files.RESULTS, kon_files.EXPERIMENT_INPUTS)
REFUSALBENCH_MARKERS = (rb_files.JUDGMENTS, rb_files.JUDGED, rb_files.RESPONSES, rb_files.BENCHMARK)


@dataclass(frozen=True)
class RunFolder:
    """One run folder the viewer serves: its URL name, where it is, its store and its method."""

    name: str
    uri: str
    store: ArtifactStore
    method: Method


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def method_of(store: ArtifactStore) -> Method | None:
    """The method that wrote the folder, or None when it is no run folder."""
    if store.has(runfolder.MANIFEST):
        kind = str((store.read_json(runfolder.MANIFEST.name) or {}).get("kind", ""))
        if kind == "knowornot":
            return "knowornot"
    if any(store.has(artifact) for artifact in KNOWORNOT_MARKERS):
        return "knowornot"
    if store.has(runfolder.MANIFEST) or any(store.has(artifact) for artifact in REFUSALBENCH_MARKERS):
        return "refusalbench"
    return None


def open_folder(uri: str) -> tuple[ArtifactStore, Method]:
    """The store of the run folder at ``uri`` and its method; an InputError naming it when it is not one."""
    if _is_local(uri) and not Path(uri.removeprefix("file://")).is_dir():
        # Checked before the store is made: a local store creates its folder, and a viewer must not.
        raise InputError(uri, "not a run folder: no such folder")
    store = ArtifactStore(uri)
    store.check_schema_version()
    method = method_of(store)
    if method is None:
        names = ", ".join(
            a.name for a in (runfolder.MANIFEST, rb_files.BENCHMARK, rb_files.JUDGMENTS, kon_files.RESULTS)
        )
        raise InputError(uri, f"not a run folder: none of {names}")
    return store, method


def _slug(uri: str) -> str:
    tail = uri.rstrip("/").rsplit("/", 1)[-1] or "run"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", tail).strip("-.") or "run"


def open_folders(uris: Sequence[str]) -> list[RunFolder]:
    """Every folder opened (the first bad one raises), each with a name unique among them for its URLs."""
    folders: list[RunFolder] = []
    taken: set[str] = set()
    for uri in contamination_view.expand(uris):  # a contamination check's folder: its two run folders
        store, method = open_folder(uri)
        name, n = _slug(uri), 2
        while name in taken:
            name, n = f"{_slug(uri)}-{n}", n + 1
        taken.add(name)
        folders.append(RunFolder(name=name, uri=store.root, store=store, method=method))
    return folders
