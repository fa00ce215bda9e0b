"""KnowOrNot's JSON documents: index fingerprint, overlap audit, metrics, specs, failures, agreement.

Each is the declared shape of one file of a KnowOrNot run folder
(``tasks/knowornot/schema/artifacts.py``); ``tasks.core.json_base`` holds their base.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, RootModel

from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.json_base import Document, Rate


class IndexMeta(Document):
    """``kb.faiss.json``: what the FAISS index was built from, so an unchanged KB reuses it."""

    fingerprint: str
    embedder: str
    size: int


class OverlapLevel(Document):
    """How many kept questions have a near-duplicate among the others at one similarity threshold."""

    threshold: float
    n_overlapping: int
    overlap_rate: Rate


class SimilarPair(Document):
    """Two kept questions and how alike they are (cosine similarity of TF-IDF and of embeddings)."""

    id_a: str
    id_b: str
    question_a: str
    question_b: str
    tfidf: float
    embedding: float


class OverlapAudit(Document):
    """The duplicate-overlap audit of the kept questions (KnowOrNot paper App. D.1), computed, not annotated."""

    n_questions: int
    embedder: str
    tfidf: list[OverlapLevel]
    embedding: list[OverlapLevel]
    most_similar: list[SimilarPair]
    nearest_tfidf: list[float] = Field(
        default_factory=list, description="per kept question: its highest TF-IDF cosine to another kept question"
    )
    nearest_embedding: list[float] = Field(default_factory=list, description="the same by embedding cosine")
    n_input: int | None = Field(default=None, description="QA pairs before the diversity filters")
    removed_keyword: int | None = None
    removed_semantic: int | None = None


class KnowOrNotMetricsDocument(Document):
    """``metrics.json`` of KnowOrNot: leave-one-out rates per configuration (synthetic out-of-KB apart) and the
    diversity-filter report."""

    configurations: list[dict[str, Any]]
    filter_report: dict[str, Any]
    spec_rates: list[dict[str, Any]] = Field(
        default_factory=list, description="share of each outcome of each spec per configuration"
    )
    overlap_audit: OverlapAudit | None = None
    configurations_by_knowledge_base: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the same rates per knowledge base (multi-base runs; configurations pools them)",
    )
    synthetic_ookb: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the synthetic out-of-KB questions' rates per configuration, their own "
        "experiment (App. D.2); configurations hold the leave-one-out questions only",
    )


class EvalSpecsDocument(RootModel[list[EvalSpec]]):
    """``eval_specs.json``: the evaluation specs a KnowOrNot run applied (built-in and its config's own)."""


class StageFailures(RootModel[list[dict[str, Any]]]):
    """``stage_failures.json``: items a KnowOrNot LLM stage could not process (never dropped)."""


class AgreementDocument(Document):
    """``agreement-<spec>.json``: kappa between annotators and evaluator-vs-human agreement."""

    annotators: dict[str, Any]
    evaluator_vs_human: dict[str, Any]
    disagreements_open: list[str] = Field(
        default_factory=list, description="items labelled differently and not yet settled by a consensus pass"
    )
    evaluator_comparison: list[dict[str, Any]] = Field(
        default_factory=list,
        description="each evaluator against the human consensus: TP/TN/FP/FN, accuracy, "
        "precision, recall, F1 (App. D.3)",
    )
