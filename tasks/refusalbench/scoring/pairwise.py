"""Pairwise model comparisons: is model A's score really above model B's on the same items?

For every pair of models evaluated on the same items, the paired difference A − B of
:data:`PAIRWISE_METRICS` with a cluster-bootstrap interval and p-value: each resample draws base
items (:mod:`.clusters`) and both models are scored on the same draw, so what the two share (an
easy or a hard base item) cancels in the difference. P-values are corrected for the number of
pairs with Holm's step-down method.

Decisions the contract leaves open:
- Holm (family-wise error control), not Benjamini–Hochberg: a leaderboard reader takes each
  "A beats B" as a claim on its own, and Holm keeps the chance of even one false claim among all
  pairs at alpha; it is valid under any dependence between the comparisons (pairs sharing a
  model are dependent, which Benjamini–Hochberg's guarantee does not cover). The trend across
  rounds, a screen over many models × metrics, controls the false-discovery rate instead.
- One family per metric: the k(k−1)/2 pairs of that metric.
- Two models whose item sets differ are compared on the items both were evaluated on
  (``same_items`` false, ``n_items`` the shared ones), with a resample of their own; a pair
  with no shared item is left out. Each model's metric counts its own scored rows, as on the
  leaderboard, so for models on the same items the difference is the leaderboard's.
- The p-value is :func:`~refusalbench.tasks.core.stats.bootstrap_p_value` (two-sided percentile
  test, consistent with the interval); NaN (not in the family) where a metric is undefined.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import (
    bootstrap_p_values,
    holm_adjust,
    resampled_cluster_sums,
    row_percentiles,
    seeded_rng,
)
from refusalbench.tasks.refusalbench.scoring.clusters import cluster_codes
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.metrics import model_codes
from refusalbench.tasks.refusalbench.scoring.row_statistics import row_arrays

PAIRWISE_METRICS: tuple[str, ...] = ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy")
CORRECTION = "holm"
ALPHA = 0.05
PAIRWISE_STREAM = "pairwise"
METHOD = (
    "paired cluster bootstrap: both models scored on the same resampled base items; difference = model_a - "
    "model_b; two-sided percentile p-value; Holm correction over the pairs of each metric (family-wise)"
)
# Per model and cluster: answered correctly, answerable, right code, unanswerable (scored rows).
_PARTS = 4


def _cluster_parts(rows: dict[str, np.ndarray], keys: np.ndarray, size: int) -> np.ndarray:
    """(size × 4) sums per key of the statistics the compared metrics are made of (scored rows)."""
    scored = rows["scored"]
    answerable = rows["answerable"] & scored
    parts = (rows["answered_correctly"] & scored, answerable, rows["right_code"] & scored, ~rows["answerable"] & scored)
    return np.stack([np.bincount(keys, weights=p, minlength=size) for p in parts], axis=1)


def _metric_values(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The compared metrics from (..., 4) sums (NaN where undefined)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        answer = np.where(sums[..., 1] > 0, sums[..., 0] / sums[..., 1], np.nan)
        refusal = np.where(sums[..., 3] > 0, sums[..., 2] / sums[..., 3], np.nan)
    return {"calibrated_refusal_score": (answer + refusal) / 2, "answer_accuracy": answer, "refusal_accuracy": refusal}


def _vector_se(drawn: np.ndarray) -> np.ndarray:
    """Row-wise bootstrap standard error (ddof 1), NaNs left out; NaN with fewer than two values."""
    valid = (~np.isnan(drawn)).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: NaN is the answer
        spread = np.nanstd(drawn, axis=1, ddof=1)
    return np.where(valid > 1, spread, np.nan)


def _pairs(
    models: list[str],
    codes: np.ndarray,
    clusters: np.ndarray,
    n_clusters: int,
    items: np.ndarray,
    rows: dict[str, np.ndarray],
    n_resamples: int,
    seed: int,
) -> tuple[list[tuple[int, int, int, bool]], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The compared pairs (a, b, shared items, same items), and per metric their observed differences
    (pairs) and resampled differences (pairs × resamples)."""
    n_models = len(models)
    item_sets = [np.unique(items[codes == i]) for i in range(n_models)]
    # One joint resample for every model: (clusters × models·4) -> (resamples × models × 4).
    per_cluster = _cluster_parts(rows, clusters * n_models + codes, n_clusters * n_models)
    per_cluster = per_cluster.reshape(n_clusters, n_models * _PARTS)
    observed_all = _metric_values(per_cluster.sum(axis=0).reshape(n_models, _PARTS))
    drawn_all = _metric_values(
        resampled_cluster_sums(per_cluster, seeded_rng(seed, PAIRWISE_STREAM), n_resamples).reshape(
            n_resamples, n_models, _PARTS
        )
    )
    pairs: list[tuple[int, int, int, bool]] = []
    observed: dict[str, list[float]] = {m: [] for m in PAIRWISE_METRICS}
    drawn: dict[str, list[np.ndarray]] = {m: [] for m in PAIRWISE_METRICS}
    for i, j in itertools.combinations(range(n_models), 2):
        if np.array_equal(item_sets[i], item_sets[j]):
            pairs.append((i, j, len(item_sets[i]), True))
            for name in PAIRWISE_METRICS:
                observed[name].append(observed_all[name][i] - observed_all[name][j])
                drawn[name].append(drawn_all[name][:, i] - drawn_all[name][:, j])
            continue
        shared = np.intersect1d(item_sets[i], item_sets[j], assume_unique=True)
        if shared.size == 0:
            continue
        # Different item sets: the pair on its shared items, with a resample of its own.
        mask = ((codes == i) | (codes == j)) & np.isin(items, shared)
        parts = _cluster_parts(
            {k: v[mask] for k, v in rows.items()}, clusters[mask] * 2 + (codes[mask] == j), n_clusters * 2
        ).reshape(n_clusters, 2 * _PARTS)
        rng = seeded_rng(seed, f"{PAIRWISE_STREAM}\0{models[i]}\0{models[j]}")
        pair_observed = _metric_values(parts.sum(axis=0).reshape(2, _PARTS))
        pair_drawn = _metric_values(resampled_cluster_sums(parts, rng, n_resamples).reshape(n_resamples, 2, _PARTS))
        pairs.append((i, j, int(shared.size), False))
        for name in PAIRWISE_METRICS:
            observed[name].append(pair_observed[name][0] - pair_observed[name][1])
            drawn[name].append(pair_drawn[name][:, 0] - pair_drawn[name][:, 1])
    return (
        pairs,
        {m: np.asarray(v, dtype=np.float64) for m, v in observed.items()},
        {m: np.asarray(v, dtype=np.float64).reshape(len(pairs), n_resamples) for m, v in drawn.items()},
    )


