"""RefusalBench's JSON documents: filter decisions, G-V analysis, metrics, trend and human audit.

Each is the declared shape of one file of a RefusalBench run folder
(``tasks/refusalbench/schema/artifacts.py``); ``tasks.core.json_base`` holds their base.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, RootModel, field_validator, model_validator

from refusalbench.tasks.core.human_labels import HumanLabel
from refusalbench.tasks.core.json_base import Document, Rate

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


class VerdictConsistency(Document):
    """How often one verifier's stated verdict contradicted its own criteria (``tasks.verify``)."""

    stated: int = Field(description="verifications with a stated verdict (errors and skips excluded)")
    inconsistent: int
    inconsistency_rate: Rate
    pass_overruled: int = Field(description="stated PASS with a required criterion false: counted as FAIL")
    fail_with_all_criteria_met: int = Field(description="stated FAIL with every criterion true: stays FAIL")


class PassCount(Document):
    """Verdicts of one group of candidates: PASS out of PASS + FAIL (errors and skips excluded)."""

    passed: int
    judged: int
    pass_rate: Rate


class MatchedSelfEvaluation(SelfEvaluation):
    self_interval: list[Rate] = Field(description="Wilson 95% interval of the self pass rate")
    cross_interval: list[Rate] = Field(description="Wilson 95% interval of the cross pass rate")


class MatchedGenerator(Document):
    candidates: int
    unparsed: int = Field(description="matched candidates not parsed: counted as FAIL from every verifier")
    precheck_rejects: int = Field(
        description="matched candidates a pre-check rejected: counted as FAIL from every verifier"
    )


class MatchedSet(Document):
    """The matched-set generator-verifier comparison (paper §4.2 RQ1, Fig. 3; ``tasks.refusalbench.stages.gv_matched``)."""

    assignments: int = Field(description="assignments any generator attempted")
    matched_assignments: int = Field(description="assignments every generator attempted without a call error")
    excluded_assignments: dict[str, int]
    by_generator: dict[str, MatchedGenerator]
    unjudged: int = Field(description="(matched candidate, verifier) cells without a verdict (ERROR, SKIPPED)")
    pass_rate_matrix: dict[str, dict[str, Rate]]
    judged_counts: dict[str, dict[str, int]]
    self_evaluation: dict[str, MatchedSelfEvaluation]
    self_pass_rate: Rate = Field(description="mean self pass rate over the models that generate and verify")
    cross_pass_rate: Rate = Field(description="mean cross pass rate over the same models")
    verifier_kappa: list[VerifierKappa]
    mean_kappa: Rate = Field(description="mean of the defined pairwise kappas (off-diagonal)")
    kappa_pairs_defined: int
    criterion_failure_rates: dict[str, dict[str, Rate]] = Field(
        description="verifier -> criterion -> share judged false"
    )
    criterion_verdicts: dict[str, int] = Field(description="verdicts per verifier behind the criterion failure rates")


class GVAnalysis(Document):
    """``gv_analysis.json``: the generator-verifier analysis, computed from the run's tables."""

    pass_rate_matrix: dict[str, dict[str, Rate]]
    judged_counts: dict[str, dict[str, int]]
    self_evaluation: dict[str, SelfEvaluation]
    verifier_kappa: list[VerifierKappa]
    verifier_consistency: dict[str, VerdictConsistency] = Field(default_factory=dict)
    pass_rate_by_class: dict[str, Rate]
    pass_rate_by_intensity: dict[str, Rate]
    acceptance_by_stratum: dict[str, Rate]
    funnel: dict[str, int] = Field(description="attempted -> parsed -> prechecked -> verified -> accepted -> sampled")
    precheck_failures: dict[str, int] = Field(
        default_factory=dict, description="candidates rejected per pre-check rule"
    )
    status_counts: dict[str, int]
    verdict_counts: dict[str, int]
    filter: str | None = None
    shortfalls: dict[str, Any] | list[Any] = Field(default_factory=dict)
    # The tables behind the report's generation figures (absent from runs analysed before them).
    pass_rate_by_generator_class: dict[str, dict[str, PassCount]] = Field(
        default_factory=dict, description="generator -> perturbation class -> verdicts (paper Fig. 4)"
    )
    pass_rate_by_generator_intensity: dict[str, dict[str, PassCount]] = Field(
        default_factory=dict, description="generator -> intensity -> verdicts (paper Fig. 15)"
    )
    self_evaluation_by_class: dict[str, dict[str, SelfEvaluation]] = Field(
        default_factory=dict, description="model that generates and verifies -> class -> self vs cross (Fig. 17)"
    )
    benchmark_composition: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="benchmark items per perturbation class -> intensity (Fig. 2)"
    )
    accepted_by_generator_class: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="candidates the filter accepted, per generator -> class (Fig. 12)"
    )
    sampled_by_generator_class: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="benchmark items per generator -> class (Fig. 12)"
    )
    matched_set: MatchedSet | None = Field(
        default=None, description="the matched-set comparison, pre-check rejects counted as failures (Fig. 3)"
    )


