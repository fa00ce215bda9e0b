"""A benchmark file given to ``evaluate``: read, checked row by row, and placed in the run folder.

A file in the paper authors' released layout (``schema/released.py``) is read too, item for item,
so ``evaluate --benchmark`` takes RefusalBench-NQ and RefusalBench-GaRAGe as they are published.

Every problem is an :class:`InputError` (exit 2) naming the file, row and field, raised
before any model call is paid for.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pyarrow.parquet as pq

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore, split_uri
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from refusalbench.tasks.refusalbench.schema.released import (
    RELEASE_METADATA_KEY,
    is_release_layout,
    read_release,
    release_table,
)
from refusalbench.tasks.refusalbench.taxonomy import canonical_code

BENCHMARK_COLUMNS = {"item_id", "question", "expected", "answers", "variant"}


def read_benchmark(uri: str) -> list[BenchmarkItem]:
    if is_release_layout(uri):
        return read_release(uri).items
    store, name = split_uri(uri)
    if not store.exists(name):
        local_relative = "://" not in uri and not os.path.isabs(uri)
        where = f" (looked for {os.path.abspath(uri)}: relative to the working folder)" if local_relative else ""
        raise InputError(uri, "benchmark file not found" + where)
    store.check_schema_version()  # a run folder's benchmark: refused if a newer refusalbench wrote the folder
    try:
        table = store.read_table(name)
    except Exception as exc:  # not Parquet, truncated ...
        raise InputError(uri, f"not a readable Parquet file ({type(exc).__name__})") from None
    missing = sorted(BENCHMARK_COLUMNS - set(table.column_names))
    if missing:
        raise InputError(uri, "required column is missing", field=missing[0])
    items = []
    for row_number, row in enumerate(table.to_pylist(), start=1):
        try:
            items.append(
                BenchmarkItem.model_validate({k: v for k, v in row.items() if k in BenchmarkItem.model_fields})
            )
        except Exception as exc:
            first: dict[str, Any] = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("-",), "msg": str(exc)}
            raise InputError(uri, first["msg"], line=row_number, field=".".join(map(str, first["loc"]))) from None
    if not items:
        raise InputError(uri, "the benchmark has no items")
    for row_number, item in enumerate(items, start=1):
        # Checked now, not at the score stage after every model call has been paid for.
        if canonical_code(item.expected) is None:
            raise InputError(
                uri, f"not ANSWER_CORRECTLY or a refusal code: {item.expected!r}", line=row_number, field="expected"
            )
    _check_unique_ids(uri, [i.item_id for i in items])
    return items


def _check_unique_ids(uri: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for row_number, item_id in enumerate(ids, start=1):
        if item_id in seen:
            raise InputError(uri, f"duplicate item_id {item_id!r}", line=row_number, field="item_id")
        seen.add(item_id)


def keep_generation_manifest(store: ArtifactStore) -> None:
    """Evaluating in a generation's run folder keeps that run's manifest beside its own."""
    if store.has(runfolder.MANIFEST):
        previous = store.load(runfolder.MANIFEST)
        if previous.kind == "generate":
            store.save(rb_files.GENERATION_MANIFEST, previous)


def release_source(uri: str) -> dict[str, Any] | None:
    """The facts of the released benchmark ``uri`` is or was imported from (name, SHA-256, license); None otherwise."""
    if is_release_layout(uri):
        return read_release(uri).provenance
    source_store, name = split_uri(uri)
    try:
        metadata = pq.read_schema(io.BytesIO(source_store.read_bytes(name))).metadata or {}
    except Exception:  # read_benchmark has already read it; nothing to add here
        return None
    facts = metadata.get(RELEASE_METADATA_KEY)
    return json.loads(facts) if facts else None


def place_benchmark(store: ArtifactStore, uri: str, items: list[BenchmarkItem]) -> str | None:
    """Copy the benchmark into the run folder unless it is already that folder's benchmark.

    A released benchmark keeps its records' other fields (``verifier_votes``, the original query...)
    as extra columns, as ``data import release`` writes them, so the viewer can show them. Returns
    the note the manifest keeps when the benchmark is a released one: its source, hash and license.
    """
    source_store, name = split_uri(uri)
    if source_store.uri(name) == store.uri(rb_files.BENCHMARK.name):
        return None
    if is_release_layout(uri):
        release = read_release(uri)  # read once: its table and its facts
        facts: dict[str, Any] | None = release.provenance
        store.write_table(rb_files.BENCHMARK.name, release_table(release))
    elif (facts := release_source(uri)) is not None:  # imported by ``data import release``: copied as it is
        store.write_table(rb_files.BENCHMARK.name, source_store.read_table(name))
    else:
        store.save(rb_files.BENCHMARK, items)
    if facts is None:
        return None
    return f"benchmark: the released {facts['source']} (sha256 {facts['sha256']}), license {facts['license']}"
