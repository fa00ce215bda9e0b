"""Bootstrap 95% intervals and standard errors of every metric: base items resampled (clusters).

Two figures per model and metric: the *cluster* one, which every interval of the score uses,
resamples base items with all their benchmark items (:mod:`.clusters`: the items of one base item
are not independent), the same draws for every model; the *i.i.d.* one resamples the model's
rows as if independent, and is kept beside it in metrics.json so the difference shows. The
cluster figure multiplies one resample-index matrix (resamples × base items) with each model's
per-base-item sufficient statistics: one product for many models, no loop over resamples.

The i.i.d. figure (and the cluster figure of a model whose base items hold one row each, where
the two are the same) is computed as follows.
The bootstrap draws, per model, multinomial counts over the model's distinct row *types*
(a type = the indicator flags + confidence bin + confidence value) — the same
distribution as resampling rows with replacement — and multiplies them with the per-type
sufficient statistics: 1,000 resamples cost one small matrix product, not 1,000 group-bys.

Decisions the contract leaves open:
- Percentile intervals; resamples where a metric is undefined (e.g. no refusal drawn) are
  ignored for that metric; the interval is NaN if all are.
- The i.i.d. figure: each model uses its own generator seeded by (seed, crc32(model)); the
  cluster figure: one resample-index matrix seeded by (seed, "base items") over the sorted base
  items. Either way adding a model evaluated on the same items leaves the others' intervals unchanged.
- When a model has more than ``MAX_EXACT_TYPES`` distinct types (float confidences are
  nearly all distinct), numeric confidences are grouped on a 1/``FLOAT_GRID`` grid for the
  bootstrap only, each group carrying its exact mean; bins stay exact. The point
  estimates never use this grouping.

Standard errors (paper App. G: "non-parametric bootstrap resampling (n=1,000) to compute the
standard error (SE) and 95% confidence intervals") are the standard deviation (ddof 1) of
the same resamples' values, undefined resamples left out; NaN with fewer than two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import interval_and_error_rows, resample_counts, seeded_rng
from refusalbench.tasks.refusalbench.scoring.calibration import N_BINS
from refusalbench.tasks.refusalbench.scoring.clusters import cluster_codes, cluster_counts, multi_row_groups
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.metrics import metrics_from_stats, model_codes
from refusalbench.tasks.refusalbench.scoring.row_statistics import OUTCOME_FLAGS, row_arrays, sufficient_stats
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS, single_document_metrics

MAX_EXACT_TYPES = 4096
FLOAT_GRID = 1000  # bootstrap grouping of numeric confidences: 0.001

_FLAG_NAMES: tuple[str, ...] = (
    "answerable",
    "refused",
    "answered_correctly",
    "right_code",
    "unjudged",
    "multi",
    "eligibility_has",
    "eligibility",
    "factuality_has",
    "factuality",
    "raf_has",
    "raf",
    # last: constant on a run where every row is scored, so the types keep their order
    "scored",
    *OUTCOME_FLAGS,
)


def _row_types(
    rows: Mapping[str, np.ndarray], codes: np.ndarray, n_models: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collapse every model's rows into its distinct types in one pass: (model of each type, count per
    type, per-type statistics), sorted by model, so one model's types are a contiguous slice.

    A type is (indicator flags, confidence bin, confidence). A model with more than
    MAX_EXACT_TYPES types has its numeric confidences grouped on a 1/FLOAT_GRID grid, a type's
    confidence being the exact mean of its rows (bins stay exact). Each model's types, counts and
    means are those of grouping its rows alone (a group's rows keep their order).
    """
    flags = sum(rows[name].astype(np.int64) << bit for bit, name in enumerate(_FLAG_NAMES))
    key = flags * (N_BINS + 1) + (rows["conf_bin"].astype(np.int64) + 1)
    conf = np.where(rows["conf_bin"] >= 0, rows["conf_value"], -1.0)
    table = pd.DataFrame({"model": codes, "key": key, "grid": conf, "conf": conf})
    exact_types = table.drop_duplicates(["model", "key", "grid"])["model"].value_counts()
    coarse = np.zeros(n_models + 1, dtype=bool)
    coarse[exact_types.index[exact_types.to_numpy() > MAX_EXACT_TYPES].to_numpy()] = True
    table["grid"] = np.where(coarse[codes] & (conf >= 0), np.round(conf * FLOAT_GRID), conf)
    types = table.groupby(["model", "key", "grid"], sort=True).agg(count=("conf", "size"), conf=("conf", "mean"))
    type_key = types.index.get_level_values("key").to_numpy()
    type_flags, type_bin = type_key // (N_BINS + 1), type_key % (N_BINS + 1) - 1
    representative = {name: (type_flags >> bit & 1).astype(bool) for bit, name in enumerate(_FLAG_NAMES)}
    representative["correct"] = representative["answered_correctly"] | representative["right_code"]
    representative["conf_value"] = np.where(type_bin >= 0, types["conf"].to_numpy(), np.nan)
    representative["conf_bin"] = type_bin
    n_types = len(types)
    per_type = sufficient_stats(np.arange(n_types), n_types, representative)  # (T × K), one row per type
    return types.index.get_level_values("model").to_numpy(), types["count"].to_numpy(), per_type


