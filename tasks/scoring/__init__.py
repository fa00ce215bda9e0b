"""Scoring judged responses: the metrics of DESIGN.md §6, bootstrap intervals, breakdowns.

Pure functions over pandas/numpy; no model calls. The evaluation flow and the ``score`` CLI
both go through :func:`score_frame` and :func:`render_score_outputs`.

Where each part of the paper's Appendix D ("Detailed Evaluation Metrics") lives:

============================================  =============================================
Appendix D                                    module
============================================  =============================================
Benchmark-specific scoring: answer attempt    :mod:`.inputs` (``prepare``: decision parsed
vs refusal, judged answer correct, refusal    from the reply, ``answer_correct`` from the
correct when its category matches             judge, right code = expected code)
Core behavioural metrics: answer accuracy,    :mod:`.metrics` (``metrics_from_stats``,
refusal accuracy, FRR, MRR, refusal rate,     ``compute_metrics``)
correct refusal rate
Refusal analysis: detection F1, category      :mod:`.metrics`
accuracy, hierarchical refusal score
Calibrated Refusal Score (CRS)                :mod:`.metrics`
Expected Calibration Error (overall, answer,  :mod:`.calibration` (bins, ``ece``), summed
refusal)                                      per model in :mod:`.metrics`
Reliability diagrams                          :mod:`.breakdowns` (``calibration_table``);
                                              drawn by :mod:`refusalbench.tasks.report`
Confidence intervals (bootstrap 95%)          :mod:`.bootstrap`
Breakdowns by class, intensity, lever,        :mod:`.breakdowns`
domain, generator; confusion; champions
The whole score, its files                    :mod:`.result`, :mod:`.io`
============================================  =============================================

The GaRAGe Answer Quality Score (mean RAF over answerable items, refusals scoring 0) equals
``answer_accuracy`` here: the judge's RAF is 0 or 1 and enters as ``answer_correct``. The
GaRAGe Hybrid Score is not one of §6's metrics and is not computed.
The decisions the contract leaves open are documented in the module that makes them.
"""

from refusalbench.tasks.scoring.bootstrap import bootstrap_intervals
from refusalbench.tasks.scoring.breakdowns import (
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
from refusalbench.tasks.scoring.calibration import N_BINS, N_FLOAT_BINS, N_VERBAL_BINS, NO_BIN, bin_label
from refusalbench.tasks.scoring.inputs import (
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
from refusalbench.tasks.scoring.io import (
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
from refusalbench.tasks.scoring.metrics import COUNTS, METRICS, compute_metrics, metrics_from_stats
from refusalbench.tasks.scoring.result import ScoreResult, score_frame

__all__ = [
    "ANSWER_CODE",
    "BREAKDOWN_COLUMNS",
    "BREAKDOWN_DIMENSIONS",
    "CHAMPION_METRICS",
    "COUNTS",
    "DECISION_LABELS",
    "EXPECTED_LABELS",
    "METRICS",
    "METRICS_FILE",
    "NO_BIN",
    "N_BINS",
    "N_FLOAT_BINS",
    "N_VERBAL_BINS",
    "PREPARED_COLUMNS",
    "REQUIRED_COLUMNS",
    "TABLE_FILES",
    "LineOf",
    "ScoreResult",
    "bin_label",
    "bootstrap_intervals",
    "breakdown",
    "calibration_table",
    "class_intensity_grid",
    "compute_metrics",
    "confusion",
    "domain_champions",
    "ensure_prepared",
    "is_prepared",
    "load_score_outputs",
    "metrics_document",
    "metrics_from_stats",
    "overall_rows",
    "prepare",
    "read_judged",
    "read_metrics_json",
    "read_score",
    "refusal_rate_by_intensity",
    "render_score_outputs",
    "score_frame",
    "write_score",
]
