"""Loading, validating and writing base sets.

A base set is JSONL, Parquet or CSV with one record per item:
``id`` (unique, non-blank str), ``question`` (non-blank str), ``answers`` (non-empty list of non-blank str),
exactly one of ``context`` (non-blank str, single-document) or ``passages`` (non-empty list of
``{text: str, relevant: bool}`` with at least one relevant passage, multi-document), optional ``domain`` (str).

Rules the loader applies (and ``refusalbench data validate`` reports):

* Every problem in the file is reported, not just the first, as ``FILE:LINE: field: problem``. LINE is the
  physical line for JSONL, the line where the record starts for CSV (the header is line 1) and the 1-based
  row number for Parquet. File-level problems (missing file, empty file, bad header) carry no line or line 1.
* Unknown fields are an error naming the field: a typo such as ``answer`` for ``answers`` must not be
  silently dropped. ``null`` (JSONL/Parquet) or an empty cell (CSV) for an optional field means absent.
* A UTF-8 byte-order mark is accepted. Bytes that are not UTF-8 are reported with their line.
* Input is streamed: a line longer than ``max_line_bytes`` (10 MiB) is refused without being read into
  memory, and reading stops after ``MAX_PROBLEMS`` problems so a huge broken file fails fast.
* CSV: ``answers`` is a JSON list (``["a", "b"]``) or ``|``-separated text (``a|b``); ``passages`` is JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.refusalbench.basesets.problems import MAX_LINE_BYTES, TooManyProblems, open_problems
from refusalbench.tasks.refusalbench.basesets.readers import JSONL_SUFFIXES, reader_for
from refusalbench.tasks.refusalbench.basesets.validation import check_record
from refusalbench.tasks.refusalbench.schema.records import BaseItem


def load_base_set(path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES) -> list[BaseItem]:
    """Load a base set (JSONL, Parquet or CSV, by suffix); raise InputErrors listing every problem found."""
    p, problems = open_problems(path)
    reader = reader_for(p, problems)
    problems.raise_if_any()
    assert reader is not None, "an unsupported file type is a problem, raised just above"
    items: list[BaseItem] = []
    first_line_of: dict[str, int] = {}
    try:
        for line, record in reader(p, problems, max_line_bytes):
            item = check_record(record, line, problems)
            item_id = record.get("id") if isinstance(record, dict) else None
            if isinstance(item_id, str) and item_id.strip():
                if item_id in first_line_of:
                    problems.add(
                        f"duplicate id {item_id!r} (first used on line {first_line_of[item_id]})", line=line, field="id"
                    )
                    continue
                first_line_of[item_id] = line
            if item is not None:
                items.append(item)
    except TooManyProblems:
        problems.errors.append(InputError(problems.file, f"stopped after {problems.cap} problems; fix these first"))
    problems.raise_if_any()
    if not items:
        raise InputErrors([InputError(problems.file, "empty file: no records")])
    return items


def base_set_import_hint(path: str | os.PathLike[str]) -> str:
    """The commands that build a missing base set at ``path`` from the paper's public sources."""
    out = Path(os.path.abspath(path))
    then = ""
    if out.suffix.lower() not in JSONL_SUFFIXES:  # the importers write JSON lines
        out, then = out.with_suffix(JSONL_SUFFIXES[0]), " and set generation.base_set to it"
    return (
        f"build it with `refusalbench data import garage GaRAGe_benchmark.jsonl --out {out}` or "
        f"`refusalbench data import kilt-nq --questions nq-dev-kilt.jsonl --knowledge kilt_knowledgesource.json "
        f"--out {out}`{then}"
    )


def load_configured_base_set(cfg: RunConfig) -> list[BaseItem]:
    """The config's ``generation.base_set``, read from beside the config; a missing file is bad input
    naming where it was looked for and how to build it."""
    written = cfg.generation_section().base_set
    hint = base_set_import_hint(cfg.resolve_path(written))
    return load_base_set(cfg.input_path(written, ("generation", "base_set"), hint=hint))


def validate_base_set(path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """Every problem of a base set as ``FILE:LINE: field: problem`` lines; empty when the file is valid."""
    try:
        load_base_set(path, max_line_bytes=max_line_bytes)
    except InputErrors as exc:
        return exc.lines()
    except InputError as exc:
        return [str(exc)]
    return []


def write_base_set(items: Iterable[BaseItem], path: str | os.PathLike[str]) -> Path:
    """Write items as JSONL atomically (temporary file, then rename), so no partial file is left behind."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for item in items:
                out.write(json.dumps(item.model_dump(exclude_none=True), ensure_ascii=False) + "\n")
        umask = os.umask(0)  # mkstemp makes the file private (0600); give it the mode a plain open() would
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
