"""NaturalQuestions via KILT: single-document base items curated as in the paper (App. C.1).

Two inputs: KILT's NQ file (question, short answers and the Wikipedia paragraphs that hold the
answer, as provenance) and KILT's knowledge source (one Wikipedia page per line, about 35 GB).
The questions are read first and become candidates; the knowledge source is then streamed once,
and of each page only the paragraphs a live candidate cites are cut out and checked; the page
itself is dropped at once. Memory therefore grows with the number of candidates, not pages.

Sampling: every candidate gets a rank from a seeded random permutation, and the ``n`` passing
candidates of smallest rank are the sample, which is ``n`` drawn uniformly from the candidates
that pass curation. Once ``n`` candidates pass, a candidate ranked above all of them can never
be drawn, so its pages are no longer looked at.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.textinput import decode_text
from refusalbench.tasks.refusalbench.basesets.curation import id_text, squash_spaces, stable_rng
from refusalbench.tasks.refusalbench.basesets.problems import (
    MAX_LINE_BYTES,
    Problems,
    TooManyProblems,
    json_type,
    open_problems,
)
from refusalbench.tasks.refusalbench.basesets.streaming import (
    ByteProgress,
    ProgressCallback,
    iter_json_lines,
    iter_raw_lines,
    refuse_json_array,
)
from refusalbench.tasks.refusalbench.schema.records import BaseItem

# Where a page's id sits in a knowledge-source line: near the start ({"_id": "290", "wikipedia_id": "290", ...}).
# Read from the first bytes so the lines of pages nobody cites (nearly all of them) are never parsed.
_HEAD_BYTES = 1024
_ID_VALUE = rb'\s*:\s*(?:"([0-9A-Za-z_-]*)"|(-?\d+))'
_WIKIPEDIA_ID = re.compile(rb'"wikipedia_id"' + _ID_VALUE)
_UNDERSCORE_ID = re.compile(rb'"_id"' + _ID_VALUE)

Span = tuple[str, int, int]  # (page id, first paragraph, last paragraph)


def _kilt_paragraphs_text(paragraphs: list[Any], start: int, end: int) -> str:
    """Join KILT paragraphs start..end, dropping section headings and bullet markers of the dump format."""
    parts = []
    for paragraph in paragraphs[start : end + 1]:
        if not isinstance(paragraph, str) or paragraph.startswith("Section::::"):
            continue
        parts.append(re.sub(r"^BULLET::::-?\s*", "", paragraph))
    return squash_spaces(" ".join(parts))


def _kilt_record_parts(record: Any, line: int, problems: Problems) -> tuple[str, str, list[str], list[Any]] | None:
    """(id, question, short answers, output list) of a KILT record, or None after reporting its problems."""
    if not isinstance(record, dict):
        problems.add(f"expected a JSON object, got {json_type(record)}", line=line)
        return None
    before = len(problems)
    record_id = id_text(record.get("id"))
    if record_id is None:
        problems.add("missing, blank or not a string", line=line, field="id")
    question = record.get("input")
    if not isinstance(question, str) or not question.strip():
        problems.add("missing, blank or not a string (the question)", line=line, field="input")
    output = record.get("output")
    answers: list[str] = []
    if not isinstance(output, list):
        problems.add(f"must be a list, got {json_type(output)}", line=line, field="output")
        output = []
    for i, entry in enumerate(output):
        if not isinstance(entry, dict):
            problems.add(f"must be an object, got {json_type(entry)}", line=line, field=f"output[{i}]")
            continue
        answer = entry.get("answer")
        if answer is not None and not isinstance(answer, str):
            problems.add(f"must be a string, got {json_type(answer)}", line=line, field=f"output[{i}].answer")
        elif isinstance(answer, str) and answer.strip() and answer.strip() not in answers:
            answers.append(answer.strip())
        provenance = entry.get("provenance", [])
        if not isinstance(provenance, list) or not all(isinstance(p, dict) for p in provenance):
            problems.add("must be a list of objects", line=line, field=f"output[{i}].provenance")
    passage = record.get("passage")
    if passage is not None and not isinstance(passage, str):
        problems.add(f"must be a string, got {json_type(passage)}", line=line, field="passage")
    # Each missing field added a problem above; the explicit checks narrow the types for the return.
    if len(problems) > before or record_id is None or not isinstance(question, str):
        return None
    return record_id, question.strip(), answers, output


def _kilt_sources(record: dict[str, Any], output: list[Any]) -> list[str | Span]:
    """A record's passages in preference order: top-level passage, then per provenance its text or its span."""
    sources: list[str | Span] = []
    if isinstance(record.get("passage"), str):
        sources.append(squash_spaces(record["passage"]))
    for entry in output:
        for prov in entry.get("provenance", []):
            if isinstance(prov.get("text"), str):
                source: str | Span = squash_spaces(prov["text"])
            else:
                page_id = id_text(prov.get("wikipedia_id"))
                start = prov.get("start_paragraph_id")
                if page_id is None or not isinstance(start, int) or isinstance(start, bool):
                    continue
                end = prov.get("end_paragraph_id")
                source = (page_id, start, end if isinstance(end, int) and end >= start else start)
            # Annotators often cite the same paragraph several times: check it once.
            if source and source not in sources:
                sources.append(source)
    return sources


