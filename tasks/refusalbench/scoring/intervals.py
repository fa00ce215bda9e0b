"""Intervals for breakdown rows (model × class, intensity, lever, domain or generator).

A breakdown group is often small (a lever may hold a dozen items), where a percentile
bootstrap of a proportion collapses to [1, 1] or [0, 0]. So:

- a ratio metric (:attr:`~.specs.MetricSpec.is_ratio`: a count over a count) gets its
  Wilson score interval, exact in closed form and sensible at any size;
- a formula metric (F1, hierarchical score, CRS, ECE) gets
  a percentile bootstrap of the group's own rows, drawn as multinomial counts over the
  group's row types like the per-model bootstrap (:mod:`.bootstrap`).

Decisions the contract leaves open:
- A group's row type is (answerable, refused, answered correctly, right code, confidence
  bin); each type carries its rows' mean confidence, so within a bin the resampled
  confidence sum uses that mean (ECE's bins themselves stay exact). Types that do not enter
  the composites (judge scores, unjudged flags) are left out, which keeps a group's types
  at a few dozen whatever its size.
- Each group draws from its own generator seeded by (seed, crc32 of its dimension, model
  and value), so a group's interval does not depend on the other groups.
- No resamples (``n_resamples`` 0): composite intervals are NaN; Wilson intervals remain.

Base items (:mod:`.clusters`): where some base item holds several rows of a group (a domain
holds all 18 items of its base items; a perturbation class several), rows are not independent:

- the Wilson interval of a ratio is computed on the effective number of rows, rows / design
  effect (:func:`~refusalbench.tasks.core.stats.ratio_design_effects`: the cluster variance of
  the ratio over the binomial one, at least 1);
- a formula's bootstrap resamples base items, each with all of the group's rows in it, using
  the score's one resample-index matrix (the per-model intervals use it too).

A group with one row per base item (a lever, or any group when the rows carry no base id) keeps
the computation above: there the two designs are the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import (
    ratio_design_effects,
    resample_counts,
    row_percentiles,
    seeded_rng,
    wilson_interval,
)
from refusalbench.tasks.refusalbench.scoring.calibration import N_BINS
from refusalbench.tasks.refusalbench.scoring.clusters import cluster_counts, multi_row_groups
from refusalbench.tasks.refusalbench.scoring.metrics import metrics_from_stats, proportion_parts
from refusalbench.tasks.refusalbench.scoring.row_statistics import STAT_INDEX, confidence_block, sufficient_stats
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec

# ``scored`` last: constant where every row is scored, so the types keep their order. Unscored rows
# enter no formula metric; they are a type of their own so a resample draws them in their share.
_TYPE_FLAGS: tuple[str, ...] = ("answerable", "refused", "answered_correctly", "right_code", "scored")
_N_FLAG_VALUES = 1 << len(_TYPE_FLAGS)
_BATCH_ROWS = 200_000  # resampled statistics computed into metrics at a time


def _group_types(groups: np.ndarray, rows: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row types of every group at once: (group of each type, count, per-type statistics).

    Types come out sorted by group, so one group's types are a contiguous slice.
    """
    flags = sum(rows[name].astype(np.int64) << bit for bit, name in enumerate(_TYPE_FLAGS))
    key = (groups.astype(np.int64) * _N_FLAG_VALUES + flags) * (N_BINS + 1) + (rows["conf_bin"] + 1)
    codes, uniques = pd.factorize(key, sort=True)
    counts = np.bincount(codes, minlength=len(uniques)).astype(np.float64)
    has_conf = rows["conf_bin"] >= 0
    conf_sum = np.bincount(codes, weights=np.where(has_conf, rows["conf_value"], 0.0), minlength=len(uniques))
    type_bin = uniques % (N_BINS + 1) - 1
    type_flags = uniques // (N_BINS + 1) % _N_FLAG_VALUES
    representative = {name: (type_flags >> bit & 1).astype(bool) for bit, name in enumerate(_TYPE_FLAGS)}
    representative["correct"] = representative["answered_correctly"] | representative["right_code"]
    representative["conf_value"] = np.where(type_bin >= 0, conf_sum / counts, np.nan)
    representative["conf_bin"] = type_bin
    false = np.zeros(len(uniques), dtype=bool)
    for name in (
        "unjudged",
        "multi",
        "eligibility_has",
        "eligibility",
        "factuality_has",
        "factuality",
        "raf_has",
        "raf",
    ):
        representative[name] = false
    per_type = sufficient_stats(np.arange(len(uniques)), len(uniques), representative)
    return uniques // (_N_FLAG_VALUES * (N_BINS + 1)), counts, per_type


def _one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """BLAS on one thread: each group's product is small, and BLAS threads spun up for it
    cost far more than the product itself (25x on a busy 2-core machine)."""
    try:
        from threadpoolctl import threadpool_limits  # installed with scikit-learn
    except ImportError:  # pragma: no cover - only slower without it
        return contextlib.nullcontext()
    limits: contextlib.AbstractContextManager[Any] = threadpool_limits(limits=1, user_api="blas")
    return limits


