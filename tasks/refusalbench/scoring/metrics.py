"""The per-model metrics of DESIGN.md §6 (the paper's Appendix D) from sufficient statistics.

How it stays fast at a million rows: every metric is a ratio of sums of per-row indicators
(ECE too, see :mod:`.calibration`). So one vector of *sufficient statistics* per model (or
per model × group, or per bootstrap resample) is computed with ``np.bincount``, and
:func:`metrics_from_stats` turns any stack of such vectors into metrics.

Most metrics are proportions (:data:`PROPORTIONS`: a count over a count), which lets the
breakdowns give them Wilson intervals; the rest (:data:`COMPOSITES`) are built from them.

Undefined ratios are NaN, never 0. ``detection_f1`` is NaN when precision or recall is NaN
and 0 when both are defined and 0; ``hierarchical_score`` and ``calibrated_refusal_score``
are NaN when either factor is.

Multi-document (GaRAGe) metrics, Appendix D: ``answer_quality_score`` = mean RAF over the
answerable multi-document items, a refusal or an unjudged answer scoring 0;
``hybrid_score`` = (Σ RAF over answerable + right codes over unanswerable) / all
multi-document items, i.e. RAF and refusal accuracy weighted by their shares of the items;
``eligibility_rate``, ``factuality_rate``, ``raf_rate`` = the judge's scores over the answer
attempts it judged (App. F.9). All five are NaN for single-document rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.refusalbench.scoring.calibration import N_BINS, ece
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared

METRICS: tuple[str, ...] = (
    "answer_accuracy",
    "refusal_accuracy",
    "false_refusal_rate",
    "missed_refusal_rate",
    "refusal_rate",
    "correct_refusal_rate",
    "detection_precision",
    "detection_recall",
    "detection_f1",
    "category_accuracy",
    "hierarchical_score",
    "calibrated_refusal_score",
    "ece",
    "ece_answer",
    "ece_refusal",
)
# GaRAGe's metrics (App. D, F.9): they need a multi-document judge, NaN on single-document rows.
MULTI_DOCUMENT_METRICS: tuple[str, ...] = (
    "answer_quality_score", "hybrid_score", "eligibility_rate", "factuality_rate", "raf_rate")
ALL_METRICS: tuple[str, ...] = METRICS + MULTI_DOCUMENT_METRICS
COUNTS: tuple[str, ...] = ("n", "n_answerable", "n_unanswerable", "n_confidence", "n_unjudged")

# Sufficient statistics, in this order, then the confidence block
# [scope (0 answer attempts, 1 refusals)][bin][count, sum correct, sum confidence].
_BASE_STATS: tuple[str, ...] = (
    "n",
    "n_answerable",
    "n_unanswerable",
    "answered_correctly",
    "right_code",
    "refused",
    "answerable_refused",
    "unanswerable_refused",
    "unanswerable_answered",
    "n_unjudged",
    # multi-document rows (GaRAGe): items, Σ RAF on answerable (refusals 0), right codes
    "multi_answerable",
    "multi_unanswerable",
    "multi_raf",
    "multi_right_code",
    # the judge's 0/1 scores over judged answer attempts: how many judged, how many 1
    "eligibility_n",
    "eligibility_1",
    "factuality_n",
    "factuality_1",
    "raf_n",
    "raf_1",
)
_N_BASE = len(_BASE_STATS)
STAT_INDEX: dict[str, int] = {name: i for i, name in enumerate(_BASE_STATS)}

# metric -> (numerator stats, denominator stats), each summed: the metric is their ratio.
PROPORTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "answer_accuracy": (("answered_correctly",), ("n_answerable",)),
    "refusal_accuracy": (("right_code",), ("n_unanswerable",)),
    "false_refusal_rate": (("answerable_refused",), ("n_answerable",)),
    "missed_refusal_rate": (("unanswerable_answered",), ("n_unanswerable",)),
    "refusal_rate": (("refused",), ("n",)),
    "correct_refusal_rate": (("unanswerable_refused",), ("n_unanswerable",)),
    "detection_precision": (("unanswerable_refused",), ("refused",)),
    "detection_recall": (("unanswerable_refused",), ("n_unanswerable",)),
    "category_accuracy": (("right_code",), ("unanswerable_refused",)),
    "answer_quality_score": (("multi_raf",), ("multi_answerable",)),
    "hybrid_score": (("multi_raf", "multi_right_code"), ("multi_answerable", "multi_unanswerable")),
    "eligibility_rate": (("eligibility_1",), ("eligibility_n",)),
    "factuality_rate": (("factuality_1",), ("factuality_n",)),
    "raf_rate": (("raf_1",), ("raf_n",)),
}
COMPOSITES: tuple[str, ...] = tuple(m for m in ALL_METRICS if m not in PROPORTIONS)
_N_STATS = _N_BASE + 2 * N_BINS * 3


def _score_flags(df: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(judged, score is 1) of an optional 0/1 judge column (NaN = not judged)."""
    if column not in df:
        return np.zeros(len(df), dtype=bool), np.zeros(len(df), dtype=bool)
    values = df[column].to_numpy(dtype=np.float64)
    return ~np.isnan(values), values == 1


