"""Where QA pairs come from: a QA file (JSONL or PolicyBench JSON), or facts an LLM wrote.

``import_policybench`` checks the KnowOrNot paper's released PolicyBench files and copies
them where ``configs/paper-policybench.yaml`` reads them (``refusalbench data import policybench``).

File loaders check every line and report all problems of a file at once
(``InputErrors``, each ``FILE:LINE: field: problem``), before a run writes anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.core.textinput import human_bytes, read_text
from refusalbench.tasks.knowornot.schema.records import AtomicFact, QAPair

# ----------------------------------------------------------------- QA files

_QA_FIELDS = ("id", "question", "answer")
# Same bound as base sets: a QA pair is a sentence or two, never megabytes.
MAX_QA_LINE_BYTES = 10 * 1024 * 1024


def _text_field(
    obj: dict[str, Any], name: str, file: str, line: int | None, where: str = ""
) -> tuple[str | None, InputError | None]:
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
            errors.append(
                InputError(
                    file, f"line is longer than {human_bytes(MAX_QA_LINE_BYTES)}; refusing to read it", line=line_no
                )
            )
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
                InputError(
                    file,
                    f"duplicate id {values['id']!r} (first on line {first_line_of[values['id']]})",
                    line=line_no,
                    field="id",
                )
            )
            continue
        first_line_of[values["id"]] = line_no
        pairs.append(QAPair(id=values["id"], question=values["question"], answer=values["answer"], source="file"))
    if errors:
        raise InputErrors(errors)
    if not pairs:
        raise InputError(file, "no QA pairs in file")
    return pairs


def _element_lines(text: str, key: str) -> list[int]:
    """The line on which each element of the top-level object's ``key`` array starts (the text is
    valid JSON: ``json.loads`` read it already), so a problem in one element names its line."""
    decoder = json.JSONDecoder()
    space = re.compile(r"[\s,:]*")

    def skip(at: int) -> int:
        return space.match(text, at).end()  # type: ignore[union-attr]

    lines: list[int] = []
    at = skip(text.index("{") + 1)
    while at < len(text) and text[at] != "}":
        name, at = decoder.raw_decode(text, at)
        at = skip(at)
        if name != key or text[at] != "[":
            _, at = decoder.raw_decode(text, at)
            at = skip(at)
            continue
        lines, at = [], skip(at + 1)  # a repeated key: json.loads keeps the last, and so does this
        while text[at] != "]":
            lines.append(text.count("\n", 0, at) + 1)
            _, at = decoder.raw_decode(text, at)
            at = skip(at)
        at = skip(at + 1)
    return lines


def load_policybench(path: str | Path) -> list[QAPair]:
    """QA pairs from a PolicyBench JSON file.

    The file is one object with ``knowledge_base_identifier`` and ``questions``, a list of
    ``{question, answer, identifier}``; the identifier becomes the pair id. Problems are
    reported as ``FILE:LINE: questions[i].field: problem``, LINE where the question's object starts.
    """
    file = str(path)
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(file, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise InputError(file, "expected an object with a 'questions' list", field="questions")

    errors: list[InputError] = []
    pairs: list[QAPair] = []
    seen: set[str] = set()
    lines = _element_lines(text, "questions")
    for i, item in enumerate(data["questions"]):
        where, line = f"questions[{i}].", lines[i] if i < len(lines) else None
        if not isinstance(item, dict):
            errors.append(
                InputError(file, f"expected an object, got {type(item).__name__}", line=line, field=f"questions[{i}]")
            )
            continue
        values: dict[str, str] = {}
        for name in ("identifier", "question", "answer"):
            value, err = _text_field(item, name, file, line, where)
            if err is not None:
                errors.append(err)
            elif value is not None:
                values[name] = value
        if len(values) != 3:
            continue
        if values["identifier"] in seen:
            errors.append(
                InputError(
                    file, f"duplicate identifier {values['identifier']!r}", line=line, field=f"{where}identifier"
                )
            )
            continue
        seen.add(values["identifier"])
        pairs.append(
            QAPair(id=values["identifier"], question=values["question"], answer=values["answer"], source="file")
        )
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


# ----------------------------------------------------------------- the released PolicyBench

# The KnowOrNot paper's released question sets (§4, App. C), already through its diversity
# filters: file name -> questions in the release (331 in all).
POLICYBENCH_FILES = {
    "BTT_QA.json": 55,
    "CPF_filtered_qa.json": 112,
    "ICA_filtered_qa.json": 135,
    "medishield_QA.json": 29,
}


def policybench_import_hint(out_dir: str) -> str:
    """The command that puts the released PolicyBench files where a config reads them."""
    return f"import the released PolicyBench files first: refusalbench data import policybench DIR --out {out_dir}"


def import_policybench(source_dir: str | Path, out_dir: str | Path) -> dict[str, int]:
    """Check the released PolicyBench files in ``source_dir`` and copy them, unchanged, to ``out_dir``.

    Every file is read through ``load_policybench`` first (all problems of all files raised
    together, ``FILE:LINE: field: problem``), so a bad source writes nothing; each copy goes
    through a temporary file and a rename. Returns the questions per file.
    """
    source, out = Path(source_dir), Path(out_dir)
    if not source.is_dir():
        raise InputError(str(source), "not a folder (give the folder that holds the released PolicyBench files)")
    errors: list[InputError] = []
    counts: dict[str, int] = {}
    for name in POLICYBENCH_FILES:
        path = source / name
        if not path.is_file():
            errors.append(InputError(str(path), f"file not found (the release has {', '.join(POLICYBENCH_FILES)})"))
            continue
        try:
            counts[name] = len(load_policybench(path))
        except InputErrors as exc:
            errors += exc.errors
        except InputError as exc:
            errors.append(exc)
    if errors:
        raise InputErrors(errors)
    if out.resolve() == source.resolve():
        raise InputError(str(out), "the output folder is the source folder", field="--out")
    out.mkdir(parents=True, exist_ok=True)
    for name in POLICYBENCH_FILES:
        partial = out / f".{name}.partial"
        partial.write_bytes((source / name).read_bytes())
        partial.replace(out / name)
    return counts


# ----------------------------------------------------------------- pairs from facts


def make_atomic_facts(
    doc_id: str, n_sentences: int, extracted: Sequence[tuple[int, str]]
) -> tuple[list[AtomicFact], list[str]]:
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
        facts.append(
            AtomicFact(fact_id=f"{doc_id}-s{index}-f{n}", doc_id=doc_id, sentence_index=index, text=text.strip())
        )
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
