"""Streaming readers for the three base-set formats: JSONL, CSV and Parquet.

Each reader yields ``(line, raw record)`` and reports what it cannot read (bad bytes, overlong
lines, malformed JSON or CSV, a wrong header) to the file's ``Problems`` instead of raising.
LINE is the physical line for JSONL, the line where the record starts for CSV (the header is
line 1) and the 1-based row number for Parquet. Readers are chosen by file suffix from
``READERS``; another format is one reader function under ``@register_reader(".suffix")``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.core.textinput import open_text, text_lines
from refusalbench.tasks.refusalbench.basesets.problems import BASE_FIELDS, REQUIRED_FIELDS, SKIP, Problems

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)

Reader = Callable[[Path, Problems, int], Iterator[tuple[int, Any]]]


class _LineSource(Protocol):
    """A binary stream, or a wrapper that counts what it reads (the importers' progress bar)."""

    def readline(self, size: int = -1, /) -> bytes: ...


READERS: Registry[Reader] = Registry("base-set file type")  # lower-case suffix -> reader


def register_reader(*suffixes: str, replace: bool = False) -> Callable[[Reader], Reader]:
    """Register a reader for files with these (lower-case) suffixes, e.g. ``".jsonl"``."""

    def add(reader: Reader) -> Reader:
        for suffix in suffixes:
            READERS.add(suffix, reader, replace=replace)
        return reader

    return add


def physical_lines(stream: _LineSource, problems: Problems, max_line_bytes: int) -> Iterator[tuple[int, str]]:
    """Yield (line number, decoded text) per physical line; oversized and non-UTF-8 lines become problems
    (``core.textinput.text_lines``: the size bound and wording every text input shares)."""
    for line_no, text in text_lines(stream, problems.file, max_line_bytes):
        if isinstance(text, InputError):
            problems.add(text.problem, line=line_no)
            continue
        yield line_no, text


def json_lines(stream: _LineSource, problems: Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed value) for each non-blank JSONL line; parse failures become problems."""
    for line_no, text in physical_lines(stream, problems, max_line_bytes):
        if not text.strip():
            continue
        try:
            yield line_no, json.loads(text)
        except json.JSONDecodeError as exc:
            problems.add(f"not valid JSON: {exc.msg} (column {exc.colno})", line=line_no)


@register_reader(*JSONL_SUFFIXES)
def _read_jsonl(path: Path, problems: Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as stream:
        yield from json_lines(stream, problems, max_line_bytes)


def _check_columns(columns: list[str], problems: Problems, line: int | None) -> bool:
    """Header checks shared by CSV and Parquet; False when rows cannot be read meaningfully."""
    ok = True
    seen: set[str] = set()
    for name in columns:
        if name in seen:
            problems.add("duplicate column", line=line, field=name or "-")
            ok = False
        seen.add(name)
        if name not in BASE_FIELDS:
            problems.add(f"unknown column (allowed: {', '.join(BASE_FIELDS)})", line=line, field=name or "-")
            ok = False
    for name in REQUIRED_FIELDS:
        if name not in seen:
            problems.add("missing column", line=line, field=name)
            ok = False
    if "context" not in seen and "passages" not in seen:
        problems.add("needs a context column (single-document) or a passages column (multi-document)", line=line)
        ok = False
    return ok


def _parse_csv_answers(cell: str) -> tuple[Any, str | None]:
    """``answers`` in CSV: a JSON list or ``|``-separated text. Returns (value, problem)."""
    text = cell.strip()
    if not text:
        return [], None
    if text.startswith("["):
        try:
            return json.loads(text), None
        except json.JSONDecodeError as exc:
            return None, f"looks like a JSON list but is not valid JSON: {exc.msg}"
    return [part.strip() for part in text.split("|")], None


@register_reader(*CSV_SUFFIXES)
def _read_csv(path: Path, problems: Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    # First pass: encoding and line length, streamed, so the csv module only ever sees sane text.
    before = len(problems)
    with open(path, "rb") as stream:
        for _ in physical_lines(stream, problems, max_line_bytes):
            pass
    if len(problems) > before:
        return

    old_limit = csv.field_size_limit()
    csv.field_size_limit(max(old_limit, max_line_bytes))
    try:
        with open_text(path) as stream:
            reader = csv.reader(stream, strict=True)
            header: list[str] | None = None
            last_line = 0
            while True:
                start = last_line + 1
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    problems.add(f"malformed CSV: {exc}", line=start)
                    return
                last_line = reader.line_num
                if header is None:
                    header = [name.strip() for name in row]
                    if not _check_columns(header, problems, line=1):
                        return
                    continue
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    problems.add(f"record has {len(row)} fields but the header has {len(header)}", line=start)
                    continue
                yield start, _csv_record(dict(zip(header, row)), problems, start)
    finally:
        csv.field_size_limit(old_limit)


def _csv_record(cells: dict[str, str], problems: Problems, line: int) -> dict[str, Any]:
    """Turn CSV cells into the JSON shape; empty optional cells mean absent."""
    record: dict[str, Any] = {}
    for name, cell in cells.items():
        if name in ("context", "passages", "domain") and not cell.strip():
            continue
        if name == "answers":
            value, problem = _parse_csv_answers(cell)
            if problem:
                problems.add(problem, line=line, field="answers")
                record["answers"] = SKIP
                continue
            record["answers"] = value
        elif name == "passages":
            try:
                record["passages"] = json.loads(cell)
            except json.JSONDecodeError as exc:
                problems.add(f"not valid JSON: {exc.msg}", line=line, field="passages")
                record["passages"] = SKIP
        else:
            record[name] = cell
    return record


@register_reader(*PARQUET_SUFFIXES)
def _read_parquet(path: Path, problems: Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for truncated or foreign files
        problems.add(f"not a readable Parquet file: {exc}")
        return
    if not _check_columns(list(parquet.schema_arrow.names), problems, line=None):
        return
    row_no = 0
    try:
        for batch in parquet.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                row_no += 1
                yield row_no, row
    except Exception as exc:
        problems.add(f"not a readable Parquet file: {exc}", line=row_no + 1)


def reader_for(path: Path, problems: Problems) -> Reader | None:
    """The reader for the file's suffix; an unsupported suffix is a problem."""
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        problems.add(f"unsupported file type {path.suffix!r} (use .jsonl, .parquet or .csv)")
    return reader
