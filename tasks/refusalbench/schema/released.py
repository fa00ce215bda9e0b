"""The paper authors' released benchmarks (RefusalBench-NQ, RefusalBench-GaRAGe) as benchmark items.

A released file is JSON lines, a JSON list or Parquet, one record per item, with the fields in
``RELEASE_FIELDS``. :func:`read_release` turns each record into a :class:`BenchmarkItem`, item for
item: ``item_id`` is the record's ``unique_id``; ``perturbed_context`` as one string is a
single-document item, as a list a multi-document one. The ``base_id`` groups the perturbations of
one original item (the cluster bootstrap resamples those groups): a hash of ``original_query`` and
``original_context`` when the record has them, else the ``unique_id`` itself, so such items count
as independent.

Every problem is an :class:`InputError` (exit 2) naming the file, the record (line of a JSON-lines
file, position in a JSON list, row of a Parquet file) and the field.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import split_uri
from refusalbench.tasks.core.tables import to_table
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Passage
from refusalbench.tasks.refusalbench.taxonomy import UnknownName, canonical_code, parse_class, parse_intensity

RELEASE_FIELDS: tuple[str, ...] = (
    "unique_id",
    "perturbed_query",
    "perturbed_context",
    "expected_rag_behavior",
    "original_answers",
    "perturbation_class",
    "intensity",
    "lever_selected",
    "generator_model",
)
# The two released benchmarks' licenses, told apart by the shape of their contexts.
NQ_LICENSE = "Apache-2.0"
GARAGE_LICENSE = "CC-BY-NC-4.0"
# Where an imported benchmark file keeps the facts of its source (Parquet schema metadata).
RELEASE_METADATA_KEY = b"refusalbench.release"
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass
class Release:
    """A released benchmark read into items, with the facts its provenance states."""

    source: str
    sha256: str
    items: list[BenchmarkItem]
    extras: list[dict[str, Any]] = field(default_factory=list)  # per item, the record's other fields
    license: str = NQ_LICENSE

    @property
    def provenance(self) -> dict[str, Any]:
        variants = [item.variant for item in self.items]
        return {
            "source": PurePosixPath(self.source).name,
            "sha256": self.sha256,
            "license": self.license,
            "items": len(self.items),
            "single": variants.count("single"),
            "multi": variants.count("multi"),
        }


def is_release_layout(uri: str) -> bool:
    """Whether ``uri`` is a released-layout file rather than a benchmark this project wrote.

    The project writes benchmarks as Parquet only, so JSON and JSON lines are always the released
    layout; a Parquet file is when it has ``unique_id`` and no ``item_id``.
    """
    if uri.lower().endswith(_JSON_SUFFIXES):
        return True
    store, name = split_uri(uri)
    if not store.exists(name):
        return False
    try:
        names = set(pq.read_schema(io.BytesIO(store.read_bytes(name))).names)
    except Exception:  # not Parquet: read_benchmark says so
        return False
    return "unique_id" in names and "item_id" not in names


def _records(uri: str, data: bytes) -> list[tuple[int, Any]]:
    """(line or position, record) of every record in the file."""
    lower = uri.lower()
    if lower.endswith(".json"):
        try:
            document = json.loads(data)
        except json.JSONDecodeError as exc:
            raise InputError(uri, f"not valid JSON ({exc.msg})", line=exc.lineno) from None
        if not isinstance(document, list):
            raise InputError(uri, "a released benchmark in JSON is a list of records")
        return list(enumerate(document, start=1))
    if lower.endswith(_JSON_SUFFIXES):
        out = []
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InputError(uri, f"not valid JSON ({exc.msg})", line=number) from None
        return out
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:
        raise InputError(uri, f"not a readable Parquet file ({type(exc).__name__})") from None
    return list(enumerate(table.to_pylist(), start=1))


def _passages(value: list[Any], uri: str, line: int) -> list[Passage]:
    """A list context as passages: strings, or objects with the text under ``text``/``content``.

    A passage without a relevance mark counts as relevant: RAF then asks only that an answer be
    supported by the passages given.
    """
    out = []
    for passage in value:
        if isinstance(passage, str):
            out.append(Passage(text=passage, relevant=True))
        elif isinstance(passage, dict) and isinstance(passage.get("text", passage.get("content")), str):
            relevant = passage.get("relevant", passage.get("is_relevant", True))
            out.append(Passage(text=passage.get("text", passage.get("content")), relevant=bool(relevant)))
        else:
            raise InputError(
                uri, "a passage is neither text nor an object with text", line=line, field="perturbed_context"
            )
    return out


def _base_id(record: dict[str, Any]) -> str:
    if record.get("original_query") is None or record.get("original_context") is None:
        return str(record["unique_id"])
    key = json.dumps([record["original_query"], record["original_context"]], sort_keys=True, ensure_ascii=False)
    return "base-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _item(record: Any, uri: str, line: int) -> BenchmarkItem:
    if not isinstance(record, dict):
        raise InputError(uri, "a record is not an object", line=line)
    for name in RELEASE_FIELDS:
        if record.get(name) is None:
            raise InputError(uri, "required field is missing", line=line, field=name)
    expected = canonical_code(str(record["expected_rag_behavior"]))
    if expected is None:
        raise InputError(
            uri,
            f"not ANSWER_CORRECTLY or a refusal code: {record['expected_rag_behavior']!r}",
            line=line,
            field="expected_rag_behavior",
        )
    try:
        cls = parse_class(str(record["perturbation_class"]))
    except UnknownName as exc:
        raise InputError(uri, str(exc), line=line, field="perturbation_class") from None
    try:
        intensity = parse_intensity(str(record["intensity"]))
    except UnknownName as exc:
        raise InputError(uri, str(exc), line=line, field="intensity") from None
    answers = record["original_answers"]
    answers = [answers] if isinstance(answers, str) else [str(a) for a in answers]
    context, original = record["perturbed_context"], record.get("original_context")
    if not isinstance(context, (str, list)):
        raise InputError(uri, "neither a passage nor a list of passages", line=line, field="perturbed_context")
    passages = _passages(context, uri, line) if isinstance(context, list) else None
    multi = passages is not None
    lever = record["lever_selected"]
    return BenchmarkItem(
        item_id=str(record["unique_id"]),
        base_id=_base_id(record),
        variant="multi" if multi else "single",
        perturbation_class=cls,
        intensity=intensity,
        lever_id=lever if isinstance(lever, str) else json.dumps(lever, sort_keys=True, default=str),
        generator=str(record["generator_model"]),
        question=str(record["perturbed_query"]),
        context=None if multi else context,
        passages=passages,
        original_question=str(record.get("original_query") or record["perturbed_query"]),
        original_context=original if isinstance(original, str) else None,
        original_passages=_passages(original, uri, line) if isinstance(original, list) else None,
        answers=answers,
        expected=expected,
        domain=record.get("domain") if isinstance(record.get("domain"), str) else None,
    )


def read_release(uri: str, license: str | None = None) -> Release:
    """Every record of a released benchmark as an item, checked; ``license``: default inferred from the shape."""
    store, name = split_uri(uri)
    if not store.exists(name):
        raise InputError(uri, "benchmark file not found")
    data = store.read_bytes(name)
    items, extras, seen = [], [], set()
    for line, record in _records(uri, data):
        item = _item(record, uri, line)
        if item.item_id in seen:
            raise InputError(uri, f"duplicate unique_id {item.item_id!r}", line=line, field="unique_id")
        seen.add(item.item_id)
        items.append(item)
        extras.append({k: v for k, v in record.items() if k not in RELEASE_FIELDS})
    if not items:
        raise InputError(uri, "the benchmark has no items")
    inferred = GARAGE_LICENSE if any(item.variant == "multi" for item in items) else NQ_LICENSE
    return Release(uri, hashlib.sha256(data).hexdigest(), items, extras, license or inferred)


def _column(values: list[Any]) -> list[str | None]:
    # The released fields carry mixed shapes (lists, objects, numbers): kept as text so one column has one type.
    return [v if v is None or isinstance(v, str) else json.dumps(v, sort_keys=True, default=str) for v in values]


def release_table(release: Release) -> pa.Table:
    """The benchmark file of a release: the items' columns, the records' other fields (a name the items
    already use gets a ``release_`` prefix), and the source's facts in the schema metadata."""
    table = to_table(list(release.items), BenchmarkItem)
    names = list(dict.fromkeys(k for extra in release.extras for k in extra))
    for key in names:
        column = key if key not in table.column_names else f"release_{key}"
        table = table.append_column(
            column, pa.array(_column([extra.get(key) for extra in release.extras]), pa.string())
        )
    metadata = dict(table.schema.metadata or {})
    metadata[RELEASE_METADATA_KEY] = json.dumps(release.provenance, sort_keys=True).encode()
    return table.replace_schema_metadata(metadata)
