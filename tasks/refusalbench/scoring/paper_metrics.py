"""The paper's metrics (Appendix D), each declared once, in metrics.json's order.

Single-document metrics first (answer and refusal accuracy, the false and missed refusal rates,
detection precision, recall and F1, category accuracy, the hierarchical score, CRS, ECE), then
the coverage metrics, then the multi-document (GaRAGe) ones.

``detection_f1`` is NaN when precision or recall is NaN and 0 when both are defined and 0;
``hierarchical_score`` and ``calibrated_refusal_score`` are NaN when either factor is.

Multi-document metrics: ``answer_quality_score`` = mean RAF over the answerable
multi-document items, a refusal or an unjudged answer scoring 0; ``hybrid_score`` = (sum of RAF
over answerable + right codes over unanswerable) / all multi-document items, i.e. RAF and
refusal accuracy weighted by their shares of the items; ``eligibility_rate``,
``factuality_rate``, ``raf_rate`` = the judge's scores over the answer attempts it judged
(App. F.9). All five are NaN for single-document rows.

The *coverage* metrics (declared ``coverage=True``) are ratios over every row, scored or not;
they are in metrics.json beside the others, without intervals or breakdown rows.
"""

from __future__ import annotations

import numpy as np

from refusalbench.tasks.refusalbench.scoring.calibration import ece
from refusalbench.tasks.refusalbench.scoring.row_statistics import confidence_block
from refusalbench.tasks.refusalbench.scoring.specs import MetricSpec, declare, formula_metric

declare(
    MetricSpec(
        "answer_accuracy",
        label="Answer acc.",
        title="Answer accuracy",
        numerator=("answered_correctly",),
        denominator=("n_answerable",),
        leaderboard=True,
        compared=True,
    )
)
declare(
    MetricSpec(
        "refusal_accuracy",
        label="Refusal acc.",
        title="Refusal accuracy",
        numerator=("right_code",),
        denominator=("n_unanswerable",),
        leaderboard=True,
        compared=True,
    )
)
declare(
    MetricSpec(
        "false_refusal_rate",
        label="FRR",
        title="False refusal rate",
        numerator=("answerable_refused",),
        denominator=("n_answerable",),
        higher_is_better=False,
        leaderboard=True,
        inspect_task=True,
        aliases=("frr",),
    )
)
declare(
    MetricSpec(
        "missed_refusal_rate",
        label="MRR",
        title="Missed refusal rate",
        numerator=("unanswerable_answered",),
        denominator=("n_unanswerable",),
        higher_is_better=False,
        leaderboard=True,
        inspect_task=True,
        aliases=("mrr",),
    )
)
declare(
    MetricSpec(
        "refusal_rate",
        label="Refusal rate",
        numerator=("refused",),
        denominator=("n",),
        higher_is_better=None,
        inspect_task=True,
    )
)
declare(
    MetricSpec(
        "correct_refusal_rate",
        label="Correct refusal rate",
        numerator=("unanswerable_refused",),
        denominator=("n_unanswerable",),
    )
)
declare(
    MetricSpec(
        "detection_precision",
        label="Detection precision",
        numerator=("unanswerable_refused",),
        denominator=("refused",),
    )
)
declare(
    MetricSpec(
        "detection_recall",
        label="Detection recall",
        numerator=("unanswerable_refused",),
        denominator=("n_unanswerable",),
    )
)


