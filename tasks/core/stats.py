"""The statistics both methods use, in one place (pure numpy).

- ``wilson_interval``: Wilson score interval of a proportion (elementwise over arrays);
- bootstrap helpers: ``seeded_rng`` (one generator per group), ``resample_counts`` (row
  resamples drawn as multinomial counts over row types), ``bootstrap_means``,
  ``percentile_interval`` / ``row_percentiles`` and ``standard_error`` of resampled values
  (``interval_and_error_rows``: both for many groups' resamples at once; ``bootstrap_p_values``: many p-values);
- ``cohens_kappa``, ``fleiss_kappa``, ``fleiss_matrix``: agreement between raters;
- ``z_value``: the two-sided normal quantile of a confidence level;
- ``independent_difference``: the difference of two independent estimates, its interval and p-value;
- ``rounds_sample_size`` / ``rounds_epsilon``: the error bound of fresh rounds (paper, Theorem 3.1);
- clustered designs: ``cluster_resample_counts`` (one resample-index matrix over clusters),
  ``resampled_cluster_sums`` (resampled sums of per-cluster statistics), ``ratio_design_effects``
  (the design effect of a clustered ratio, for effective-size Wilson intervals);
- ``MIN_CLUSTERS`` / ``enough_clusters``: the fewest resampling units behind a number for a
  report page to show its interval, standard error or significance.

RefusalBench's scoring and KnowOrNot's rates both use these, so an interval means the same
in both reports.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import overload

import numpy as np

MIN_CLUSTERS = 10
"""The fewest independent units (RefusalBench: base-item clusters; KnowOrNot: judged responses)
behind a number for a report page to show its interval, standard error or significance mark.

A percentile bootstrap over K units can only recombine those K: with one unit every resample
is the data itself, so the interval collapses to a point ([50.0, 50.0]) and the standard error
to 0, and with a handful the resamples take so few distinct values that intervals are too
narrow and p-values too small (one item can "differ significantly"). Ten is a rule of thumb,
not a derived threshold: it is where a handful of units stops dominating. Below it a page prints "insufficient data
(n = K)" in place of the interval, standard error or mark; the estimate itself stays, and the
files on disk (``metrics.json``, the Parquet tables) keep every figure."""


def enough_clusters(n_clusters: int | float | None) -> bool:
    """Whether ``n_clusters`` units support an interval, standard error or significance mark
    (:data:`MIN_CLUSTERS`); an unknown count does not."""
    return (
        n_clusters is not None
        and not (isinstance(n_clusters, float) and math.isnan(n_clusters))
        and (n_clusters >= MIN_CLUSTERS)
    )


def z_value(level: float) -> float:
    """The two-sided normal quantile of a confidence level (1.959963984540054 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


@overload
def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]: ...
@overload
def wilson_interval(successes: np.ndarray, n: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]: ...


def wilson_interval(
    successes: int | np.ndarray, n: int | np.ndarray, level: float = 0.95
) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
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
    means: np.ndarray = values[draws].mean(axis=1)
    return means


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


def interval_and_error_rows(values: np.ndarray, level: float = 0.95) -> list[tuple[tuple[float, float], float]]:
    """``(percentile_interval(row, level), standard_error(row))`` of each row of (groups × resamples) ``values``.

    Rows without NaN (most) are computed together, one percentile and one deviation call for all
    of them, which give each row the same numbers as the calls on that row alone; a row with NaN
    (some resample left the metric undefined) goes through the row functions.
    """
    values = np.ascontiguousarray(values, dtype=np.float64)  # each row contiguous, as a lone row is
    complete = ~np.isnan(values).any(axis=1)
    out: list[tuple[tuple[float, float], float]] = [((math.nan, math.nan), math.nan)] * len(values)
    if complete.any() and values.shape[1] > 0:
        whole = values[complete]
        tail = (1 - level) / 2 * 100
        low, high = np.percentile(whole, [tail, 100 - tail], axis=1)
        spread = np.std(whole, ddof=1, axis=1) if whole.shape[1] > 1 else np.full(len(whole), math.nan)
        for row, a, b, c in zip(np.flatnonzero(complete), low.tolist(), high.tolist(), spread.tolist()):
            out[row] = ((a, b), c)
    for row in np.flatnonzero(~complete):
        out[row] = (percentile_interval(values[row], level), standard_error(values[row]))
    return out


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


# -- Multiple comparisons: many models x metrics are tested each round; a correction keeps
# the share of false alarms at the level the team chose instead of one per comparison.