def _bootstrap_one(
    type_counts: np.ndarray,
    per_type: np.ndarray,
    n_resamples: int,
    rng: np.random.Generator,
    wanted: Sequence[str],
    chunk: int = 250,
) -> dict[str, np.ndarray]:
    """Metric values of ``n_resamples`` resamples (with replacement) of one model's rows, given
    as its row types (:func:`_row_types`).

    Drawing n rows with replacement = drawing multinomial counts over the row types with
    probabilities count/n; the resample's statistics are then counts @ per-type statistics.
    """
    pieces = []
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        pieces.append(resample_counts(rng, type_counts, size) @ per_type)  # (size × T) @ (T × K)
    return metrics_from_stats(np.concatenate(pieces, axis=0), wanted)


Intervals = dict[str, dict[str, tuple[float, float]]]
Errors = dict[str, dict[str, float]]
CLUSTER, IID = "cluster", "iid"
_MODELS_PER_PRODUCT = 64  # models whose resampled statistics are computed in one product


def _iid_summary(
    rows: Mapping[str, np.ndarray],
    codes: np.ndarray,
    models: Sequence[str],
    wanted: Sequence[str],
    n_resamples: int,
    seed: int,
    level: float,
) -> tuple[Intervals, Errors]:
    """Items resampled within each model, as if independent (the figure beside the cluster one).

    The row types of every model come from one grouping; each model then draws from its own generator."""
    intervals: Intervals = {}
    errors: Errors = {}
    type_model, type_counts, per_type = _row_types(rows, codes, len(models))
    starts = np.searchsorted(type_model, np.arange(len(models) + 1))
    samples = [
        _bootstrap_one(
            type_counts[starts[i] : starts[i + 1]],
            per_type[starts[i] : starts[i + 1]].copy(),
            n_resamples,
            seeded_rng(seed, model),
            wanted,
        )
        for i, model in enumerate(models)
    ]
    _summarise(
        models,
        range(len(models)),
        {name: np.stack([s[name] for s in samples]) for name in wanted},
        level,
        intervals,
        errors,
    )
    return intervals, errors


def _summarise(
    models: Sequence[str],
    chosen: Sequence[int] | np.ndarray,
    sample: Mapping[str, np.ndarray],
    level: float,
    intervals: Intervals,
    errors: Errors,
) -> None:
    """Each chosen model's percentile interval and standard error of every metric, from ``sample``
    ({metric: (chosen models × resamples)}), into ``intervals`` and ``errors``."""
    figures = {name: interval_and_error_rows(values, level) for name, values in sample.items()}
    for j, i in enumerate(chosen):
        intervals[models[i]] = {name: figures[name][j][0] for name in sample}
        errors[models[i]] = {name: figures[name][j][1] for name in sample}