def row_arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The per-row indicators of a prepared frame that the statistics are summed from."""
    eligibility_has, eligibility = _score_flags(df, "eligibility")
    factuality_has, factuality = _score_flags(df, "factuality")
    raf_has, raf = _score_flags(df, "raf")
    return {
        "multi": df["multi"].to_numpy(dtype=bool) if "multi" in df else np.zeros(len(df), dtype=bool),
        "eligibility_has": eligibility_has, "eligibility": eligibility,
        "factuality_has": factuality_has, "factuality": factuality,
        "raf_has": raf_has, "raf": raf,
        "answerable": df["answerable"].to_numpy(dtype=bool),
        "refused": df["refused"].to_numpy(dtype=bool),
        "answered_correctly": df["answered_correctly"].to_numpy(dtype=bool),
        "right_code": df["right_code"].to_numpy(dtype=bool),
        "correct": df["correct"].to_numpy(dtype=bool),
        "unjudged": df["answer_unjudged"].to_numpy(dtype=bool) if "answer_unjudged" in df
        else np.zeros(len(df), dtype=bool),
        "conf_value": df["confidence_value"].to_numpy(dtype=np.float64),
        "conf_bin": df["confidence_bin"].to_numpy(dtype=np.int64),
    }


def sufficient_stats(groups: np.ndarray, n_groups: int, rows: Mapping[str, np.ndarray],
                     weights: np.ndarray | None = None) -> np.ndarray:
    """(n_groups × _N_STATS) sums of the row indicators per group.

    ``weights`` (one per row) lets the same code build per-type statistics.
    """
    w = np.ones(len(groups)) if weights is None else weights
    answerable, refused = rows["answerable"], rows["refused"]

    def total(mask: np.ndarray) -> np.ndarray:
        if not mask.any():  # the multi-document sums are all zero on single-document runs
            return np.zeros(n_groups)
        return np.bincount(groups, weights=w * mask, minlength=n_groups)

    multi = rows["multi"]
    attempt = answerable & ~refused  # answer attempts on answerable items: what the judge scores

    base = [
        np.bincount(groups, weights=w, minlength=n_groups),
        total(answerable),
        total(~answerable),
        total(rows["answered_correctly"]),
        total(rows["right_code"]),
        total(refused),
        total(answerable & refused),
        total(~answerable & refused),
        total(~answerable & ~refused),
        total(rows["unjudged"]),
        total(multi & answerable),
        total(multi & ~answerable),
        total(multi & rows["answered_correctly"]),
        total(multi & rows["right_code"]),
        *(total(attempt & rows[name + suffix])
          for name in ("eligibility", "factuality", "raf") for suffix in ("_has", "")),
    ]
    stats = np.zeros((n_groups, _N_STATS))
    stats[:, :_N_BASE] = np.stack(base, axis=1) if n_groups else stats[:, :_N_BASE]
    has = rows["conf_bin"] >= 0
    if has.any():
        cell = (refused[has].astype(np.int64) * N_BINS + rows["conf_bin"][has])
        key = groups[has] * (2 * N_BINS) + cell
        size = n_groups * 2 * N_BINS
        wh = w[has]
        block = np.stack(
            [
                np.bincount(key, weights=wh, minlength=size),
                np.bincount(key, weights=wh * rows["correct"][has], minlength=size),
                np.bincount(key, weights=wh * rows["conf_value"][has], minlength=size),
            ],
            axis=1,
        )  # (size × 3), row = group*30 + scope*15 + bin
        stats[:, _N_BASE:] = block.reshape(n_groups, 2 * N_BINS * 3)
    return stats


def confidence_block(stats: np.ndarray) -> np.ndarray:
    """The confidence part of (..., _N_STATS) statistics as (..., scope, bin, [count, correct, conf])."""
    return stats[..., _N_BASE:].reshape(*stats.shape[:-1], 2, N_BINS, 3)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _sum(stats: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    return sum(stats[..., STAT_INDEX[name]] for name in names)


def proportion_parts(stats: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) of a proportion metric from (..., _N_STATS) statistics."""
    numerator, denominator = PROPORTIONS[metric]
    return _sum(stats, numerator), _sum(stats, denominator)


