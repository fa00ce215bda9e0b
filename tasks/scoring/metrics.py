"""The per-model metrics of DESIGN.md §6 (the paper's Appendix D) from sufficient statistics.

How it stays fast at a million rows: every metric is a ratio of sums of per-row indicators
(ECE too, see :mod:`.calibration`). So one vector of *sufficient statistics* per model (or
per model × group, or per bootstrap resample) is computed with ``np.bincount``, and
:func:`metrics_from_stats` turns any stack of such vectors into metrics.

Undefined ratios are NaN, never 0. ``detection_f1`` is NaN when precision or recall is NaN
and 0 when both are defined and 0; ``hierarchical_score`` and ``calibrated_refusal_score``
are NaN when either factor is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.scoring.calibration import N_BINS, ece
from refusalbench.tasks.scoring.inputs import ensure_prepared

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
)
_N_BASE = len(_BASE_STATS)
_N_STATS = _N_BASE + 2 * N_BINS * 3


def row_arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The per-row indicators of a prepared frame that the statistics are summed from."""
    return {
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
        return np.bincount(groups, weights=w * mask, minlength=n_groups)

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


def metrics_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of DESIGN.md §6 from a stack (..., _N_STATS) of sufficient statistics."""
    s = {name: stats[..., i] for i, name in enumerate(_BASE_STATS)}
    ece_block = confidence_block(stats)
    answer_accuracy = _ratio(s["answered_correctly"], s["n_answerable"])
    refusal_accuracy = _ratio(s["right_code"], s["n_unanswerable"])
    precision = _ratio(s["unanswerable_refused"], s["refused"])
    recall = _ratio(s["unanswerable_refused"], s["n_unanswerable"])
    with np.errstate(divide="ignore", invalid="ignore"):
        # Both defined and both 0 -> 0; NaN propagates from an undefined side.
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    f1 = np.where(np.isnan(precision) | np.isnan(recall), np.nan, f1)
    category_accuracy = _ratio(s["right_code"], s["unanswerable_refused"])
    return {
        "answer_accuracy": answer_accuracy,
        "refusal_accuracy": refusal_accuracy,
        "false_refusal_rate": _ratio(s["answerable_refused"], s["n_answerable"]),
        "missed_refusal_rate": _ratio(s["unanswerable_answered"], s["n_unanswerable"]),
        "refusal_rate": _ratio(s["refused"], s["n"]),
        "correct_refusal_rate": recall,
        "detection_precision": precision,
        "detection_recall": recall,
        "detection_f1": f1,
        "category_accuracy": category_accuracy,
        "hierarchical_score": f1 * category_accuracy,
        "calibrated_refusal_score": (answer_accuracy + refusal_accuracy) / 2,
        "ece": ece(ece_block.sum(axis=-3)),
        "ece_answer": ece(ece_block[..., 0, :, :]),
        "ece_refusal": ece(ece_block[..., 1, :, :]),
    }


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


def compute_metrics(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{model: {metric: value}} with every §6 metric (NaN where undefined) plus counts."""
    df = ensure_prepared(df)
    codes, models = model_codes(df)
    stats = sufficient_stats(codes, len(models), row_arrays(df))
    values = metrics_from_stats(stats)
    counts = _counts_from_stats(stats)
    result: dict[str, dict[str, float]] = {}
    for i, model in enumerate(models):
        row: dict[str, Any] = {name: float(values[name][i]) for name in METRICS}
        row.update({name: int(counts[name][i]) for name in COUNTS})
        result[model] = row
    return result