def _cluster_summary(
    rows: Mapping[str, np.ndarray],
    codes: np.ndarray,
    models: Sequence[str],
    order: np.ndarray,
    bounds: np.ndarray,
    wanted: Sequence[str],
    n_resamples: int,
    seed: int,
    level: float,
    iid: tuple[Intervals, Errors],
    clusters: np.ndarray,
    n_clusters: int,
) -> tuple[Intervals, Errors]:
    """Base items resampled, the same draws for every model (:mod:`.clusters`).

    A model none of whose base items holds two of its rows keeps its i.i.d. figure: for it,
    drawing clusters is drawing rows. The others: per-cluster statistics (clusters × statistics)
    per model, times the one resample-index matrix, in one product per batch of models.
    """
    intervals, errors = dict(iid[0]), dict(iid[1])
    grouped = np.flatnonzero(multi_row_groups(codes, clusters, len(models)))
    if grouped.size == 0:
        return intervals, errors
    counts = cluster_counts(n_clusters, n_resamples, seed)
    for start in range(0, grouped.size, _MODELS_PER_PRODUCT):
        batch = grouped[start : start + _MODELS_PER_PRODUCT]
        per_cluster = []
        for i in batch:
            idx = order[bounds[i] : bounds[i + 1]]
            per_cluster.append(sufficient_stats(clusters[idx], n_clusters, {k: v[idx] for k, v in rows.items()}))
        width = per_cluster[0].shape[1]
        resampled = (counts @ np.concatenate(per_cluster, axis=1)).reshape(n_resamples, len(batch), width)
        sample = metrics_from_stats(resampled, wanted)  # each metric: (resamples × models of the batch)
        _summarise(models, batch, {name: sample[name].T for name in wanted}, level, intervals, errors)
    return intervals, errors


def bootstrap_figures(
    df: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, tuple[Intervals, Errors]]:
    """{"cluster": (intervals, standard errors), "iid": (intervals, standard errors)} per model and metric.

    ``cluster`` resamples base items (the figure every interval of the score uses); ``iid``
    resamples each model's rows as if independent, kept beside it so the difference shows.
    """
    df = ensure_prepared(df)
    wanted = list(metrics) if metrics is not None else list(single_document_metrics())
    unknown = METRIC_SPECS.unknown(wanted)
    if unknown:
        raise ValueError(f"unknown metrics: {unknown}")
    codes, models = model_codes(df)
    rows = row_arrays(df)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(models) + 1))
    iid = _iid_summary(rows, codes, models, wanted, n_resamples, seed, level)
    clusters, n_clusters = cluster_codes(df)
    cluster = _cluster_summary(
        rows, codes, models, order, bounds, wanted, n_resamples, seed, level, iid, clusters, n_clusters
    )
    return {CLUSTER: cluster, IID: iid}


def bootstrap_summary(
    df: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    unit: str = CLUSTER,
) -> tuple[Intervals, Errors]:
    """({model: {metric: (low, high)}}, {model: {metric: standard error}}) from one set of resamples.

    Percentile intervals and bootstrap standard deviations; ``unit`` "cluster" (default) resamples
    base items, "iid" each model's rows as if independent.
    """
    return bootstrap_figures(df, metrics, n_resamples=n_resamples, seed=seed, level=level)[unit]


def bootstrap_intervals(
    df: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    unit: str = CLUSTER,
) -> Intervals:
    """{model: {metric: (low, high)}}: percentile intervals, base items resampled (``unit`` "iid": rows)."""
    return bootstrap_summary(df, metrics, n_resamples=n_resamples, seed=seed, level=level, unit=unit)[0]


def bootstrap_standard_errors(
    df: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    unit: str = CLUSTER,
) -> Errors:
    """{model: {metric: SE}}: the bootstrap standard deviation of each metric (App. G), base items resampled."""
    return bootstrap_summary(df, metrics, n_resamples=n_resamples, seed=seed, unit=unit)[1]
