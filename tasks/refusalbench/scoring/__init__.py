"""Scoring judged responses: the per-model metrics (paper App. D), bootstrap intervals, breakdowns.

Pure functions over pandas/numpy; no model calls. The evaluation flow and the ``score`` CLI
both go through :func:`score_frame` and :func:`render_score_outputs`.

Where each part of the paper's Appendix D ("Detailed Evaluation Metrics") lives:

============================================  =============================================
Appendix D                                    module
============================================  =============================================
Benchmark-specific scoring: answer attempt    :mod:`.inputs` (``prepare``: decision parsed
vs refusal, judged answer correct, refusal    from the reply, ``answer_correct`` from the
correct when its category matches; GaRAGe's   judge, right code = expected code; optional
eligibility, factuality, RAF                  ``raf``, ``eligibility``, ``factuality``,
                                              ``variant``)
Core behavioural metrics: answer accuracy,    :mod:`.metrics` (``metrics_from_stats``,
refusal accuracy, FRR, MRR, refusal rate,     ``compute_metrics``)
correct refusal rate
Answer Quality Score, Hybrid Score (GaRAGe)   :mod:`.metrics` (``multi_document=True``)
Refusal analysis: detection F1, category      :mod:`.metrics`
accuracy, hierarchical refusal score
Calibrated Refusal Score (CRS)                :mod:`.metrics`
Expected Calibration Error (overall, answer,  :mod:`.calibration` (bins, ``ece``), summed
refusal)                                      per model in :mod:`.metrics`
Reliability diagrams                          :mod:`.breakdowns` (``calibration_table``);
                                              drawn by :mod:`refusalbench.tasks.refusalbench.report`
Confidence intervals (bootstrap 95%) and      :mod:`.bootstrap` (per model);
standard errors (App. G)                      :mod:`.intervals` (per breakdown row);
                                              base items resampled: :mod:`.clusters`
Which models differ (pairwise, Holm)          :mod:`.pairwise`
Breakdowns by class, intensity, lever,        :mod:`.breakdowns`
domain, generator; confusion; champions
Response distribution (App. F.8), FRR-MRR     :mod:`.summary`
correlation (§4.2), multi-document counts
The whole score, its files                    :mod:`.result`, :mod:`.io`
============================================  =============================================

The multi-document metrics are NaN on single-document rows, never 0.
The decisions the contract leaves open are documented in the module that makes them.
"""

from refusalbench.tasks.refusalbench.scoring.bootstrap import (
    bootstrap_figures,
    bootstrap_intervals,
    bootstrap_standard_errors,
    bootstrap_summary,
)
from refusalbench.tasks.refusalbench.scoring.breakdowns import (
    BREAKDOWN_COLUMNS,
    CHAMPION_METRICS,
    breakdown,
    calibration_table,
    class_intensity_grid,
    confusion,
    domain_champions,
    overall_rows,
    refusal_rate_by_intensity,
)
from refusalbench.tasks.refusalbench.scoring.calibration import N_BINS, N_FLOAT_BINS, N_VERBAL_BINS, NO_BIN, bin_label
from refusalbench.tasks.refusalbench.scoring.inputs import (
    ANSWER_CODE,
    BREAKDOWN_DIMENSIONS,
    DECISION_LABELS,
    EXPECTED_LABELS,
    PREPARED_COLUMNS,
    REQUIRED_COLUMNS,
    LineOf,
    ensure_prepared,
    is_prepared,
    prepare,
)
from refusalbench.tasks.refusalbench.scoring.io import (
    METRICS_FILE,
    TABLE_FILES,
    load_score_outputs,
    metrics_document,
    read_judged,
    read_metrics_json,
    read_score,
    render_score_outputs,
    write_score,
)
from refusalbench.tasks.refusalbench.scoring.metrics import compute_metrics, metrics_from_stats, run_metrics
from refusalbench.tasks.refusalbench.scoring.pairwise import PAIRWISE_METRICS, pairwise_comparisons
from refusalbench.tasks.refusalbench.scoring.result import ScoreResult, score_frame
from refusalbench.tasks.refusalbench.scoring.row_statistics import COUNTS
from refusalbench.tasks.refusalbench.scoring.specs import (
    METRIC_SPECS,
    MetricSpec,
    all_metrics,
    coverage_metrics,
    declare,
    formula_metric,
    metric_spec,
    multi_document_metrics,
    single_document_metrics,
)
from refusalbench.tasks.refusalbench.scoring.summary import (
    OUTCOME_TREATMENT,
    OUTCOMES,
    correlation,
    frr_mrr_correlation,
    multi_document_counts,
    outcome_counts_by_model,
    response_distribution,
)

__all__ = [
    "ANSWER_CODE",
    "BREAKDOWN_COLUMNS",
    "BREAKDOWN_DIMENSIONS",
    "CHAMPION_METRICS",
    "COUNTS",
    "DECISION_LABELS",
    "EXPECTED_LABELS",
    "METRICS_FILE",
    "METRIC_SPECS",
    "NO_BIN",
    "N_BINS",
    "N_FLOAT_BINS",
    "N_VERBAL_BINS",
    "OUTCOMES",
    "OUTCOME_TREATMENT",
    "PAIRWISE_METRICS",
    "PREPARED_COLUMNS",
    "REQUIRED_COLUMNS",
    "TABLE_FILES",
    "LineOf",
    "MetricSpec",
    "ScoreResult",
    "all_metrics",
    "bin_label",
    "bootstrap_figures",
    "bootstrap_intervals",
    "bootstrap_standard_errors",
    "bootstrap_summary",
    "breakdown",
    "calibration_table",
    "class_intensity_grid",
    "compute_metrics",
    "confusion",
    "correlation",
    "coverage_metrics",
    "declare",
    "domain_champions",
    "ensure_prepared",
    "formula_metric",
    "frr_mrr_correlation",
    "is_prepared",
    "load_score_outputs",
    "metric_spec",
    "metrics_document",
    "metrics_from_stats",
    "multi_document_counts",
    "multi_document_metrics",
    "outcome_counts_by_model",
    "overall_rows",
    "pairwise_comparisons",
    "prepare",
    "read_judged",
    "read_metrics_json",
    "read_score",
    "refusal_rate_by_intensity",
    "render_score_outputs",
    "response_distribution",
    "run_metrics",
    "score_frame",
    "single_document_metrics",
    "write_score",
]