def metrics_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric (:data:`ALL_METRICS`) from a stack (..., _N_STATS) of sufficient statistics."""
    values = {name: _ratio(*proportion_parts(stats, name)) for name in PROPORTIONS}
    precision, recall = values["detection_precision"], values["detection_recall"]
    with np.errstate(divide="ignore", invalid="ignore"):
        # Both defined and both 0 -> 0; NaN propagates from an undefined side.
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    f1 = np.where(np.isnan(precision) | np.isnan(recall), np.nan, f1)
    ece_block = confidence_block(stats)
    values.update({
        "detection_f1": f1,
        "hierarchical_score": f1 * values["category_accuracy"],
        "calibrated_refusal_score": (values["answer_accuracy"] + values["refusal_accuracy"]) / 2,
        "ece": ece(ece_block.sum(axis=-3)),
        "ece_answer": ece(ece_block[..., 0, :, :]),
        "ece_refusal": ece(ece_block[..., 1, :, :]),
    })
    return {name: values[name] for name in ALL_METRICS}


def _counts_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "n": stats[..., 0],
        "n_answerable": stats[..., 1],
        "n_unanswerable": stats[..., 2],
        "n_confidence": confidence_block(stats)[..., 0].sum(axis=(-1, -2)),
        "n_unjudged": stats[..., _BASE_STATS.index("n_unjudged")],
    }


def model_codes(df: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """(row -> model index, model names sorted): the grouping key of every per-model result."""
    codes, models = pd.factorize(df["model"], sort=True)
    return codes.astype(np.int64), [str(m) for m in models]


def run_metrics(df: pd.DataFrame) -> tuple[str, ...]:
    """The metrics a prepared frame is scored on: §6's, plus GaRAGe's when it has multi-document rows."""
    has_multi = "multi" in df and bool(df["multi"].to_numpy(dtype=bool).any())
    return ALL_METRICS if has_multi else METRICS


def model_stats(df: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """(models sorted, their sufficient statistics (models × _N_STATS)) of a prepared frame."""
    codes, models = model_codes(df)
    return models, sufficient_stats(codes, len(models), row_arrays(df))


def compute_metrics(df: pd.DataFrame, names: Sequence[str] | None = None,
                    per_model: tuple[list[str], np.ndarray] | None = None) -> dict[str, dict[str, float]]:
    """{model: {metric: value}} (NaN where undefined) plus counts.

    ``names`` defaults to :func:`run_metrics`; ask for :data:`ALL_METRICS` to have the
    multi-document metrics (NaN) on a single-document run too. ``per_model``: the
    :func:`model_stats` of ``df`` when the caller has them already.
    """
    df = ensure_prepared(df)
    names = tuple(names) if names is not None else run_metrics(df)
    models, stats = per_model if per_model is not None else model_stats(df)
    values = metrics_from_stats(stats)
    counts = _counts_from_stats(stats)
    result: dict[str, dict[str, float]] = {}
    for i, model in enumerate(models):
        row: dict[str, Any] = {name: float(values[name][i]) for name in names}
        row.update({name: int(counts[name][i]) for name in COUNTS})
        result[model] = row
    return result
