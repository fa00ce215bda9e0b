"""Where QA pairs come from: a QA file (JSONL or PolicyBench JSON), or facts an LLM wrote.

File loaders check every line and report all problems of a file at once
(``InputErrors``, each ``FILE:LINE: field: problem``), before a run writes anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.core.textinput import human_bytes, read_text
from refusalbench.tasks.knowornot.records import AtomicFact, QAPair

# ----------------------------------------------------------------- QA files

_QA_FIELDS = ("id", "question", "answer")
# Same bound as base sets: a QA pair is a sentence or two, never megabytes.
MAX_QA_LINE_BYTES = 10 * 1024 * 1024


def _text_field(obj: dict[str, Any], name: str, file: str, line: int | None, where: str = "") -> tuple[str | None, InputError | None]:
    label = f"{where}{name}"
    if name not in obj:
        return None, InputError(file, "missing", line=line, field=label)
    value = obj[name]
    if not isinstance(value, str):
        return None, InputError(file, f"must be a string, got {type(value).__name__}", line=line, field=label)
    if not value.strip():
        return None, InputError(file, "must not be blank", line=line, field=label)
    return value.strip(), None


def load_qa_jsonl(path: str | Path) -> list[QAPair]:
    """QA pairs from JSONL, one ``{"id", "question", "answer"}`` object per line.

    Blank lines are skipped. Every problem in the file is collected and raised together
    as ``InputErrors`` (each ``FILE:LINE: field: problem``): unreadable or non-UTF-8 file,
    invalid JSON, a line that is not an object, a missing/non-string/blank field, an
    unknown field, a duplicate id, or no pairs at all.
    """
    file = str(path)
    text = read_text(path)

    errors: list[InputError] = []
    pairs: list[QAPair] = []
    first_line_of: dict[str, int] = {}
    # Split on "\n" only: str.splitlines() also breaks at U+2028 and friends, which JSON
    # allows unescaped inside strings, and would misnumber or break such lines.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_QA_LINE_BYTES // 4 and len(line.encode("utf-8")) > MAX_QA_LINE_BYTES:
            errors.append(InputError(file, f"line is longer than {human_bytes(MAX_QA_LINE_BYTES)}; refusing to read it",
                                     line=line_no))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(InputError(file, f"invalid JSON: {exc.msg} (column {exc.colno})", line=line_no))
            continue
        if not isinstance(obj, dict):
            errors.append(InputError(file, f"expected a JSON object, got {type(obj).__name__}", line=line_no))
            continue
        values: dict[str, str] = {}
        for name in _QA_FIELDS:
            value, err = _text_field(obj, name, file, line_no)
            if err is not None:
                errors.append(err)
            elif value is not None:
                values[name] = value
        for name in sorted(set(obj) - set(_QA_FIELDS)):
            errors.append(InputError(file, "unknown field (expected id, question, answer)", line=line_no, field=name))
        if len(values) != len(_QA_FIELDS):
            continue
        if values["id"] in first_line_of:
            errors.append(
                InputError(file, f"duplicate id {values['id']!r} (first on line {first_line_of[values['id']]})", line=line_no, field="id")
            )
            continue
        first_line_of[values["id"]] = line_no
        pairs.append(QAPair(id=values["id"], question=values["question"], answer=values["answer"], source="file"))
    if errors:
        raise InputErrors(errors)
    if not pairs:
        raise InputError(file, "no QA pairs in file")
    return pairs


def load_policybench(path: str | Path) -> list[QAPair]:
    """QA pairs from a PolicyBench JSON file.

    The file is one object with ``knowledge_base_identifier`` and ``questions``, a list of
    ``{question, answer, identifier}``; the identifier becomes the pair id. Problems are
    reported as ``FILE: questions[i].field: problem`` (JSON has no useful line here).
    """
    file = str(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(file, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise InputError(file, "expected an object with a 'questions' list", field="questions")

    errors: list[InputError] = []
    pairs: list[QAPair] = []
    seen: set[str] = set()
    for i, item in enumerate(data["questions"]):
        where = f"questions[{i}]."
        if not isinstance(item, dict):
            errors.append(InputError(file, f"expected an object, got {type(item).__name__}", field=f"questions[{i}]"))
            continue
        values: dict[str, str] = {}
        for name in ("identifier", "question", "answer"):
            value, err = _text_field(item, name, file, None, where)
            if err is not None:
                errors.append(err)
            elif value is not None:
                values[name] = value
        if len(values) != 3:
            continue
        if values["identifier"] in seen:
            errors.append(InputError(file, f"duplicate identifier {values['identifier']!r}", field=f"{where}identifier"))
            continue
        seen.add(values["identifier"])
        pairs.append(QAPair(id=values["identifier"], question=values["question"], answer=values["answer"], source="file"))
    if errors:
        raise InputErrors(errors)
    if not pairs:
        raise InputError(file, "no questions in file", field="questions")
    return pairs


def load_qa_pairs(path: str | Path) -> list[QAPair]:
    """QA pairs from ``.jsonl`` (id/question/answer per line) or ``.json`` (PolicyBench layout)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".jsonl":
        return load_qa_jsonl(path)
    if suffix == ".json":
        return load_policybench(path)
    raise InputError(str(path), f"unsupported QA file type {suffix or '(none)'!r} (expected .jsonl or .json)")


# ----------------------------------------------------------------- pairs from facts


def make_atomic_facts(doc_id: str, n_sentences: int, extracted: Sequence[tuple[int, str]]) -> tuple[list[AtomicFact], list[str]]:
    """Turn an LLM's ``(sentence_index, fact)`` list for one document into AtomicFacts.

    Facts citing a sentence index outside ``[0, n_sentences)`` or with blank text are dropped
    and described in the returned problem list (the LLM is not trusted to cite correctly).
    Fact ids are ``{doc_id}-s{sentence}-f{n}``, n counting facts of that sentence.
    """
    facts: list[AtomicFact] = []
    problems: list[str] = []
    per_sentence: dict[int, int] = {}
    for index, text in extracted:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n_sentences:
            problems.append(f"{doc_id}: fact cites sentence {index!r}, outside 0..{n_sentences - 1}")
            continue
        if not text or not text.strip():
            problems.append(f"{doc_id}: blank fact for sentence {index}")
            continue
        n = per_sentence.get(index, 0)
        per_sentence[index] = n + 1
        facts.append(AtomicFact(fact_id=f"{doc_id}-s{index}-f{n}", doc_id=doc_id, sentence_index=index, text=text.strip()))
    return facts, problems


def qa_pair_from_fact(fact: AtomicFact, question: str, answer: str) -> QAPair:
    """The QA pair an LLM wrote for one fact, keeping the fact's provenance (id = fact id)."""
    if not question.strip() or not answer.strip():
        raise ValueError(f"blank question or answer for fact {fact.fact_id}")
    return QAPair(
        id=fact.fact_id,
        question=question.strip(),
        answer=answer.strip(),
        source=fact.fact_id,
        doc_id=fact.doc_id,
        sentence_index=fact.sentence_index,
    )