# ---------------------------------------------------------------- evaluation


class BootstrapSettings(Document):
    n_resamples: int
    seed: int
    level: float
    method: str
    standard_error: str | None = Field(default=None, description="how ``standard_errors`` were computed")
    breakdown_intervals: str | None = Field(default=None, description="how breakdown.parquet's intervals were computed")
    unit: str | None = Field(
        default=None, description="what a resample draws: base items (clusters) with all their items"
    )
    iid: str | None = Field(default=None, description="what intervals_iid and standard_errors_iid are")


class MetricCorrelation(Document):
    """A correlation of two per-model metrics across models (NaN/null with fewer than 3 models)."""

    x: str
    y: str
    pearson: Rate
    spearman: Rate
    n: int
    models: list[str] = Field(default_factory=list)


class CoverageSummary(Document):
    """Which models were scored on too few of their rows to be ranked beside the others."""

    min_coverage: float = Field(description="the scored share of rows below which a model is incomplete")
    incomplete: dict[str, Rate] = Field(default_factory=dict, description="model -> its coverage, below min_coverage")
    no_scored_rows: list[str] = Field(default_factory=list, description="models none of whose rows could be scored")


class PairedDifference(Document):
    """One metric of one pair: model_a − model_b on the same resampled base items."""

    difference: Rate
    ci: list[Rate]
    se: Rate
    p_value: Rate
    p_adjusted: Rate = Field(description="Holm-adjusted over the pairs of this metric")
    significant: bool = Field(description="p_adjusted <= alpha")


class PairwiseComparison(Document):
    model_a: str
    model_b: str
    n_items: int = Field(description="the items both were evaluated on")
    same_items: bool
    metrics: dict[str, PairedDifference]


class PairwiseComparisons(Document):
    """The ``pairwise`` block of metrics.json (``scoring.pairwise``)."""

    metrics: list[str]
    method: str
    correction: str
    alpha: float
    level: float
    n_resamples: int
    comparisons: list[PairwiseComparison] = Field(default_factory=list)


class MetricsDocument(Document):
    """``metrics.json`` of RefusalBench: per-model metrics and 95% intervals."""

    models: dict[str, dict[str, Rate]]
    intervals: dict[str, dict[str, list[Rate]]] = Field(default_factory=dict)
    standard_errors: dict[str, dict[str, Rate]] = Field(
        default_factory=dict, description="bootstrap standard error per model and metric (paper App. G)"
    )
    intervals_iid: dict[str, dict[str, list[Rate]]] = Field(
        default_factory=dict,
        description="95% intervals with each model's rows resampled as if independent "
        "(``intervals`` resample base items)",
    )
    standard_errors_iid: dict[str, dict[str, Rate]] = Field(
        default_factory=dict, description="standard errors with rows resampled as if independent"
    )
    pairwise: PairwiseComparisons | None = Field(
        default=None,
        description="every pair of models on the same items: paired differences with cluster-bootstrap "
        "intervals and Holm-corrected p-values",
    )
    counts: dict[str, Any] = Field(default_factory=dict)
    response_distribution: dict[str, dict[str, Rate]] = Field(
        default_factory=dict,
        description="per model: share of each of the six outcomes (App. F.8) and of rows with "
        "no usable response, summing to 1",
    )
    frr_mrr_correlation: MetricCorrelation | None = None
    multi_document: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="per model with multi-document items: the multi-document metrics' counts"
    )
    calibration: dict[str, Any] | None = Field(
        default=None,
        description="where ECE came from (source: the calibration pass or the responses' own "
        "confidences), the maximum confidence (max_confidence) and per model the rows with a "
        "confidence, how many at maximum, their share and accuracy (App. F.2)",
    )
    outcomes: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="per model: rows per outcome (ok, truncated, provider_blocked, too_long, "
        "empty, call_error, parse_error, judge_error)",
    )
    outcome_treatment: dict[str, str] = Field(default_factory=dict, description="how the scoring treats each outcome")
    coverage: CoverageSummary | None = None
    bootstrap: BootstrapSettings | None = None
    undefined_as: str = "null"
    generated_at: str | None = None


# ---------------------------------------------------------------- refresh rounds


class TrendFlag(Document):
    """A significant change of one model's metric between its previous round and the latest."""

    model: str
    metric: str
    previous_round: str
    round: str
    previous: float
    previous_interval: list[Rate] = Field(default_factory=list, description="the previous round's 95% interval")
    latest: float
    direction: str = Field(description="up | down")
    better: bool | None = Field(default=None, description="whether the change is for the better; None: neither")
    difference: Rate = None
    difference_interval: list[Rate] = Field(
        default_factory=list, description="95% interval of latest - previous (independent samples)"
    )
    p_value: Rate = None
    adjusted_p_value: Rate = Field(default=None, description="Benjamini-Hochberg across every model x metric compared")


class NotCompared(Document):
    """A model of the latest round whose coverage is below evaluation.min_coverage: not compared."""

    model: str
    round: str
    coverage: Rate = Field(default=None, description="the share of its rows scored in the round")
    reason: str


