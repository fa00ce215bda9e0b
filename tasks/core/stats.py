"""The statistics both methods use, in one place (pure numpy).

- ``wilson_interval``: Wilson score interval of a proportion (elementwise over arrays);
- bootstrap helpers: ``seeded_rng`` (one generator per group), ``resample_counts`` (row
  resamples drawn as multinomial counts over row types), ``bootstrap_means``,
  ``percentile_interval`` / ``row_percentiles`` and ``standard_error`` of resampled values;
- ``cohens_kappa``, ``fleiss_kappa``, ``fleiss_matrix``: agreement between raters;
- ``z_value``: the two-sided normal quantile of a confidence level.

RefusalBench's scoring and KnowOrNot's rates both use these, so an interval means the same
in both reports.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from statistics import NormalDist
from typing import overload

import numpy as np


def z_value(level: float) -> float:
    """The two-sided normal quantile of a confidence level (1.959963984540054 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


@overload
def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]: ...
@overload
def wilson_interval(successes: np.ndarray, n: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]: ...


def wilson_interval(successes, n, level=0.95):
    """Wilson score interval of the proportion successes/n; NaN where n = 0.

    Elementwise over arrays; two floats when both arguments are scalars. Chosen over a
    bootstrap for small groups with rates near 0 or 1, where a bootstrap interval collapses
    to [1, 1] and the normal approximation leaves [0, 1].
    """
    k = np.asarray(successes, dtype=np.float64)
    size = np.asarray(n, dtype=np.float64)
    z = z_value(level)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = k / size
        denominator = 1 + z * z / size
        centre = (p + z * z / (2 * size)) / denominator
        half = z * np.sqrt(p * (1 - p) / size + z * z / (4 * size * size)) / denominator
    # At 0 or n successes the bound is exactly 0 or 1 (rounding would leave 1e-17 off).
    low = np.where(k == 0, 0.0, centre - half)
    high = np.where(k == size, 1.0, centre + half)
    empty = size <= 0
    low, high = np.where(empty, np.nan, low), np.where(empty, np.nan, high)
    if low.ndim == 0:
        return float(low), float(high)
    return low, high


# ----------------------------------------------------------------- bootstrap


def seeded_rng(seed: int, label: str) -> np.random.Generator:
    """The generator of one group (a model, a configuration), seeded by (seed, crc32 of its label).

    Each group draws from its own generator, so adding a group leaves the others' intervals unchanged.
    """
    return np.random.default_rng([seed, zlib.crc32(label.encode("utf-8"))])


def resample_counts(rng: np.random.Generator, type_counts: np.ndarray, n_resamples: int) -> np.ndarray:
    """(n_resamples × types) counts of each row type in resamples with replacement of all the rows.

    Drawing n rows with replacement is drawing multinomial counts over the distinct row types
    with probabilities count / n; a resample's statistics are then counts @ per-type statistics.
    Consecutive calls continue the generator's stream, so drawing in chunks gives the same rows.
    """
    n = int(type_counts.sum())
    return rng.multinomial(n, type_counts / n, size=n_resamples).astype(np.float64)


def bootstrap_means(values: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """The means of ``n_resamples`` resamples with replacement of ``values`` (non-empty)."""
    draws = rng.integers(0, values.size, size=(n_resamples, values.size))
    return values[draws].mean(axis=1)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of resampled values, NaNs (undefined resamples) left out; NaN if all are."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan, math.nan
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def row_percentiles(values: np.ndarray, quantiles: Sequence[float]) -> list[np.ndarray]:
    """Percentiles (numpy's linear rule) of each row of ``values``, NaNs left out; NaN for an all-NaN row.

    One sort of the whole block instead of ``np.nanpercentile``'s row-by-row loop.
    """
    ordered = np.sort(values, axis=1)  # NaN sorts last
    valid = (~np.isnan(values)).sum(axis=1)
    rows = np.arange(len(values))
    out = []
    for q in quantiles:
        position = np.maximum(valid - 1, 0) * (q / 100)
        below = np.floor(position).astype(np.int64)
        above = np.minimum(below + 1, np.maximum(valid - 1, 0))
        low, high = ordered[rows, below], ordered[rows, above]
        value = low + (high - low) * (position - below)
        out.append(np.where(valid > 0, value, np.nan))
    return out


def standard_error(values: np.ndarray) -> float:
    """The bootstrap standard error: standard deviation (ddof 1) of the resampled values, NaNs
    left out; NaN with fewer than two."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(np.std(values, ddof=1)) if values.size > 1 else math.nan


# ----------------------------------------------------------------- agreement


def cohens_kappa(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> float:
    """Cohen's kappa of two raters over the same items: (p_o - p_e) / (1 - p_e).

    ``labels``: the categories (default: every label either rater used, sorted). NaN when
    undefined: no items, or chance agreement 1 because both raters used one and the same
    label throughout.
    """
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    if not a:
        return float("nan")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    n = len(a)
    first, second = list(a), list(b)
    p_o = sum(x == y for x, y in zip(first, second)) / n
    p_e = sum((first.count(c) / n) * (second.count(c) / n) for c in categories)
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_o - p_e) / (1.0 - p_e))


def fleiss_kappa(matrix: np.ndarray | Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa from an items × categories matrix of rater counts (same raters per item, ≥ 2).

    P_i = (Σ_j n_ij² − n) / (n(n−1)); P̄ = mean P_i; p_j = Σ_i n_ij / (N n); P_e = Σ_j p_j²;
    kappa = (P̄ − P_e) / (1 − P_e), NaN when P_e = 1 (every rating in one category).
    """
    counts = np.asarray(matrix, dtype=float)
    if counts.ndim != 2 or counts.shape[0] == 0:
        raise ValueError("need a non-empty items × categories matrix")
    raters = counts.sum(axis=1)
    if not np.allclose(raters, raters[0]) or raters[0] < 2:
        raise ValueError("every item needs the same number of ratings, at least 2")
    n = raters[0]
    p_items = ((counts**2).sum(axis=1) - n) / (n * (n - 1))
    p_bar = p_items.mean()
    p_categories = counts.sum(axis=0) / (counts.shape[0] * n)
    p_e = float((p_categories**2).sum())
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_bar - p_e) / (1.0 - p_e))


def fleiss_matrix(ratings: Sequence[Sequence[str]], categories: Sequence[str]) -> np.ndarray:
    """Items × categories counts from one list of ratings per item (the input of ``fleiss_kappa``)."""
    index = {c: j for j, c in enumerate(categories)}
    matrix = np.zeros((len(ratings), len(categories)), dtype=int)
    for i, item in enumerate(ratings):
        for rating in item:
            matrix[i, index[rating]] += 1
    return matrix
