"""Base sets: load and validate them (DESIGN.md §5), and import NQ/KILT and GaRAGe with the paper's curation.

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

import csv
import hashlib
import json
import logging
import os
import random
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from refusalbench.tasks.errors import InputError, InputErrors
from refusalbench.tasks.records import BaseItem, Passage

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 10 * 1024 * 1024
MAX_PROBLEMS = 1000

BASE_FIELDS = ("id", "question", "answers", "context", "passages", "domain")
REQUIRED_FIELDS = ("id", "question", "answers")
PASSAGE_FIELDS = ("text", "relevant")

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)

_UTF8_BOM = b"\xef\xbb\xbf"


# ----------------------------------------------------------------- problem collection


class _TooManyProblems(Exception):
    """Raised internally once the problem cap is reached: stop reading a hopeless file."""


class _Problems:
    """Collects the problems of one file, in reading order, up to a cap."""

    def __init__(self, file: str, cap: int = MAX_PROBLEMS):
        self.file = file
        self.cap = cap
        self.errors: list[InputError] = []

    def add(self, problem: str, *, line: int | None = None, field: str | None = None) -> None:
        self.errors.append(InputError(self.file, problem, line=line, field=field))
        if len(self.errors) >= self.cap:
            raise _TooManyProblems

    def __len__(self) -> int:
        return len(self.errors)

    def raise_if_any(self) -> None:
        if self.errors:
            raise InputErrors(self.errors)


def _json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages users of any format can read."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# ----------------------------------------------------------------- streaming readers


def _iter_physical_lines(stream: IO[bytes], problems: _Problems, max_line_bytes: int) -> Iterator[tuple[int, str]]:
    """Yield (line number, decoded text) per physical line; oversized and non-UTF-8 lines become problems.

    A line is read with a size bound, so an enormous line is skipped chunk by chunk instead of
    being loaded whole.
    """
    line_no = 0
    while True:
        chunk = stream.readline(max_line_bytes + 1)
        if not chunk:
            return
        line_no += 1
        if len(chunk) > max_line_bytes and not chunk.endswith(b"\n"):
            problems.add(
                f"line is longer than {_human_bytes(max_line_bytes)}; refusing to read it", line=line_no
            )
            while chunk and not chunk.endswith(b"\n"):
                chunk = stream.readline(max_line_bytes)
            continue
        if line_no == 1 and chunk.startswith(_UTF8_BOM):
            chunk = chunk[len(_UTF8_BOM):]
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.add(
                f"not valid UTF-8 (byte 0x{chunk[exc.start]:02x} at column {exc.start + 1})", line=line_no
            )
            continue
        yield line_no, text


def _human_bytes(n: int) -> str:
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    return f"{n} bytes"


def _iter_json_lines(path: Path, problems: _Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed value) for each non-blank JSONL line; parse failures become problems."""
    with open(path, "rb") as stream:
        for line_no, text in _iter_physical_lines(stream, problems, max_line_bytes):
            if not text.strip():
                continue
            try:
                yield line_no, json.loads(text)
            except json.JSONDecodeError as exc:
                problems.add(f"not valid JSON: {exc.msg} (column {exc.colno})", line=line_no)