class IncompleteRound(Document):
    """A round under the root that is not in the trend, and why."""

    round: str
    status: str = Field(description="round.json's status (running, failed, ...), or unrecorded")
    reason: str


class RoundError(Document):
    """What the round's size guarantees (paper, Theorem 3.1): every one of ``rounds`` rounds of ``items``
    items is within ``epsilon`` of the truth with probability 1 - ``delta``."""

    items: int
    rounds: int
    delta: float
    epsilon: float


class TrendDocument(Document):
    """``trend.json`` of a refresh round: the rounds compared, the significant changes, the incomplete rounds."""

    rounds: list[str]
    flags: list[TrendFlag]
    metric: str = Field(description="the headline metric (the trend plot's)")
    metrics: list[str] = Field(default_factory=list, description="the metrics compared")
    test: str = ""
    fdr: float | None = Field(default=None, description="false-discovery rate of the flags (config refresh.fdr)")
    comparisons: int = Field(default=0, description="models x metrics compared (the BH family)")
    untested: int = Field(
        default=0, description="models x metrics not tested: standard error 0, or too few rows scored in a round"
    )
    not_compared: list[NotCompared] = Field(
        default_factory=list, description="models whose coverage in the latest round is incomplete: not compared"
    )
    incomplete_rounds: list[IncompleteRound] = Field(default_factory=list)
    round_error: RoundError | None = None
    freshness: FreshnessDocument | None = Field(default=None, description="the round's freshness.json, when recorded")
    fingerprint_changes: list[FingerprintChange] = Field(
        default_factory=list, description="models whose provider fingerprint differs from the previous round's"
    )


class RoleCalls(Document):
    """One cache role's calls in a round, and how many of them earlier rounds' cache entries served."""

    calls: int = 0
    from_earlier_rounds: int = 0


class FingerprintChange(Document):
    """A model whose provider-reported fingerprint (system_fingerprint or served model) changed between rounds."""

    model: str
    before: list[str]
    after: list[str]


class FreshnessDocument(Document):
    """``freshness.json`` of a refresh round: how much of it is new (tasks/refusalbench/rounds/freshness.py)."""

    round_id: str
    items_total: int = Field(description="benchmark items (question + context digest)")
    items_seen_before: int = Field(description="of them, in an earlier round's benchmark under the same root")
    pairs_total: int = Field(description="(base item, lever) pairs assigned")
    pairs_seen_before: int = Field(description="of them, assigned in an earlier round")
    pool_exhausted: bool = Field(description="assignment had to repeat earlier rounds' pairs: the pool ran out")
    calls_total: int
    calls_from_earlier_rounds: int = Field(description="calls the cache served from entries an earlier round wrote")
    by_role: dict[str, RoleCalls]
    cache_policy: dict[str, str] = Field(description="role -> forever | round | ttl:<seconds>s")
    fingerprints: dict[str, list[str]] = Field(
        description="model -> its replies' fingerprints (system_fingerprint, else the served model name)"
    )


# ---------------------------------------------------------------- human audit (paper App. C.2)


class AuditLabel(HumanLabel):
    """One line of ``labels/audit.jsonl``: an annotator's verdict on one audited benchmark item.

    A human label of the ``audit`` spec whose label is PASS or FAIL, so the agreement
    functions of the KnowOrNot labels apply unchanged; ``failed_criteria`` names the
    rubric criteria the annotator found broken (only on a FAIL).
    """

    spec: str = "audit"
    failed_criteria: list[str] = Field(default_factory=list)

    @field_validator("label", mode="before")
    @classmethod
    def _pass_or_fail(cls, value: Any) -> Any:
        label = value.strip().upper() if isinstance(value, str) else value
        if label not in ("PASS", "FAIL"):
            raise ValueError("an audit label is PASS or FAIL")
        return label

    @model_validator(mode="after")
    def _criteria_only_on_fail(self) -> AuditLabel:
        if self.label == "PASS" and self.failed_criteria:
            raise ValueError("a PASS cannot name failed criteria")
        return self


class AuditPassRate(Document):
    """Pass rate of one group of audited items, with its 95% Wilson score interval."""

    value: str
    n: int
    passed: int
    pass_rate: Rate
    ci_low: Rate
    ci_high: Rate


class AuditDocument(Document):
    """``audit.json``: the human audit of generated items (paper App. C.2, Table 2 form)."""

    sample_size: int
    sampled_per_stratum: dict[str, int]
    labels_per_annotator: dict[str, int]
    item_rule: str
    interval: str
    overall: AuditPassRate
    by_class: list[AuditPassRate]
    by_intensity: list[AuditPassRate]
    by_stratum: list[AuditPassRate]
    by_annotator: list[AuditPassRate]
    failed_criteria: dict[str, int]
    annotator_agreement: dict[str, Any]
    verifier_rule: str
    verifier_agreement: dict[str, Any]


TrendDocument.model_rebuild()  # it names FreshnessDocument and FingerprintChange, declared after it
