"""The JSON documents of a run folder, as typed models.

Parquet artifacts are typed by their record classes (``records.py``); the JSON ones are
typed here, so every file a run writes has one declared shape (see ``runfolder.py``).
A ratio that is undefined (no data) is NaN in memory and ``null`` on disk, hence the
``Rate`` type. Documents accept no unknown top-level keys: a producer that adds a field
has to declare it here first, which keeps the README's contract true.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

Rate = float | None  # NaN in memory, null in JSON


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- generation

class FilterDecision(Document):
    """Why the consensus filter accepted or rejected one candidate."""
    candidate_id: str
    accepted: bool
    passes: int
    fails: int
    errors: int
    reason: str


class FilterDecisions(RootModel[list[FilterDecision]]):
    """``filter_decisions.json``: one decision per verified candidate."""


class SelfEvaluation(Document):
    self_pass_rate: Rate
    cross_pass_rate: Rate
    self_evaluation_bias: Rate
    n_self: int
    n_cross: int


class VerifierKappa(Document):
    verifier_a: str
    verifier_b: str
    kappa: Rate
    n: int
    reason: str | None = None


class GVAnalysis(Document):
    """``gv_analysis.json``: the generator-verifier analysis, computed from the run's tables."""
    pass_rate_matrix: dict[str, dict[str, Rate]]
    judged_counts: dict[str, dict[str, int]]
    self_evaluation: dict[str, SelfEvaluation]
    verifier_kappa: list[VerifierKappa]
    pass_rate_by_class: dict[str, Rate]
    pass_rate_by_intensity: dict[str, Rate]
    acceptance_by_stratum: dict[str, Rate]
    funnel: dict[str, int]
    status_counts: dict[str, int]
    verdict_counts: dict[str, int]
    filter: str | None = None
    shortfalls: dict[str, Any] | list[Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- evaluation

class BootstrapSettings(Document):
    n_resamples: int
    seed: int
    level: float
    method: str


class MetricsDocument(Document):
    """``metrics.json`` of RefusalBench (DESIGN.md §6): per-model metrics and 95% intervals."""
    models: dict[str, dict[str, Rate]]
    intervals: dict[str, dict[str, list[Rate]]] = Field(default_factory=dict)
    counts: dict[str, Any] = Field(default_factory=dict)
    bootstrap: BootstrapSettings | None = None
    undefined_as: str = "null"
    generated_at: str | None = None


# ---------------------------------------------------------------- refresh rounds

class TrendFlag(Document):
    model: str
    metric: str
    previous_round: str
    round: str
    previous: float
    previous_interval: list[float]
    latest: float
    direction: str


class TrendDocument(Document):
    """``trend.json`` of a refresh round: the rounds compared and the models that moved."""
    rounds: list[str]
    flags: list[TrendFlag]
    metric: str


# ---------------------------------------------------------------- KnowOrNot

class IndexMeta(Document):
    """``kb.faiss.json``: what the FAISS index was built from, so an unchanged KB reuses it."""
    fingerprint: str
    embedder: str
    size: int


class KnowOrNotMetricsDocument(Document):
    """``metrics.json`` of KnowOrNot: rates per configuration and the diversity-filter report."""
    configurations: list[dict[str, Any]]
    filter_report: dict[str, Any]


class StageFailures(RootModel[list[dict[str, Any]]]):
    """``stage_failures.json``: items a KnowOrNot LLM stage could not process (never dropped)."""


class AgreementDocument(Document):
    """``agreement-<spec>.json``: kappa between annotators and evaluator-vs-human agreement."""
    annotators: dict[str, Any]
    evaluator_vs_human: dict[str, Any]
