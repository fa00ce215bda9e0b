"""Records of the KnowOrNot pipeline and the loaders for existing QA pairs.

Every artifact table of the pipeline is a list of one of these records; they share
``tasks.records.Record`` (unknown fields are an error) so ``tasks.records.arrow_schema``
and ``to_table`` / ``from_table`` map them to Parquet without a second schema.

Chain of provenance: Document -> Sentence -> AtomicFact -> QAPair -> ExperimentInput
-> ExperimentOutput -> EvalOutcome / HumanLabel. Each step keeps the id of the one
before it, so any evaluation can be traced back to the sentence it came from.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from refusalbench.tasks.errors import InputError, InputErrors
from refusalbench.tasks.records import Record

# ----------------------------------------------------------------- knowledge base


class Document(Record):
    doc_id: str
    path: str
    text: str = Field(description="plain text after markup removal; blocks separated by blank lines")


class Sentence(Record):
    doc_id: str
    index: int = Field(description="0-based position of the sentence within its document")
    text: str


class AtomicFact(Record):
    fact_id: str
    doc_id: str
    sentence_index: int = Field(description="index of the source sentence within the document")
    text: str


class QAPair(Record):
    id: str
    question: str
    answer: str
    source: str = Field(default="file", description="the fact_id the pair was generated from, or 'file'")
    doc_id: str | None = None
    sentence_index: int | None = None


class OOKBQuestion(Record):
    """A synthetic question meant to lie outside the knowledge base (no pair of its own)."""

    id: str
    question: str
    source: str = Field(default="synthetic", description="generator model name, or 'file'")


class HypotheticalAnswers(Record):
    """HyDE: the answers an LLM imagined for one question (they are embedded, never shown)."""

    question_id: str
    model: str
    answers: list[str]


# ----------------------------------------------------------------- diversity


class FilterReport(Record):
    method: Literal["keyword", "semantic", "both", "none"]
    n_input: int
    n_kept: int
    removed_keyword: int
    removed_semantic: int
    keyword_threshold: float | None = None
    semantic_threshold: float | None = None
    kept_ids: list[str]
    removed_keyword_ids: list[str] = Field(default_factory=list)
    removed_semantic_ids: list[str] = Field(default_factory=list)


# ----------------------------------------------------------------- experiments


class ExperimentInput(Record):
    """One question asked of one target under one retrieval strategy and system prompt."""

    experiment_id: str
    question_id: str
    target: str
    retrieval: str
    prompt: str
    k: int | None = Field(default=None, description="neighbours retrieved (RAG strategies only)")
    context_ids: list[str] = Field(description="ids of the QA pairs placed in the context, in order")
    question: str
    expected_answer: str | None = Field(default=None, description="None for synthetic out-of-KB questions")
    ookb: bool = Field(
        description="True for a synthetic out-of-KB question (context drawn from the whole KB); "
        "False for a leave-one-out question (its own pair withheld)"
    )


class ExperimentOutput(Record):
    """The target's reply to one ExperimentInput."""

    experiment_id: str
    question_id: str
    target: str
    retrieval: str
    prompt: str
    ookb: bool
    response: str | None = None
    error: str | None = None
    cached: bool = False
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None


# ----------------------------------------------------------------- evaluation

_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


class EvalSpec(Record):
    """A user-definable evaluation: what the evaluator reads, and which tagged verdicts it may give.

    ``prompt`` is the instruction text; ``prompt_template`` (optional) names a Jinja2 template
    under prompts/ that replaces it. ``input_fields`` are the experiment fields shown to the
    evaluator; a row lacking any of them (e.g. no expected answer) is not evaluated.
    """

    name: str
    tag: str
    outcomes: list[str]
    prompt: str
    prompt_template: str | None = None
    input_fields: list[str] = Field(default_factory=lambda: ["question", "response"])

    @field_validator("name", "prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("tag")
    @classmethod
    def _tag_is_a_name(cls, value: str) -> str:
        if not _TAG_NAME.fullmatch(value):
            raise ValueError(f"tag {value!r} must be a simple name (letters, digits, _ or -)")
        return value

    @field_validator("outcomes")
    @classmethod
    def _outcomes_distinct(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one outcome")
        seen: set[str] = set()
        for outcome in value:
            key = outcome.strip().lower()
            if not key:
                raise ValueError("outcomes must not be blank")
            if key in seen:
                raise ValueError(f"outcome {outcome!r} is listed twice (outcomes are case-insensitive)")
            seen.add(key)
        return value

    @field_validator("input_fields")
    @classmethod
    def _fields_present(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one input field")
        return value


class EvalOutcome(Record):
    experiment_id: str
    spec: str
    evaluator: str
    outcome: str | None = Field(default=None, description="one of the spec's outcomes; None when extraction failed")
    error: str | None = None
    raw: str | None = None
    cached: bool = False


# ----------------------------------------------------------------- human labels


class LabelItem(Record):
    """What an annotator sees for one response."""

    item_id: str = Field(description="the experiment_id of the labelled response")
    spec: str
    outcomes: list[str]
    question: str
    response: str
    expected_answer: str | None = None
    context: str | None = None


class HumanLabel(Record):
    item_id: str
    spec: str
    annotator: str
    label: str
    labelled_at: dt.datetime
    note: str | None = None


class AgreementReport(Record):
    """Agreement between two label sequences over the same items (rows of ``confusion`` = first rater)."""

    n: int
    percent_agreement: float
    kappa: float
    labels: list[str]
    confusion: list[list[int]]

    @model_validator(mode="after")
    def _square(self) -> AgreementReport:
        if len(self.confusion) != len(self.labels) or any(len(r) != len(self.labels) for r in self.confusion):
            raise ValueError("confusion matrix must be len(labels) x len(labels)")
        return self


# ----------------------------------------------------------------- QA-pair loaders

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
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(file, "file not found") from None
    except OSError as exc:
        raise InputError(file, f"cannot read file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(file, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", line=line) from None

    errors: list[InputError] = []
    pairs: list[QAPair] = []
    first_line_of: dict[str, int] = {}
    # Split on "\n" only: str.splitlines() also breaks at U+2028 and friends, which JSON
    # allows unescaped inside strings, and would misnumber or break such lines.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_QA_LINE_BYTES // 4 and len(line.encode("utf-8")) > MAX_QA_LINE_BYTES:
            errors.append(InputError(file, f"line is longer than {MAX_QA_LINE_BYTES // (1024 * 1024)} MiB; refusing to parse it",
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
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise InputError(file, "file not found") from None
    except UnicodeDecodeError:
        raise InputError(file, "not valid UTF-8") from None
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


def pairs_by_id(pairs: Iterable[QAPair]) -> dict[str, QAPair]:
    """Index pairs by id; a repeated id is a programming error upstream, so it raises."""
    out: dict[str, QAPair] = {}
    for pair in pairs:
        if pair.id in out:
            raise ValueError(f"duplicate QA pair id {pair.id!r}")
        out[pair.id] = pair
    return out


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