def _adjust_present(p_values: Sequence[float], adjust_sorted: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """Apply ``adjust_sorted`` (ascending p-values, family size m -> adjusted values) to the p-values
    that are present; NaN ones stay NaN and do not count in the family."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    m = int(ok.sum())
    if m == 0:
        return out
    order = np.argsort(p[ok], kind="stable")
    back = np.empty(m)
    back[order] = np.minimum(adjust_sorted(p[ok][order], m), 1.0)
    out[ok] = back
    return out


def holm_adjust(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control): reject where adjusted <= alpha.

    NaN p-values (comparisons that could not be made) stay NaN and do not count in the family.
    """
    # step-down: never below an earlier one
    return _adjust_present(p_values, lambda p, m: np.maximum.accumulate(p * (m - np.arange(m))))


def bh_adjust(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false-discovery-rate control): reject where adjusted <= q.

    NaN p-values stay NaN and do not count in the family.
    """
    # step-up: never above a later one
    return _adjust_present(p_values, lambda p, m: np.minimum.accumulate((p * m / np.arange(1, m + 1))[::-1])[::-1])


def bootstrap_p_value(differences: np.ndarray, observed: float) -> float:
    """Two-sided p-value of "no difference" from bootstrap replicates of a difference.

    The share of replicates on the far side of zero, doubled (the percentile-bootstrap test
    that matches the percentile interval: p <= alpha exactly when the 1-alpha interval
    excludes 0); at least 1/(B+1) so a finite number of replicates never claims p = 0.
    """
    return float(bootstrap_p_values(np.asarray(differences, dtype=float)[None, :], np.array([observed]))[0])


def bootstrap_p_values(differences: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """:func:`bootstrap_p_value` of each row of (comparisons × replicates) ``differences`` and its ``observed``
    difference, in one pass (NaN replicates left out of a row's counts; NaN where none is left)."""
    d = np.asarray(differences, dtype=float)
    size = (~np.isnan(d)).sum(axis=1)  # a NaN is neither <= 0 nor >= 0: the counts below leave it out
    below = ((d <= 0).sum(axis=1) + 1) / (size + 1)
    above = ((d >= 0).sum(axis=1) + 1) / (size + 1)
    p = np.minimum(1.0, 2 * np.minimum(below, above))
    return np.where((size == 0) | np.isnan(np.asarray(observed, dtype=float)), np.nan, p)


def independent_difference(
    estimate_a: np.ndarray, se_a: np.ndarray, estimate_b: np.ndarray, se_b: np.ndarray, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """b - a for two estimates from independent samples: (difference, interval low, high, two-sided p-value).

    The standard error of the difference is sqrt(se_a² + se_b²) (independent samples: no
    covariance term) and the test is the normal (Wald) one. Elementwise over arrays; NaN
    where an input is NaN. A zero standard error on both sides (every resample the same, e.g.
    0 of n and n of n) makes any nonzero difference certain (p = 0) and no difference p = 1.
    """
    a, b = np.asarray(estimate_a, dtype=float), np.asarray(estimate_b, dtype=float)
    se = np.sqrt(np.asarray(se_a, dtype=float) ** 2 + np.asarray(se_b, dtype=float) ** 2)
    difference = b - a
    half = z_value(level) * se
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(difference) / se
    z = np.where((se == 0) & (difference == 0), 0.0, z)  # 0/0: nothing changed
    p = np.vectorize(lambda value: math.nan if math.isnan(value) else 2 * NormalDist().cdf(-value), otypes=[float])(z)
    return difference, difference - half, difference + half, p


# -- The error bound of fresh rounds (RefusalBench paper, Theorem 3.1, App. B): Hoeffding's
# inequality per round and a union bound over T rounds give, for per-item scores in [0, 1],
# P(max over T rounds |estimate - truth| > epsilon) <= 2T exp(-2 n epsilon²).


def rounds_sample_size(epsilon: float, delta: float, rounds: int = 1) -> int:
    """The fewest items per round, n >= ln(2T/delta) / (2 epsilon²), that keep every one of
    ``rounds`` rounds within ``epsilon`` of the truth with probability 1 - delta."""
    if not (0 < epsilon and 0 < delta < 1 and rounds >= 1):
        raise ValueError("need epsilon > 0, 0 < delta < 1 and rounds >= 1")
    return math.ceil(math.log(2 * rounds / delta) / (2 * epsilon * epsilon))


def rounds_epsilon(n: int, delta: float, rounds: int = 1) -> float:
    """The epsilon that ``n`` items per round achieve under the same bound: sqrt(ln(2T/delta) / (2n)); NaN for n = 0."""
    if n <= 0:
        return math.nan
    return math.sqrt(math.log(2 * rounds / delta) / (2 * n))


# -- Clustered designs: benchmark items written from one base item are not independent (they share
# its question and context), so intervals resample whole clusters (Field & Welsh 2007; Cameron,
# Gelbach & Miller 2008), and closed-form intervals use the design effect (Kish 1965).


def cluster_resample_counts(rng: np.random.Generator, n_clusters: int, n_resamples: int) -> np.ndarray:
    """(n_resamples × n_clusters) times each cluster is drawn when ``n_clusters`` clusters are drawn with
    replacement: one resample-index matrix that every statistic of the same clusters can reuse
    (resampled sums = counts @ per-cluster sums)."""
    counts = np.zeros((n_resamples, n_clusters))
    if n_clusters == 0:
        return counts
    chunk = max(1, min(n_resamples, 4_000_000 // n_clusters))
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        drawn = rng.integers(0, n_clusters, size=(size, n_clusters)) + (np.arange(size) * n_clusters)[:, None]
        counts[start : start + size] = np.bincount(drawn.ravel(), minlength=size * n_clusters).reshape(size, n_clusters)
    return counts


def resampled_cluster_sums(per_cluster: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """(n_resamples × S) sums of (K × S) per-cluster statistics over resamples of the K clusters
    with replacement.

    Clusters with identical statistics are one type, and drawing K clusters is drawing counts over
    the types: a multinomial draw when the types are few (one- or two-item clusters), K uniform
    indices per resample otherwise; the sums are then counts @ per-type statistics.
    """
    per_cluster = np.asarray(per_cluster, dtype=np.float64)
    n_clusters, width = per_cluster.shape
    if n_clusters == 0:
        return np.zeros((n_resamples, width))
    types, type_of, type_counts = np.unique(per_cluster, axis=0, return_inverse=True, return_counts=True)
    type_of = type_of.reshape(-1)
    n_types = len(types)
    out = np.empty((n_resamples, width))
    chunk = max(1, min(n_resamples, 4_000_000 // max(n_clusters, n_types)))
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        if 2 * n_types < n_clusters:  # a multinomial costs ~2x a uniform index per category drawn
            drawn = resample_counts(rng, type_counts, size)
        else:
            index = type_of[rng.integers(0, n_clusters, size=(size, n_clusters))] + (np.arange(size) * n_types)[:, None]
            drawn = np.bincount(index.ravel(), minlength=size * n_types).reshape(size, n_types).astype(np.float64)
        out[start : start + size] = drawn @ types
    return out


def ratio_design_effects(
    numerators: np.ndarray, denominators: np.ndarray, groups: np.ndarray, n_groups: int
) -> np.ndarray:
    """Design effect of each group's ratio Σy/Σn from its clusters' sums (y_k, n_k): the cluster
    variance over the i.i.d. binomial variance, at least 1; 1 where it cannot be estimated
    (rate 0 or 1, no rows). ``groups[k]``: the group of cluster-sum k (a cluster may appear in several).

    The cluster variance is the linearised with-replacement one, Σ(y_k − r·n_k)² / (Σn)²: what a
    cluster bootstrap of the ratio estimates; for one-row clusters it equals r(1−r)/n, so the design
    effect is 1. Floored at 1, so a noisy estimate in a small group never claims more precision than
    independent rows would give. Wilson's interval on n / deff rows is the effective-size Wilson
    interval for clustered proportions (Korn & Graubard 1998; Dean & Pagano 2015).
    """
    y = np.asarray(numerators, dtype=np.float64)
    n = np.asarray(denominators, dtype=np.float64)
    total_y = np.bincount(groups, weights=y, minlength=n_groups)
    total_n = np.bincount(groups, weights=n, minlength=n_groups)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(total_n > 0, total_y / np.where(total_n > 0, total_n, 1), 0.0)
        spread = np.bincount(groups, weights=(y - rate[groups] * n) ** 2, minlength=n_groups)
        binomial = rate * (1 - rate) * total_n  # r(1-r)/N, times N² like the spread
        deff = np.where(binomial > 0, spread / np.where(binomial > 0, binomial, 1), 1.0)
    return np.maximum(deff, 1.0)