def read_columns(metrics: Sequence[str], stats: np.ndarray) -> np.ndarray | None:
    """The columns of (…, statistics) ``stats`` that ``metrics`` read, or None when they need all of them
    (a formula of the statistics themselves, such as ECE where some row states a confidence).

    Resampled counts are integers, so a product restricted to these columns gives the very same sums
    (integer sums are exact in any order); a run without confidences leaves ECE's block out (all zero).
    """
    columns: set[int] = set()
    pending = list(metrics)
    no_confidence = not confidence_block(stats)[..., 0].any()
    while pending:
        spec = metric_spec(pending.pop())
        if spec.is_ratio:
            columns.update(STAT_INDEX[name] for name in spec.numerator + spec.denominator)
        elif spec.of:
            pending.extend(spec.of)
        elif not (spec.calibration and no_confidence):
            return None
    return np.array(sorted(columns), dtype=np.int64)


class _PercentileBatch:
    """Resampled statistics of several groups, turned into metrics and percentile intervals together
    (``_BATCH_ROWS`` resample rows at a time: one vectorised metric call, bounded memory); the
    intervals go into ``out`` ({metric: (low, high)}) at each group's position. With ``columns``
    (:func:`read_columns`), the statistics added are those columns only, of ``width`` in all."""

    def __init__(
        self,
        out: dict[str, tuple[np.ndarray, np.ndarray]],
        metrics: Sequence[str],
        n_resamples: int,
        level: float,
        columns: np.ndarray | None = None,
        width: int = 0,
    ) -> None:
        self.out, self.metrics, self.n_resamples = out, metrics, n_resamples
        self.columns, self.width = columns, width
        self.tail = (1 - level) / 2 * 100
        self.pending: list[tuple[int, np.ndarray]] = []
        self.computed = list(metrics)
        if columns is not None:
            # Without confidences, a calibration formula of the statistics (ECE) reads only their zero
            # confidence block (``read_columns``) and is NaN on every resample, as on these two rows: its
            # intervals stay the NaN they start as, without checking a million zero rows for a confidence.
            formulas = [
                name
                for name in metrics
                if metric_spec(name).calibration and not metric_spec(name).is_ratio and not metric_spec(name).of
            ]
            probe = np.zeros((2, width))
            probe[1, columns] = 1.0
            undefined = metrics_from_stats(probe, formulas) if formulas else {}
            self.computed = [name for name in metrics if not np.isnan(undefined.get(name, [0.0])).all()]

    def add(self, position: int, stats: np.ndarray) -> None:
        self.pending.append((position, stats))
        if len(self.pending) * self.n_resamples >= _BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        stacked = np.concatenate([stats for _, stats in self.pending], axis=0)
        if self.columns is not None:  # the columns no metric reads stay 0
            # Column-major: each statistic a metric reads is contiguous, and the columns no metric reads
            # are pages never touched (the same values as a row-major copy, without writing 116 columns).
            stacked, read = np.zeros((len(stacked), self.width), order="F"), stacked
            stacked[:, self.columns] = read
        values = metrics_from_stats(stacked, self.computed)
        positions = [position for position, _ in self.pending]
        for name in self.computed:
            low, high = row_percentiles(
                values[name].reshape(len(self.pending), self.n_resamples), [self.tail, 100 - self.tail]
            )
            self.out[name][0][positions], self.out[name][1][positions] = low, high
        self.pending.clear()