def pairwise_comparisons(
    df: pd.DataFrame, n_resamples: int = 1000, seed: int = 0, level: float = 0.95, alpha: float = ALPHA
) -> dict[str, Any]:
    """The ``pairwise`` block of metrics.json: every pair's paired differences, intervals, p-values (raw and Holm).

    Pairs in model-name order (``model_a`` < ``model_b``); ``significant``: Holm-adjusted p <= ``alpha``.
    """
    df = ensure_prepared(df)
    codes, models = model_codes(df)
    clusters, n_clusters = cluster_codes(df)
    items, _ = pd.factorize(df["item_id"], sort=True)
    pairs, observed, drawn = _pairs(models, codes, clusters, n_clusters, items, row_arrays(df), n_resamples, seed)
    comparisons: list[dict[str, Any]] = [
        {"model_a": models[i], "model_b": models[j], "n_items": n_items, "same_items": same, "metrics": {}}
        for i, j, n_items, same in pairs
    ]
    tail = (1 - level) / 2 * 100
    for name in PAIRWISE_METRICS:
        low, high = row_percentiles(drawn[name], [tail, 100 - tail])
        errors = _vector_se(drawn[name])
        p_values = bootstrap_p_values(drawn[name], observed[name]).reshape(len(pairs))
        adjusted = holm_adjust(p_values.tolist())
        for k, comparison in enumerate(comparisons):
            comparison["metrics"][name] = {
                "difference": float(observed[name][k]),
                "ci": [float(low[k]), float(high[k])],
                "se": float(errors[k]),
                "p_value": float(p_values[k]),
                "p_adjusted": float(adjusted[k]),
                "significant": bool(adjusted[k] <= alpha),
            }  # NaN compares False
    return {
        "metrics": list(PAIRWISE_METRICS),
        "method": METHOD,
        "correction": CORRECTION,
        "alpha": alpha,
        "level": level,
        "n_resamples": n_resamples,
        "comparisons": comparisons,
    }