@formula_metric("detection_f1", label="Detection F1", of=("detection_precision", "detection_recall"), leaderboard=True)
def detection_f1(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    """Harmonic mean of detection precision and recall: 0 when both are 0, NaN when either is."""
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return np.where(np.isnan(precision) | np.isnan(recall), np.nan, f1)


declare(
    MetricSpec(
        "category_accuracy",
        label="Category acc.",
        title="Category accuracy",
        numerator=("right_code",),
        denominator=("unanswerable_refused",),
        leaderboard=True,
    )
)
declare(
    MetricSpec(
        "hierarchical_score",
        label="Hierarchical",
        title="Hierarchical score",
        formula=lambda f1, category: f1 * category,
        of=("detection_f1", "category_accuracy"),
        leaderboard=True,
    )
)
declare(
    MetricSpec(
        "calibrated_refusal_score",
        label="CRS",
        title="Calibrated refusal score",
        formula=lambda answer, refusal: (answer + refusal) / 2,
        of=("answer_accuracy", "refusal_accuracy"),
        leaderboard=True,
        compared=True,
        aliases=("crs",),
    )
)


def _stated_ece(stats: np.ndarray, scope: int | None = None) -> np.ndarray:
    """ECE of (..., N_STATS) statistics over both scopes (None), answer attempts (0) or refusals (1)."""
    block = confidence_block(stats)
    if not block[..., 0].any():  # no stated confidence in any stack (a run without them): NaN, no arithmetic
        return np.full(stats.shape[:-1], np.nan)
    return ece(block.sum(axis=-3) if scope is None else block[..., scope, :, :])


declare(
    MetricSpec(
        "ece",
        label="ECE",
        title="Expected calibration error",
        formula=_stated_ece,
        higher_is_better=False,
        leaderboard=True,
        percent=False,
        calibration=True,
    )
)
declare(
    MetricSpec(
        "ece_answer",
        label="ECE (answers)",
        title="ECE over answer attempts",
        formula=lambda stats: _stated_ece(stats, 0),
        higher_is_better=False,
        percent=False,
        calibration=True,
    )
)
declare(
    MetricSpec(
        "ece_refusal",
        label="ECE (refusals)",
        title="ECE over refusals",
        formula=lambda stats: _stated_ece(stats, 1),
        higher_is_better=False,
        percent=False,
        calibration=True,
    )
)

# ----------------------------------------------------------------- outcomes
# What became of all the rows, scored or not: a row without a usable response (truncated,
# blocked by the provider, too long for the model, empty) is left out of every metric above and
# counted in non_response_rate; a failed call or judgment in failed_rate. Coverage is the
# scored share, which the leaderboard compares with evaluation.min_coverage.

declare(
    MetricSpec(
        "coverage",
        label="Coverage",
        title="Scored share of rows",
        numerator=("n",),
        denominator=("n_rows",),
        coverage=True,
    )
)
declare(
    MetricSpec(
        "non_response_rate",
        label="No response",
        title="Non-response rate",
        numerator=("truncated", "provider_blocked", "too_long", "empty"),
        denominator=("n_rows",),
        higher_is_better=False,
        coverage=True,
    )
)
declare(
    MetricSpec(
        "truncated_rate",
        label="Truncated",
        title="Truncated rate",
        numerator=("truncated",),
        denominator=("n_rows",),
        higher_is_better=False,
        coverage=True,
    )
)
declare(
    MetricSpec(
        "blocked_rate",
        label="Blocked",
        title="Provider-blocked rate",
        numerator=("provider_blocked",),
        denominator=("n_rows",),
        higher_is_better=False,
        coverage=True,
    )
)
declare(
    MetricSpec(
        "too_long_rate",
        label="Too long",
        title="Too-long rate",
        numerator=("too_long",),
        denominator=("n_rows",),
        higher_is_better=False,
        coverage=True,
    )
)
declare(
    MetricSpec(
        "failed_rate",
        label="Failed",
        title="Failed rate (call or judge)",
        numerator=("failed",),
        denominator=("n_rows",),
        higher_is_better=False,
        coverage=True,
    )
)

declare(
    MetricSpec(
        "answer_quality_score",
        label="Answer quality",
        title="Answer quality (mean RAF)",
        numerator=("multi_raf",),
        denominator=("multi_answerable",),
        leaderboard=True,
        multi_document=True,
    )
)
declare(
    MetricSpec(
        "hybrid_score",
        label="Hybrid",
        title="Hybrid score",
        numerator=("multi_raf", "multi_right_code"),
        denominator=("multi_answerable", "multi_unanswerable"),
        leaderboard=True,
        multi_document=True,
    )
)
declare(
    MetricSpec(
        "eligibility_rate",
        label="Eligibility",
        numerator=("eligibility_1",),
        denominator=("eligibility_n",),
        multi_document=True,
    )
)
declare(
    MetricSpec(
        "factuality_rate",
        label="Factuality",
        numerator=("factuality_1",),
        denominator=("factuality_n",),
        multi_document=True,
    )
)
declare(
    MetricSpec("raf_rate", label="RAF (answers)", numerator=("raf_1",), denominator=("raf_n",), multi_document=True)
)