@dataclass
class _Candidate:
    """A question with at least one short answer, waiting for a passage that contains one."""

    index: int
    item_id: str
    question: str
    answers: list[str]
    sources: list[str | Span]
    rank: int = 0
    best: tuple[int, str] | None = None  # (position in sources, text) of the most preferred passage found
    evicted: bool = False

    def offer(self, position: int, text: str) -> bool:
        """Take ``text`` as the passage if it holds a short answer and is preferred; True if newly passing."""
        if self.best is not None and self.best[0] <= position:
            return False
        folded = text.casefold()
        if not any(a.casefold() in folded for a in self.answers):
            return False
        newly = self.best is None
        self.best = (position, text)
        return newly

    def item(self) -> BaseItem:
        assert self.best is not None, "only a passing candidate (one with a passage) becomes an item"
        context = self.best[1]
        # Aliases that occur in the chosen passage come first: later stages treat answers[0] as the answer.
        in_context = [a for a in self.answers if a.casefold() in context.casefold()]
        ordered = in_context + [a for a in self.answers if a not in in_context]
        return BaseItem(id=self.item_id, question=self.question, answers=ordered, context=context)


class _Sample:
    """The ``n`` passing candidates of smallest rank so far (every passing one when ``n`` is None)."""

    def __init__(self, candidates: list[_Candidate], n: int | None):
        self.candidates = candidates
        self.n = n
        self._heap: list[tuple[int, int]] = []  # (-rank, index): the worst-ranked member on top

    def threshold(self) -> float:
        """Rank of the n-th passing candidate; nobody ranked above it can be drawn any more."""
        if self.n is None or len(self._heap) < self.n:
            return math.inf
        return -self._heap[0][0]

    def live(self, candidate: _Candidate) -> bool:
        return not candidate.evicted and candidate.rank <= self.threshold()

    def offer(self, candidate: _Candidate, position: int, text: str) -> None:
        if not candidate.offer(position, text):
            return
        heapq.heappush(self._heap, (-candidate.rank, candidate.index))
        if self.n is not None and len(self._heap) > self.n:
            _, index = heapq.heappop(self._heap)
            dropped = self.candidates[index]
            dropped.evicted, dropped.best = True, None  # its passage text is not needed any more

    def chosen(self) -> list[_Candidate]:
        return sorted((self.candidates[i] for _, i in self._heap), key=lambda c: c.index)