def _read_jsonl(path: Path, problems: _Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    yield from _iter_json_lines(path, problems, max_line_bytes)


def _check_columns(columns: list[str], problems: _Problems, line: int | None) -> bool:
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


def _read_csv(path: Path, problems: _Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    # First pass: encoding and line length, streamed, so the csv module only ever sees sane text.
    before = len(problems)
    with open(path, "rb") as stream:
        for _ in _iter_physical_lines(stream, problems, max_line_bytes):
            pass
    if len(problems) > before:
        return

    old_limit = csv.field_size_limit()
    csv.field_size_limit(max(old_limit, max_line_bytes))
    try:
        with open(path, encoding="utf-8-sig", newline="") as stream:
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


def _csv_record(cells: dict[str, str], problems: _Problems, line: int) -> dict[str, Any]:
    """Turn CSV cells into the JSON shape; empty optional cells mean absent."""
    record: dict[str, Any] = {}
    for name, cell in cells.items():
        if name in ("context", "passages", "domain") and not cell.strip():
            continue
        if name == "answers":
            value, problem = _parse_csv_answers(cell)
            if problem:
                problems.add(problem, line=line, field="answers")
                record["answers"] = _SKIP
                continue
            record["answers"] = value
        elif name == "passages":
            try:
                record["passages"] = json.loads(cell)
            except json.JSONDecodeError as exc:
                problems.add(f"not valid JSON: {exc.msg}", line=line, field="passages")
                record["passages"] = _SKIP
        else:
            record[name] = cell
    return record


class _Skip:
    """Marks a field whose problem was already reported while decoding it."""


_SKIP = _Skip()


def _read_parquet(path: Path, problems: _Problems, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
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


_READERS: dict[str, Callable[[Path, _Problems, int], Iterator[tuple[int, Any]]]] = {
    **{s: _read_jsonl for s in JSONL_SUFFIXES},
    **{s: _read_parquet for s in PARQUET_SUFFIXES},
    **{s: _read_csv for s in CSV_SUFFIXES},
}


# ----------------------------------------------------------------- record checks


def _check_text(record: dict[str, Any], name: str, line: int, problems: _Problems) -> str | None:
    if name not in record:
        problems.add("missing field", line=line, field=name)
        return None
    value = record[name]
    if isinstance(value, _Skip):
        return None
    if not isinstance(value, str):
        problems.add(f"must be a string, got {_json_type(value)}", line=line, field=name)
        return None
    if not value.strip():
        problems.add("is blank", line=line, field=name)
        return None
    return value


def _check_answers(record: dict[str, Any], line: int, problems: _Problems) -> list[str] | None:
    if "answers" not in record:
        problems.add("missing field", line=line, field="answers")
        return None
    value = record["answers"]
    if isinstance(value, _Skip):
        return None
    if not isinstance(value, (list, tuple)):
        problems.add(f"must be a list of strings, got {_json_type(value)}", line=line, field="answers")
        return None
    if not value:
        problems.add("is empty: at least one answer is needed", line=line, field="answers")
        return None
    ok = True
    for i, answer in enumerate(value):
        if not isinstance(answer, str):
            problems.add(f"must be a string, got {_json_type(answer)}", line=line, field=f"answers[{i}]")
            ok = False
        elif not answer.strip():
            problems.add("is blank", line=line, field=f"answers[{i}]")
            ok = False
    return list(value) if ok else None


def _check_passages(value: Any, line: int, problems: _Problems) -> list[Passage] | None:
    if isinstance(value, _Skip):
        return None
    if not isinstance(value, (list, tuple)):
        problems.add(f"must be a list of {{text, relevant}} objects, got {_json_type(value)}",
                     line=line, field="passages")
        return None
    if not value:
        problems.add("is empty: a multi-document item needs passages", line=line, field="passages")
        return None
    passages: list[Passage] = []
    ok = True
    for i, passage in enumerate(value):
        where = f"passages[{i}]"
        if not isinstance(passage, dict):
            problems.add(f"must be an object {{text, relevant}}, got {_json_type(passage)}", line=line, field=where)
            ok = False
            continue
        for key in passage:
            if key not in PASSAGE_FIELDS:
                problems.add("unknown field (allowed: text, relevant)", line=line, field=f"{where}.{key}")
                ok = False
        text = passage.get("text")
        if "text" not in passage:
            problems.add("missing field", line=line, field=f"{where}.text")
            ok = False
        elif not isinstance(text, str):
            problems.add(f"must be a string, got {_json_type(text)}", line=line, field=f"{where}.text")
            ok = False
        elif not text.strip():
            problems.add("is blank", line=line, field=f"{where}.text")
            ok = False
        relevant = passage.get("relevant")
        if "relevant" not in passage:
            problems.add("missing field", line=line, field=f"{where}.relevant")
            ok = False
        elif not isinstance(relevant, bool):
            problems.add(f"must be true or false, got {_json_type(relevant)}", line=line, field=f"{where}.relevant")
            ok = False
        if ok:
            passages.append(Passage(text=text, relevant=relevant))
    if ok and not any(p.relevant for p in passages):
        problems.add("no passage is marked relevant: at least one must carry the answer", line=line, field="passages")
        return None
    return passages if ok else None


def _check_record(record: Any, line: int, problems: _Problems) -> BaseItem | None:
    """Validate one raw record; report every problem in it; return the item when there were none."""
    if not isinstance(record, dict):
        problems.add(f"expected a JSON object, got {_json_type(record)}", line=line)
        return None
    before = len(problems)
    for key in record:
        if key not in BASE_FIELDS:
            problems.add(f"unknown field (allowed: {', '.join(BASE_FIELDS)})", line=line, field=str(key))
    # null for an optional field means absent (Parquet and pandas write nulls for missing values).
    optional = {k: record[k] for k in ("context", "passages", "domain") if record.get(k) is not None}
    item_id = _check_text(record, "id", line, problems)
    question = _check_text(record, "question", line, problems)
    answers = _check_answers(record, line, problems)

    context = passages = None
    if "context" in optional and "passages" in optional:
        problems.add("has both context and passages: give one (context = single-document, passages = multi-document)",
                     line=line, field="context")
    elif "context" in optional:
        context = _check_text(optional, "context", line, problems)
    elif "passages" in optional:
        passages = _check_passages(optional["passages"], line, problems)
    else:
        problems.add("missing field: give context (single-document) or passages (multi-document)",
                     line=line, field="context")
    domain = optional.get("domain")
    if domain is not None and not isinstance(domain, str):
        problems.add(f"must be a string, got {_json_type(domain)}", line=line, field="domain")

    already_reported = any(isinstance(v, _Skip) for v in record.values())  # CSV cells that failed to decode
    if already_reported or len(problems) > before:
        return None
    return BaseItem(id=item_id, question=question, answers=answers, context=context,
                    passages=passages, domain=domain)


# ----------------------------------------------------------------- public loading API


def _reader_for(path: Path, problems: _Problems) -> Callable[[Path, _Problems, int], Iterator[tuple[int, Any]]] | None:
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        problems.add(f"unsupported file type {path.suffix!r} (use .jsonl, .parquet or .csv)")
    return reader


def _open_problems(path: str | os.PathLike[str]) -> tuple[Path, _Problems]:
    """Common file checks; raises InputErrors when the file cannot be read at all."""
    file = str(path)
    p = Path(path)
    problems = _Problems(file)
    if not p.exists():
        problems.add("file not found")
    elif not p.is_file():
        problems.add("not a regular file")
    elif p.stat().st_size == 0:
        problems.add("empty file: no records")
    problems.raise_if_any()
    return p, problems


def load_base_set(path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES) -> list[BaseItem]:
    """Load a base set (JSONL, Parquet or CSV, by suffix); raise InputErrors listing every problem found."""
    p, problems = _open_problems(path)
    reader = _reader_for(p, problems)
    problems.raise_if_any()
    items: list[BaseItem] = []
    first_line_of: dict[str, int] = {}
    try:
        for line, record in reader(p, problems, max_line_bytes):
            item = _check_record(record, line, problems)
            item_id = record.get("id") if isinstance(record, dict) else None
            if isinstance(item_id, str) and item_id.strip():
                if item_id in first_line_of:
                    problems.add(f"duplicate id {item_id!r} (first used on line {first_line_of[item_id]})",
                                 line=line, field="id")
                    continue
                first_line_of[item_id] = line
            if item is not None:
                items.append(item)
    except _TooManyProblems:
        problems.errors.append(InputError(problems.file, f"stopped after {problems.cap} problems; fix these first"))
    problems.raise_if_any()
    if not items:
        raise InputErrors([InputError(problems.file, "empty file: no records")])
    return items


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
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


# ----------------------------------------------------------------- shared importer helpers


def _stable_rng(seed: int, *parts: str) -> random.Random:
    """A Random seeded from (seed, parts) through SHA-256, identical across processes and Python builds."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _seeded_subset(indices: list[int], k: int | None, rng: random.Random) -> list[int]:
    """k of the indices without replacement (all when k is None or too large), kept in input order."""
    if k is None or k >= len(indices):
        return list(indices)
    return sorted(rng.sample(indices, k))


def _squash_spaces(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _id_text(value: Any) -> str | None:
    """Dataset ids arrive as strings or integers; both become strings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (str, int)) and str(value).strip():
        return str(value)
    return None


# ----------------------------------------------------------------- NaturalQuestions via KILT


def _kilt_paragraphs_text(paragraphs: list[Any], start: int, end: int) -> str:
    """Join KILT paragraphs start..end, dropping section headings and bullet markers of the dump format."""
    parts = []
    for paragraph in paragraphs[start:end + 1]:
        if not isinstance(paragraph, str) or paragraph.startswith("Section::::"):
            continue
        parts.append(re.sub(r"^BULLET::::-?\s*", "", paragraph))
    return _squash_spaces(" ".join(parts))


def _load_kilt_knowledge(path: str | os.PathLike[str], wanted: set[str], max_line_bytes: int) -> dict[str, list[Any]]:
    """Paragraph lists of the wanted pages from a KILT knowledge-source JSONL (streamed; others skipped)."""
    p, problems = _open_problems(path)
    pages: dict[str, list[Any]] = {}
    try:
        for line, page in _iter_json_lines(p, problems, max_line_bytes):
            if not isinstance(page, dict):
                problems.add(f"expected a JSON object, got {_json_type(page)}", line=line)
                continue
            page_id = _id_text(page.get("wikipedia_id"))
            if page_id is None:
                problems.add("missing or not a string", line=line, field="wikipedia_id")
                continue
            if page_id not in wanted:
                continue
            text = page.get("text")
            if not isinstance(text, list):
                problems.add(f"must be a list of paragraphs, got {_json_type(text)}", line=line, field="text")
                continue
            pages[page_id] = text
    except _TooManyProblems:
        pass
    problems.raise_if_any()
    return pages


def _kilt_record_parts(record: Any, line: int, problems: _Problems) -> tuple[str, str, list[str], list[Any]] | None:
    """(id, question, short answers, output list) of a KILT record, or None after reporting its problems."""
    if not isinstance(record, dict):
        problems.add(f"expected a JSON object, got {_json_type(record)}", line=line)
        return None
    before = len(problems)
    record_id = _id_text(record.get("id"))
    if record_id is None:
        problems.add("missing, blank or not a string", line=line, field="id")
    question = record.get("input")
    if not isinstance(question, str) or not question.strip():
        problems.add("missing, blank or not a string (the question)", line=line, field="input")
    output = record.get("output")
    answers: list[str] = []
    if not isinstance(output, list):
        problems.add(f"must be a list, got {_json_type(output)}", line=line, field="output")
        output = []
    for i, entry in enumerate(output):
        if not isinstance(entry, dict):
            problems.add(f"must be an object, got {_json_type(entry)}", line=line, field=f"output[{i}]")
            continue
        answer = entry.get("answer")
        if answer is not None and not isinstance(answer, str):
            problems.add(f"must be a string, got {_json_type(answer)}", line=line, field=f"output[{i}].answer")
        elif isinstance(answer, str) and answer.strip() and answer.strip() not in answers:
            answers.append(answer.strip())
        provenance = entry.get("provenance", [])
        if not isinstance(provenance, list) or not all(isinstance(p, dict) for p in provenance):
            problems.add("must be a list of objects", line=line, field=f"output[{i}].provenance")
    passage = record.get("passage")
    if passage is not None and not isinstance(passage, str):
        problems.add(f"must be a string, got {_json_type(passage)}", line=line, field="passage")
    if len(problems) > before:
        return None
    return record_id, question.strip(), answers, output


def _kilt_candidate_passages(record: dict[str, Any], output: list[Any], pages: dict[str, list[Any]]) -> list[str]:
    """Passage texts of a record in preference order: top-level passage, provenance text, knowledge lookup."""
    texts = []
    if isinstance(record.get("passage"), str):
        texts.append(_squash_spaces(record["passage"]))
    for entry in output:
        for prov in entry.get("provenance", []):
            if isinstance(prov.get("text"), str):
                texts.append(_squash_spaces(prov["text"]))
                continue
            page = pages.get(_id_text(prov.get("wikipedia_id")) or "")
            start = prov.get("start_paragraph_id")
            if page is None or not isinstance(start, int):
                continue
            end = prov.get("end_paragraph_id")
            texts.append(_kilt_paragraphs_text(page, start, end if isinstance(end, int) and end >= start else start))
    return [t for t in texts if t]


def import_kilt_nq(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    seed: int = 0,
    knowledge: str | os.PathLike[str] | None = None,
    stats: Counter[str] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list[BaseItem]:
    """Single-document base items from KILT NaturalQuestions JSONL, curated as in the paper (App. C.1).

    Accepted record: ``{"id", "input": question, "output": [{"answer": short answer, "provenance":
    [{"wikipedia_id", "start_paragraph_id", "end_paragraph_id", "text"?}]}], "passage"?}``.
    KILT keeps passage text in a separate knowledge source, so the passage is taken from, in order:
    a top-level ``passage`` string, a provenance entry's ``text``, or the paragraphs
    ``start_paragraph_id..end_paragraph_id`` of page ``wikipedia_id`` in ``knowledge`` (KILT
    knowledge-source JSONL: ``{"wikipedia_id", "text": [paragraph, ...]}``).

    Curation: an item is kept only if one of its passages contains at least one short answer
    (case-insensitive); the first such passage becomes the context and every short answer an alias
    (those found in the context first).
    The paper's second filter (all frontier models answer correctly) needs model calls and is left to
    a later stage. ``limit`` items are then drawn uniformly by ``seed`` (all when None).
    ``stats`` (optional) receives a count per outcome: kept, no_short_answer, answer_not_in_passage.
    """
    p, problems = _open_problems(path)
    parsed: list[tuple[dict[str, Any], str, str, list[str], list[Any]]] = []
    first_line_of: dict[str, int] = {}
    try:
        for line, record in _iter_json_lines(p, problems, max_line_bytes):
            parts = _kilt_record_parts(record, line, problems)
            if parts is None:
                continue
            record_id = parts[0]
            if record_id in first_line_of:
                problems.add(f"duplicate id {record_id!r} (first used on line {first_line_of[record_id]})",
                             line=line, field="id")
                continue
            first_line_of[record_id] = line
            parsed.append((record, *parts))
    except _TooManyProblems:
        pass
    problems.raise_if_any()

    pages: dict[str, list[Any]] = {}
    if knowledge is not None:
        wanted = {
            _id_text(prov.get("wikipedia_id")) or ""
            for _, _, _, _, output in parsed for entry in output for prov in entry.get("provenance", [])
        }
        pages = _load_kilt_knowledge(knowledge, wanted, max_line_bytes)

    counts: Counter[str] = Counter()
    candidates: list[BaseItem] = []
    for record, record_id, question, answers, output in parsed:
        if not answers:
            counts["no_short_answer"] += 1
            continue
        lowered = [a.casefold() for a in answers]
        context = next(
            (t for t in _kilt_candidate_passages(record, output, pages) if any(a in t.casefold() for a in lowered)),
            None,
        )
        if context is None:
            counts["answer_not_in_passage"] += 1
            continue
        # Aliases that occur in the chosen passage come first: later stages treat answers[0] as the answer.
        in_context = [a for a in answers if a.casefold() in context.casefold()]
        ordered = in_context + [a for a in answers if a not in in_context]
        candidates.append(BaseItem(id=record_id, question=question, answers=ordered, context=context))
    chosen = [candidates[i] for i in _seeded_subset(list(range(len(candidates))), limit, _stable_rng(seed, "kilt-nq"))]
    counts["kept"] = len(chosen)
    counts["not_sampled"] = len(candidates) - len(chosen)
    if stats is not None:
        stats.update(counts)
    return chosen


# ----------------------------------------------------------------- GaRAGe

# The five domains the paper sampled 20 items from (App. C.1); pass as ``domains=`` to reproduce it.
PAPER_GARAGE_DOMAINS = ("Science", "Health", "Business & Industrial", "Law & Government", "Finance")
# Low-to-moderate complexity: single facts, conditions, sets and comparisons; aggregation, multi-hop and
# post-processing-heavy questions are excluded.
DEFAULT_GARAGE_COMPLEXITY = ("Simple", "Simple w. condition", "Set", "Comparison")
# Temporally stable: the question is not time-sensitive ("Static"). GaRAGe types time-sensitive questions
# as Slow-Changing or Fast-Changing; add "Slow-Changing" to admit those.
DEFAULT_GARAGE_TYPES = ("Static",)
GARAGE_CONTEXT_SIZE = 10
GARAGE_MAX_SIGNAL = 5

_ANSWERS_LABEL = "answerthequestion"
_RELATED_LABEL = "relatedinformation"
_CITATION_PREFIX = re.compile(r"^\s*\[\d+\]\s*")
_CITATION_MARK = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")


def _norm_label(value: Any) -> str:
    """Case-, space- and punctuation-insensitive form of a label ("Multi-Hop" == "multi hop")."""
    return re.sub(r"[^0-9a-z]", "", str(value).casefold()) if value is not None else ""


def _flag(value: Any) -> bool | None:
    """GaRAGe writes yes/no flags as booleans or as strings (YES, No, true ...); None when unknown."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().casefold()
        if word.startswith(("yes", "true")) or word in ("y", "1"):
            return True
        if word.startswith(("no", "false")) or word in ("n", "0"):
            return False
    return None


def _garage_passage_text(passage: Any) -> str | None:
    text = passage.get("text") if isinstance(passage, dict) else passage
    if not isinstance(text, str):
        return None
    return _squash_spaces(_CITATION_PREFIX.sub("", text))


def _garage_labels(record: dict[str, Any], name: str, n: int, line: int, problems: _Problems) -> list[Any] | None:
    """A per-passage label list; absent means unknown for every passage; a wrong length is a problem."""
    labels = record.get(name)
    if labels is None:
        return [None] * n
    if not isinstance(labels, list):
        problems.add(f"must be a list with one label per passage, got {_json_type(labels)}", line=line, field=name)
        return None
    if len(labels) != n:
        problems.add(f"has {len(labels)} labels but grounding has {n} passages", line=line, field=name)
        return None
    return labels


@dataclass(frozen=True)
class _GarageRecord:
    """The fields of one GaRAGe record the curation needs, after structural checks."""

    sample_id: str
    question: str
    answer: str
    texts: list[str]
    correct: list[str]  # normalised evidence_correct labels, one per passage
    relevant: list[bool | None]
    cited: list[bool]
    domain: str | None
    question_valid: bool | None
    answer_validated: bool | None
    false_premise: bool | None
    time_sensitive: bool | None
    temporal_type: Any
    complexity: Any


def _garage_record(record: Any, line: int, problems: _Problems) -> _GarageRecord | None:
    if not isinstance(record, dict):
        problems.add(f"expected a JSON object, got {_json_type(record)}", line=line)
        return None
    before = len(problems)
    sample_id = _id_text(record.get("sample_id"))
    if sample_id is None:
        problems.add("missing, blank or not a string", line=line, field="sample_id")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        problems.add("missing, blank or not a string", line=line, field="question")
    answer = record.get("answer_generate")
    if answer is not None and not isinstance(answer, str):
        problems.add(f"must be a string, got {_json_type(answer)}", line=line, field="answer_generate")
    grounding = record.get("grounding")
    texts: list[str | None] = []
    if not isinstance(grounding, list):
        problems.add(f"must be a list of passages, got {_json_type(grounding)}", line=line, field="grounding")
    else:
        texts = [_garage_passage_text(p) for p in grounding]
        for i, text in enumerate(texts):
            if text is None:
                problems.add("must be a string or an object with a text string", line=line, field=f"grounding[{i}]")
    # Label lists are checked against the passages only when the passages themselves are sound.
    grounding_ok = isinstance(grounding, list) and None not in texts
    correct = _garage_labels(record, "evidence_correct", len(texts), line, problems) if grounding_ok else None
    relevant = _garage_labels(record, "evidence_relevant", len(texts), line, problems) if grounding_ok else None
    cited = _garage_labels(record, "evidence_cited", len(texts), line, problems) if grounding_ok else None
    category = record.get("question_category")
    if category is not None and not isinstance(category, str):
        problems.add(f"must be a string, got {_json_type(category)}", line=line, field="question_category")
    if len(problems) > before:
        return None
    return _GarageRecord(
        sample_id=sample_id, question=question.strip(), answer=answer or "", texts=texts,
        correct=[_norm_label(c) for c in correct], relevant=[_flag(r) for r in relevant],
        cited=[_flag(c) is True for c in cited], domain=category,
        question_valid=_flag(record.get("question_valid")),
        answer_validated=_flag(record.get("answer_validate")),
        false_premise=_flag(record.get("question_false_premise")),
        time_sensitive=_flag(record.get("question_sensitive")),
        temporal_type=record.get("question_type"),
        complexity=record.get("question_complexity"),
    )


def _garage_temporal_type(rec: _GarageRecord) -> str:
    """'Static' for questions that are not time-sensitive, else GaRAGe's question_type (e.g. Slow-Changing)."""
    if rec.time_sensitive is False or (rec.time_sensitive is None and not rec.temporal_type):
        return "Static"
    return str(rec.temporal_type or "")


def _garage_normalised_passages(rec: _GarageRecord) -> list[Passage] | None:
    """Ten passages: up to five signal ones (cited first), then the most relevant noise; None if short.

    Signal = labelled ANSWER-THE-QUESTION. Noise ranks RELATED-INFORMATION first, then passages the
    annotators marked relevant, then the rest; ties keep the dataset's (retrieval) order. The chosen
    passages are returned in their original order so position does not reveal which are signal.
    """
    indices = range(len(rec.texts))
    signal = [i for i in indices if rec.correct[i] == _ANSWERS_LABEL]
    signal.sort(key=lambda i: (not rec.cited[i], i))
    signal = signal[:GARAGE_MAX_SIGNAL]
    noise = [i for i in indices if rec.correct[i] != _ANSWERS_LABEL]
    noise.sort(key=lambda i: (rec.correct[i] != _RELATED_LABEL, rec.relevant[i] is not True, i))
    needed = GARAGE_CONTEXT_SIZE - len(signal)
    if len(noise) < needed:
        return None
    chosen = sorted(signal + noise[:needed])
    signal_set = set(signal)
    return [Passage(text=rec.texts[i], relevant=i in signal_set) for i in chosen]


def _garage_rejection(
    rec: _GarageRecord, complexity: set[str], types: set[str], domains: set[str] | None
) -> str | None:
    """The first curation rule a record fails, or None when it is eligible."""
    if rec.question_valid is not True:
        return "question_not_valid"
    if rec.answer_validated is not True:
        return "answer_not_validated"
    if rec.false_premise is True:
        return "false_premise"
    if not _squash_spaces(_CITATION_MARK.sub("", rec.answer)):
        return "no_answer"
    if _norm_label(_garage_temporal_type(rec)) not in types:
        return "temporal_type"
    if _norm_label(rec.complexity) not in complexity:
        return "complexity"
    if domains is not None and _norm_label(rec.domain) not in domains:
        return "domain"
    if len(rec.texts) < GARAGE_CONTEXT_SIZE:
        return "too_few_passages"
    if _ANSWERS_LABEL not in rec.correct:
        return "no_answering_passage"
    return None


def import_garage(
    path: str | os.PathLike[str],
    *,
    domains: Iterable[str] | None = None,
    per_domain: int | None = None,
    seed: int = 0,
    allowed_complexity: Iterable[str] = DEFAULT_GARAGE_COMPLEXITY,
    allowed_types: Iterable[str] = DEFAULT_GARAGE_TYPES,
    stats: Counter[str] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list[BaseItem]:
    """Multi-document base items from GaRAGe JSONL, curated as in the paper (App. C.1).

    Fields read: ``sample_id, question, answer_generate, answer_validate, question_valid,
    question_false_premise, question_sensitive, question_type, question_complexity, question_category,
    grounding`` (passages as strings or ``{text, ...}``, citation prefix ``[n]`` removed), and the
    per-passage lists ``evidence_correct`` (ANSWER-THE-QUESTION / RELATED-INFORMATION / UNKNOWN),
    ``evidence_relevant`` and ``evidence_cited`` (yes/no). Flags may be booleans or yes/no strings.

    Kept: valid question, validated answer, no false premise, temporal type in ``allowed_types``
    ('Static' = not time-sensitive), complexity in ``allowed_complexity``, domain in ``domains`` (all when
    None; ``PAPER_GARAGE_DOMAINS`` reproduces the paper), at least 10 passages of which at least one
    answers the question. Each kept item gets exactly 10 passages (see ``_garage_normalised_passages``);
    ``per_domain`` items per domain are then drawn by ``seed`` (all when None). Matching of labels is
    case- and punctuation-insensitive. ``stats`` (optional) receives a count per outcome.
    """
    p, problems = _open_problems(path)
    complexity = {_norm_label(c) for c in allowed_complexity}
    types = {_norm_label(t) for t in allowed_types}
    wanted_domains = None if domains is None else {_norm_label(d) for d in domains}

    counts: Counter[str] = Counter()
    eligible: list[BaseItem] = []
    first_line_of: dict[str, int] = {}
    try:
        for line, raw in _iter_json_lines(p, problems, max_line_bytes):
            rec = _garage_record(raw, line, problems)
            if rec is None:
                continue
            if rec.sample_id in first_line_of:
                problems.add(f"duplicate id {rec.sample_id!r} (first used on line {first_line_of[rec.sample_id]})",
                             line=line, field="sample_id")
                continue
            first_line_of[rec.sample_id] = line
            reason = _garage_rejection(rec, complexity, types, wanted_domains)
            passages = _garage_normalised_passages(rec) if reason is None else None
            if reason is None and passages is None:
                reason = "too_few_noise_passages"
            if reason is not None:
                counts[reason] += 1
                continue
            answer = _squash_spaces(_CITATION_MARK.sub("", rec.answer))
            eligible.append(BaseItem(id=rec.sample_id, question=rec.question, answers=[answer],
                                     passages=passages, domain=rec.domain))
    except _TooManyProblems:
        pass
    problems.raise_if_any()

    by_domain: dict[str, list[int]] = {}
    for i, item in enumerate(eligible):
        by_domain.setdefault(_norm_label(item.domain), []).append(i)
    chosen: list[int] = []
    for domain_key, indices in sorted(by_domain.items()):
        picked = _seeded_subset(indices, per_domain, _stable_rng(seed, "garage", domain_key))
        if per_domain is not None and len(indices) < per_domain:
            log.warning("GaRAGe domain %r has only %d eligible items (asked for %d)",
                        eligible[indices[0]].domain, len(indices), per_domain)
        chosen.extend(picked)
    items = [eligible[i] for i in sorted(chosen)]
    counts["kept"] = len(items)
    counts["not_sampled"] = len(eligible) - len(items)
    if stats is not None:
        stats.update(counts)
    return items
