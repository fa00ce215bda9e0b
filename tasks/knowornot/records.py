"""Records of the KnowOrNot pipeline: one typed row per artifact table.

Every artifact table of the pipeline is a list of one of these records; they share
``tasks.records.Record`` (unknown fields are an error) so ``tasks.records.arrow_schema``
and ``to_table`` / ``from_table`` map them to Parquet without a second schema.

Chain of provenance: Document -> Sentence -> AtomicFact -> QAPair -> ExperimentInput
-> ExperimentOutput -> EvalOutcome / HumanLabel. Each step keeps the id of the one
before it, so any evaluation can be traced back to the sentence it came from.
QA files are read into these records by ``sources``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from refusalbench.tasks.core.records import Record

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
    knowledge_base: str | None = Field(
        default=None, description="the base the question belongs to in a multi-base run (ids carry it as a prefix)")


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


EVAL_INPUT_FIELDS = ("question", "response", "expected_answer", "context")


class EvalSpec(Record):
    """A user-definable evaluation: what the evaluator reads, and which tagged verdicts it may give.

    ``prompt`` is the instruction text; ``prompt_template`` (optional) names a Jinja2 template
    under prompts/ that replaces it. ``input_fields`` are the experiment fields shown to the
    evaluator; a row lacking any of them (e.g. no expected answer) is not evaluated.
    ``applies_to`` says which responses are judged: every one, or only those the abstention
    spec judged as answered (the paper's factuality is defined on those alone).
    """

    name: str
    tag: str
    outcomes: list[str] = Field(validation_alias=AliasChoices("outcomes", "values"),
                                description="the verdicts allowed inside the tag (config key: outcomes or values)")
    prompt: str
    prompt_template: str | None = None
    input_fields: list[str] = Field(default_factory=lambda: ["question", "response"],
                                    description=f"shown to the evaluator, from: {', '.join(EVAL_INPUT_FIELDS)}")
    applies_to: Literal["all", "answered"] = Field(
        default="all", description="'all' responses, or only those the abstention spec judged answered")

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
        unknown = [f for f in value if f not in EVAL_INPUT_FIELDS]
        if unknown:
            raise ValueError(f"unknown input field(s) {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(EVAL_INPUT_FIELDS)})")
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
