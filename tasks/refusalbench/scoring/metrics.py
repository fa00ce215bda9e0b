"""The per-model metrics of metrics.json, computed from sufficient statistics.

The metrics themselves are declared in :mod:`.paper_metrics` (and by plugins) as
:class:`~.specs.MetricSpec`; the statistics they are made of are in
:mod:`.row_statistics`. This module turns a prepared frame, or any stack of statistics
(per model, per group, per bootstrap resample), into metric values: it stays fast at a
million rows because every metric is computed from the summed statistics, never row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.refusalbench.scoring import paper_metrics  # noqa: F401  (declares the paper's metrics)
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.row_statistics import (
    COUNTS,
    STAT_INDEX,
    confidence_block,
    row_arrays,
    stat_sum,
    sufficient_stats,
)
from refusalbench.tasks.refusalbench.scoring.specs import (
    METRIC_SPECS,
    all_metrics,
    coverage_metrics,
    metric_spec,
    single_document_metrics,
)


def proportion_parts(stats: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) of a ratio metric from (..., N_STATS) statistics."""
    spec = metric_spec(metric)
    return stat_sum(stats, spec.numerator), stat_sum(stats, spec.denominator)


def metrics_from_stats(stats: np.ndarray, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Every declared metric (:func:`all_metrics`, then :func:`coverage_metrics`) from a stack
    (..., N_STATS) of sufficient statistics; with ``names``, only those (and what they are made of):
    the bootstrap asks for the few it summarises, on stacks of a million resampled rows."""
    wanted = all_metrics() + coverage_metrics() if names is None else tuple(names)
    needed = set(wanted)
    for name in reversed(list(METRIC_SPECS)):  # a formula's inputs are declared before it
        if name in needed:
            needed.update(METRIC_SPECS[name].of)
    values: dict[str, np.ndarray] = {}
    for name, spec in METRIC_SPECS.items():  # declaration order: a formula's inputs come before it
        if name in needed:
            values[name] = spec.values(stats, values)
    return {name: values[name] for name in wanted}


def _counts_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "n": stats[..., STAT_INDEX["n"]],
        "n_answerable": stats[..., STAT_INDEX["n_answerable"]],
        "n_unanswerable": stats[..., STAT_INDEX["n_unanswerable"]],
        "n_confidence": confidence_block(stats)[..., 0].sum(axis=(-1, -2)),
        "n_unjudged": stats[..., STAT_INDEX["n_unjudged"]],
    }


def model_codes(df: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """(row -> model index, model names sorted): the grouping key of every per-model result."""
    codes, models = pd.factorize(df["model"], sort=True)
    return codes.astype(np.int64), [str(m) for m in models]


def run_metrics(df: pd.DataFrame) -> tuple[str, ...]:
    """The metrics a prepared frame is scored on: §6's, plus GaRAGe's when it has multi-document rows."""
    has_multi = "multi" in df and bool(df["multi"].to_numpy(dtype=bool).any())
    return all_metrics() if has_multi else single_document_metrics()


def model_stats(df: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """(models sorted, their sufficient statistics (models × N_STATS)) of a prepared frame."""
    codes, models = model_codes(df)
    return models, sufficient_stats(codes, len(models), row_arrays(df))


def compute_metrics(
    df: pd.DataFrame, names: Sequence[str] | None = None, per_model: tuple[list[str], np.ndarray] | None = None
) -> dict[str, dict[str, float]]:
    """{model: {metric: value}} (NaN where undefined) plus counts.

    ``names`` defaults to :func:`run_metrics`; ask for :func:`all_metrics` to have the
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
