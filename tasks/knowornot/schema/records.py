"""Records of the KnowOrNot pipeline: one typed row per artifact table.

Every artifact table of the pipeline is a list of one of these records; they share
``tasks.core.tables.Record`` (unknown fields are an error) so ``tasks.core.tables.arrow_schema``
and ``to_table`` / ``from_table`` map them to Parquet without a second schema. The rows keeping
a model's reply inherit its metadata from ``tasks.llm.call_fields``.

Chain of provenance: SourceDocument -> Sentence -> AtomicFact -> QAPair -> ExperimentInput
-> ExperimentOutput -> EvalOutcome / HumanLabel. Each step keeps the id of the one
before it, so any evaluation can be traced back to the sentence it came from.
QA files are read into these records by ``sources``; the evaluation spec itself is
``tasks.core.eval_spec.EvalSpec`` (shared with the RefusalBench audit and the config),
the human labels are ``tasks.core.human_labels`` (shared with the RefusalBench audit).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from refusalbench.tasks.core.tables import Record
from refusalbench.tasks.llm.call_fields import ReplyFields, TimedCallFields

# ----------------------------------------------------------------- knowledge base


class SourceDocument(Record):
    """One file of the knowledge base, as plain text."""

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
    # "per_knowledge_base": a multi-base run whose bases filtered differently (see by_knowledge_base).
    method: Literal["keyword", "semantic", "both", "none", "per_knowledge_base"]
    n_input: int
    n_kept: int
    removed_keyword: int
    removed_semantic: int
    keyword_threshold: float | None = None
    semantic_threshold: float | None = None
    kept_ids: list[str]
    removed_keyword_ids: list[str] = Field(default_factory=list)
    removed_semantic_ids: list[str] = Field(default_factory=list)
    by_knowledge_base: list[dict[str, Any]] = Field(
        default_factory=list, description="multi-base runs: each base's method, thresholds and counts"
    )


# What a multi-base run's filter report keeps of each base's own (``by_knowledge_base``).
BASE_FILTER_FIELDS = (
    "method",
    "keyword_threshold",
    "semantic_threshold",
    "n_input",
    "n_kept",
    "removed_keyword",
    "removed_semantic",
)


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
        default=None, description="the base the question belongs to in a multi-base run (ids carry it as a prefix)"
    )


class ExperimentOutput(Record, TimedCallFields):
    """The target's reply to one ExperimentInput, with the call's metadata, billing and latency."""

    experiment_id: str
    question_id: str
    target: str
    retrieval: str
    prompt: str
    ookb: bool
    response: str | None = None
    error: str | None = None


# ----------------------------------------------------------------- evaluation


class EvalOutcome(Record, ReplyFields):
    """One evaluator's outcome for one experiment under one spec, with its reply's metadata."""

    experiment_id: str
    spec: str
    evaluator: str
    outcome: str | None = Field(default=None, description="one of the spec's outcomes; None when extraction failed")
    error: str | None = None
    raw: str | None = None