def group_bootstrap(
    groups: np.ndarray,
    rows: Mapping[str, np.ndarray],
    wanted_groups: np.ndarray,
    labels: Sequence[str],
    metrics: Sequence[str],
    n_resamples: int,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Percentile intervals of ``metrics`` per group in ``wanted_groups``, rows resampled within it.

    ``groups`` maps each row to its group; ``labels[i]`` names ``wanted_groups[i]`` (it seeds
    that group's generator). Returns {metric: (low, high)}, arrays aligned with ``wanted_groups``.
    """
    size = len(wanted_groups)
    out = {name: (np.full(size, np.nan), np.full(size, np.nan)) for name in metrics}
    if n_resamples <= 0 or size == 0 or not metrics:
        return out
    type_group, counts, per_type = _group_types(groups, rows)
    starts = np.searchsorted(type_group, wanted_groups, side="left")
    ends = np.searchsorted(type_group, wanted_groups, side="right")
    columns = read_columns(metrics, per_type)
    batch = _PercentileBatch(out, metrics, n_resamples, level, columns, per_type.shape[1])
    read = per_type if columns is None else per_type[:, columns]

    with _one_blas_thread():
        for position in range(size):
            start, end = starts[position], ends[position]
            if end <= start:
                continue
            drawn = resample_counts(seeded_rng(seed, labels[position]), counts[start:end], n_resamples)
            batch.add(position, drawn @ read[start:end])
        batch.flush()
    return out


def _cluster_parts(
    groups: np.ndarray, clusters: np.ndarray, n_clusters: int, rows: Mapping[str, np.ndarray], chosen: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, cluster, sufficient statistics) of every (group, cluster) with rows, for the groups in
    ``chosen`` (a mask over group numbers); sorted by group, then cluster."""
    take = chosen[groups]
    keys = groups[take].astype(np.int64) * n_clusters + clusters[take]
    codes, uniques = pd.factorize(keys, sort=True)
    stats = sufficient_stats(codes, len(uniques), {k: v[take] for k, v in rows.items()})
    return uniques // n_clusters, uniques % n_clusters, stats


def cluster_group_bootstrap(
    part_group: np.ndarray,
    part_cluster: np.ndarray,
    part_stats: np.ndarray,
    counts: np.ndarray,
    wanted_groups: np.ndarray,
    metrics: Sequence[str],
    level: float = 0.95,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Percentile intervals of ``metrics`` per wanted group from the score's resample-index matrix
    ``counts`` (resamples × clusters): each resample's statistics are its draws of the group's clusters
    times their statistics (``part_*``: per (group, cluster), sorted by group)."""
    size = len(wanted_groups)
    out = {name: (np.full(size, np.nan), np.full(size, np.nan)) for name in metrics}
    n_resamples = counts.shape[0]
    if n_resamples == 0 or size == 0 or not metrics:
        return out
    starts = np.searchsorted(part_group, wanted_groups, side="left")
    ends = np.searchsorted(part_group, wanted_groups, side="right")
    columns = read_columns(metrics, part_stats)
    batch = _PercentileBatch(out, metrics, n_resamples, level, columns, part_stats.shape[1])
    read = part_stats if columns is None else part_stats[:, columns]

    for position in range(size):
        start, end = starts[position], ends[position]
        if end > start:
            batch.add(position, counts[:, part_cluster[start:end]] @ read[start:end])
    batch.flush()
    return out


def breakdown_intervals(
    stats: np.ndarray,
    groups: np.ndarray,
    rows: Mapping[str, np.ndarray],
    wanted_groups: np.ndarray,
    labels: Sequence[str],
    metrics: Sequence[str],
    n_resamples: int,
    seed: int = 0,
    level: float = 0.95,
    clusters: np.ndarray | None = None,
    n_clusters: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{metric: (low, high)} per wanted group: Wilson for ratios, group bootstrap for formulas.

    ``stats`` holds the sufficient statistics of the wanted groups, in their order (ascending).
    ``clusters`` (each row's base item, :mod:`.clusters`): in a group where some base item holds
    several rows, a ratio's Wilson interval uses the effective number of rows (rows / design
    effect) and a formula's bootstrap resamples the group's base items with the score's one
    resample-index matrix; a group of one row per base item is unchanged (the two designs agree).
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    size = len(wanted_groups)
    n_groups = int(max(groups.max(initial=-1), wanted_groups.max(initial=-1))) + 1
    multi = np.zeros(n_groups, dtype=bool)
    if clusters is not None and len(groups):
        multi[wanted_groups] = multi_row_groups(groups, clusters, n_groups)[wanted_groups]
    clustered = multi[wanted_groups]
    if clustered.any():
        assert clusters is not None, "a group is clustered only when clusters are given"
        part_group, part_cluster, part_stats = _cluster_parts(groups, clusters, n_clusters, rows, multi)
        part_position = np.searchsorted(wanted_groups, part_group)
    ratios = [name for name in metrics if metric_spec(name).is_ratio]
    for name in ratios:
        successes, trials = proportion_parts(stats, name)
        if clustered.any():
            numerators, denominators = proportion_parts(part_stats, name)
            deff = ratio_design_effects(numerators, denominators, part_position, size)
            successes, trials = successes / deff, trials / deff  # deff 1 outside the clustered groups
        out[name] = wilson_interval(successes, trials, level=level)
    formulas = [name for name in metrics if name not in ratios]
    alone = np.flatnonzero(~clustered)
    bounds = group_bootstrap(
        groups, rows, wanted_groups[alone], [labels[int(i)] for i in alone], formulas, n_resamples, seed, level
    )
    for name in formulas:
        out[name] = (np.full(size, np.nan), np.full(size, np.nan))
        out[name][0][alone], out[name][1][alone] = bounds[name]
    if clustered.any() and formulas and n_resamples > 0:
        chosen = np.flatnonzero(clustered)
        with _one_blas_thread():
            bounds = cluster_group_bootstrap(
                part_group,
                part_cluster,
                part_stats,
                cluster_counts(n_clusters, n_resamples, seed),
                wanted_groups[chosen],
                formulas,
                level,
            )
        for name in formulas:
            out[name][0][chosen], out[name][1][chosen] = bounds[name]
    return out