def _read_questions(
    path: Path, problems: Problems, progress: ByteProgress, max_line_bytes: int, counts: Counter[str]
) -> list[_Candidate]:
    """Every record with a short answer, as a candidate; all structural problems are collected."""
    refuse_json_array(path, problems)
    candidates: list[_Candidate] = []
    first_line_of: dict[str, int] = {}
    try:
        for line, record in iter_json_lines(path, problems, max_line_bytes, progress):
            parts = _kilt_record_parts(record, line, problems)
            if parts is None:
                continue
            record_id, question, answers, output = parts
            if record_id in first_line_of:
                problems.add(
                    f"duplicate id {record_id!r} (first used on line {first_line_of[record_id]})", line=line, field="id"
                )
                continue
            first_line_of[record_id] = line
            if not answers:
                counts["no_short_answer"] += 1
                continue
            candidates.append(_Candidate(len(candidates), record_id, question, answers, _kilt_sources(record, output)))
    except TooManyProblems:
        pass
    problems.raise_if_any()
    return candidates


def _head_page_id(head: bytes) -> str | None:
    match = _WIKIPEDIA_ID.search(head) or _UNDERSCORE_ID.search(head)
    if match is None:
        return None
    value = match.group(1) if match.group(1) is not None else match.group(2)
    return value.decode("ascii") or None


def _parse_page(raw: bytes, line: int, problems: Problems) -> tuple[str, list[Any]] | None:
    """(page id, paragraphs) of a knowledge-source line, or None after reporting its problem."""
    try:
        text = decode_text(raw, problems.file, first_line=line)
    except InputError as exc:
        problems.add(exc.problem, line=exc.line)
        return None
    try:
        page = json.loads(text)
    except json.JSONDecodeError as exc:
        problems.add(f"not valid JSON: {exc.msg} (column {exc.colno})", line=line)
        return None
    if not isinstance(page, dict):
        problems.add(f"expected a JSON object, got {json_type(page)}", line=line)
        return None
    page_id = id_text(page.get("wikipedia_id")) or id_text(page.get("_id"))
    if page_id is None:
        problems.add("missing or not a string (nor is _id)", line=line, field="wikipedia_id")
        return None
    paragraphs = page.get("text")
    if not isinstance(paragraphs, list):
        problems.add(f"must be a list of paragraphs, got {json_type(paragraphs)}", line=line, field="text")
        return None
    return page_id, paragraphs


def _stream_knowledge(
    path: Path,
    wanted: dict[str, list[tuple[int, int, Span]]],
    sample: _Sample,
    progress: ByteProgress,
    max_line_bytes: int,
    counts: Counter[str],
) -> None:
    """One pass over the knowledge source, offering each cited span to its candidate.

    Only lines of cited pages are parsed; every other line is checked for shape alone (one JSON
    object with an id), which is what makes a single pass over 35 GB affordable. The first bad
    line stops the import with ``FILE:LINE`` (a problem found after hours helps nobody).
    """
    problems = Problems(str(path), cap=1)
    refuse_json_array(path, problems)
    try:
        for line, raw, complete in iter_raw_lines(path, max_line_bytes, progress):
            # Only the ends of a line are looked at here: most lines are skipped, none is copied whole.
            head, tail = raw[:_HEAD_BYTES].lstrip(), raw[-64:].rstrip()
            if not head and len(raw) <= _HEAD_BYTES:
                continue
            counts["pages_read"] += 1
            page_id = _head_page_id(head)
            if page_id is not None and page_id not in wanted:
                if not complete or (head.startswith(b"{") and tail.endswith(b"}")):
                    continue
            if not complete:
                problems.add(f"line is longer than {max_line_bytes} bytes; refusing to read it", line=line)
            parsed = _parse_page(raw, line, problems)
            if parsed is None:
                continue
            spans = wanted.pop(parsed[0], None)
            if spans is None:
                continue
            live = [
                (sample.candidates[i], position, span)
                for i, position, span in spans
                if sample.live(sample.candidates[i])
            ]
            if live:
                counts["pages_kept"] += 1
            for candidate, position, (_, start, end) in live:
                sample.offer(candidate, position, _kilt_paragraphs_text(parsed[1], start, end))
            if not wanted:
                break  # every cited page seen: the rest of the file cannot matter
    except TooManyProblems:
        pass
    problems.raise_if_any()
    counts["pages_not_found"] += len(wanted)


