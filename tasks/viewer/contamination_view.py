"""The contamination check in the viewer: ``view DIR`` on a check's folder, and its ``/contamination`` page.

A check's folder (``refusalbench contamination --out DIR``) holds ``contamination.json`` and two run
folders, ``static/`` and ``fresh/``; given to the viewer it opens both. A refresh round's folder holds
``contamination.json`` beside its own files and ``static/`` inside. Either way the page shows the same
tables as ``contamination.html`` (``report/contamination_section.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.report.contamination_section import contamination_tables
from refusalbench.tasks.refusalbench.rounds.contamination import FILE, FRESH_FOLDER, STATIC_FOLDER
from refusalbench.tasks.viewer.layout import esc

PATH = "/contamination"


def _local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _store(uri: str) -> ArtifactStore | None:
    """The folder's store, or None for a local path that is no folder (a store would create it)."""
    if _local(uri) and not Path(uri.removeprefix("file://")).is_dir():
        return None
    return ArtifactStore(uri)


def expand(uris: Sequence[str]) -> list[str]:
    """The folders to open: a check's folder (contamination.json, no manifest) becomes its static/ and fresh/."""
    out: list[str] = []
    for uri in uris:
        store = _store(uri)
        if store is not None and store.exists(FILE) and not store.has(runfolder.MANIFEST):
            out += [store.child(STATIC_FOLDER).uri(""), store.child(FRESH_FOLDER).uri("")]
        else:
            out.append(uri)
    return out


def documents(run_uris: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """{where it was found: contamination.json} for every run folder served (``run_uris``: name -> uri):
    the folder's own (a refresh round) and its parent's (a check's static/ or fresh/), each read once."""
    found: dict[str, dict[str, Any]] = {}
    for uri in run_uris.values():
        folder = uri.rstrip("/")
        for candidate in (folder, folder.rsplit("/", 1)[0] if "/" in folder else ""):
            store = _store(candidate) if candidate else None
            if store is None or store.uri(FILE) in found or not store.exists(FILE):
                continue
            try:
                found[store.uri(FILE)] = json.loads(store.read_text(FILE))
            except ValueError:
                continue  # a file being written by a check still running: the next start reads it
    return found


def body(found: Mapping[str, Mapping[str, Any]]) -> str:
    """The page: one block per contamination.json."""
    if not found:
        return "<h1>Contamination check</h1><p class='muted'>No contamination.json beside these runs.</p>"
    blocks = [f"<h2>{esc(where)}</h2>{contamination_tables(document)}" for where, document in found.items()]
    return "<h1>Contamination check</h1>" + "".join(blocks)


def home_link(found: Mapping[str, Mapping[str, Any]]) -> str:
    """A line on the home page pointing at the comparison, naming the flagged models."""
    if not found:
        return ""
    flagged = sorted({m for d in found.values() for m, e in d.get("models", {}).items() if e.get("flagged")})
    said = f"flagged: {', '.join(flagged)}" if flagged else "no model flagged"
    return f"<p><a href='{PATH}'>Contamination check: static vs fresh</a> ({esc(said)})</p>"