def import_kilt_nq(
    questions: str | os.PathLike[str],
    knowledge: str | os.PathLike[str] | None = None,
    *,
    n: int | None = None,
    seed: int = 0,
    on_progress: ProgressCallback | None = None,
    stats: Counter[str] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list[BaseItem]:
    """Single-document base items from KILT NaturalQuestions, curated as in the paper (App. C.1).

    ``questions``: KILT NQ JSON lines, ``{"id", "input": question, "output": [{"answer": short
    answer, "provenance": [{"wikipedia_id", "start_paragraph_id", "end_paragraph_id", ...}]}]}``.
    ``knowledge``: KILT's knowledge source, JSON lines ``{"_id", "wikipedia_id", "wikipedia_title",
    "text": [paragraph, ...], ...}``. A passage is taken, in order of preference, from a top-level
    ``passage`` string, a provenance entry's ``text``, or paragraphs ``start..end`` of the cited
    page (section headings dropped); ``knowledge`` may be None when the passages are inline.

    Curation: an item is kept only if one of its passages contains a short answer (case-insensitive);
    the first such passage becomes the context and every short answer an alias (those found in the
    context first). The paper's second filter (all frontier models answer correctly) needs model
    calls: that is the generation's ``pretest``. ``n`` items are drawn uniformly by ``seed`` from
    those that pass (all when None), returned in file order. ``on_progress(bytes_read, total)``
    follows both files as one. ``stats`` (optional) receives: kept, no_short_answer,
    answer_not_in_passage, not_sampled (ranked beyond the sample, so possibly never checked), and
    with a knowledge source pages_read, pages_kept (pages whose paragraphs were checked) and
    pages_not_found (cited but absent from the dump).
    """
    if n is not None and n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    q_path, q_problems = open_problems(questions)
    k_path = open_problems(knowledge)[0] if knowledge is not None else None
    progress = ByteProgress([q_path] + ([k_path] if k_path else []), on_progress)
    counts: Counter[str] = Counter()

    candidates = _read_questions(q_path, q_problems, progress, max_line_bytes, counts)
    order = list(range(len(candidates)))
    stable_rng(seed, "kilt-nq").shuffle(order)
    for rank, index in enumerate(order):
        candidates[index].rank = rank
    sample = _Sample(candidates, n)
    for candidate in candidates:
        for position, source in enumerate(candidate.sources):
            if isinstance(source, str) and sample.live(candidate):
                sample.offer(candidate, position, source)

    if k_path is not None:
        # Cited spans of live candidates that could still improve on the passage they have.
        wanted: dict[str, list[tuple[int, int, Span]]] = {}
        for candidate in candidates:
            if not sample.live(candidate):
                continue
            for position, source in enumerate(candidate.sources):
                if isinstance(source, tuple) and (candidate.best is None or position < candidate.best[0]):
                    wanted.setdefault(source[0], []).append((candidate.index, position, source))
        if wanted:
            _stream_knowledge(k_path, wanted, sample, progress, max_line_bytes, counts)
    progress.finish()

    chosen = sample.chosen()
    threshold = sample.threshold()
    counts["kept"] = len(chosen)
    counts["not_sampled"] = sum(c.rank > threshold for c in candidates)
    counts["answer_not_in_passage"] = len(candidates) - len(chosen) - counts["not_sampled"]
    if stats is not None:
        stats.update(counts)
    return [c.item() for c in chosen]
