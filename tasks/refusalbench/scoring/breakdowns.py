"""Tables beside the overall metrics: breakdowns, confusion, reliability data, champions.

- :func:`breakdown`: every metric per model × value of one dimension (perturbation class,
  intensity, lever, domain, generator), with an interval per row (:mod:`.intervals`), in
  the long layout of ``breakdown.parquet``; :func:`overall_rows` puts the overall metrics
  and their bootstrap intervals in the same layout.
- :func:`confusion`: counts per model × expected × predicted.
- :func:`refusal_rate_by_intensity`, :func:`class_intensity_grid`: the data behind the
  intensity curves and the class × intensity heatmaps.
- :func:`calibration_table`: the data behind the reliability diagrams.
- :func:`domain_champions`: the best model per domain.

Output tables carry plain strings, not the prepared frame's categoricals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from refusalbench.tasks.refusalbench.scoring.calibration import N_VERBAL_BINS, bin_label
from refusalbench.tasks.refusalbench.scoring.clusters import cluster_codes
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.intervals import breakdown_intervals
from refusalbench.tasks.refusalbench.scoring.metrics import metrics_from_stats, model_codes, run_metrics
from refusalbench.tasks.refusalbench.scoring.row_statistics import confidence_block, row_arrays, sufficient_stats
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec, single_document_metrics
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES

BREAKDOWN_COLUMNS: tuple[str, ...] = (
    "model",
    "group",
    "value",
    "metric",
    "estimate",
    "ci_low",
    "ci_high",
    "n",
)


def empty_breakdown() -> pd.DataFrame:
    """A breakdown table with its columns and dtypes but no rows."""
    return pd.DataFrame(
        {
            c: pd.Series(dtype=t)
            for c, t in zip(BREAKDOWN_COLUMNS, ["str", "str", "str", "str", "float64", "float64", "float64", "int64"])
        }
    )


def breakdown(
    df: pd.DataFrame,
    by: str,
    metrics: Sequence[str] | None = None,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Metrics per model × value of ``by`` (long: model, group, value, metric, estimate, ci_low, ci_high, n).

    Rows whose ``by`` value is missing are left out; an absent or all-missing column gives
    an empty frame. ``group`` is the dimension name; ``n`` the rows in that model × value.
    ``metrics`` defaults to :func:`~.metrics.run_metrics`. Intervals: Wilson for
    proportions, ``n_resamples`` bootstrap resamples within the group for the rest, both
    respecting base items where a group holds several rows of one (see :mod:`.intervals`).
    """
    df = ensure_prepared(df)
    if by not in df.columns or df[by].isna().all():
        return empty_breakdown()
    names = list(metrics) if metrics is not None else list(run_metrics(df))
    # Group key = model code × value code: two factorizations, no per-row tuples.
    model_of_row, models = model_codes(df)
    value_codes, values_found = pd.factorize(df[by], sort=True, use_na_sentinel=True)
    present = value_codes >= 0
    n_values = len(values_found)
    rows = {k: v[present] for k, v in row_arrays(df).items()}
    keys = (model_of_row[present] * n_values + value_codes[present]).astype(np.int64)
    stats = sufficient_stats(keys, len(models) * n_values, rows)
    used = np.flatnonzero(stats[:, 0] > 0)
    stats = stats[used]
    values = metrics_from_stats(stats, names)
    sizes = stats[:, 0].astype(np.int64)
    model_of = np.asarray(models, dtype=object)[used // n_values]
    value_of = np.asarray([str(v) for v in values_found], dtype=object)[used % n_values]
    labels = [f"{by}\0{m}\0{v}" for m, v in zip(model_of, value_of)]
    clusters, n_clusters = cluster_codes(df)
    bounds = breakdown_intervals(
        stats,
        keys,
        rows,
        used,
        labels,
        names,
        n_resamples,
        seed,
        level,
        clusters=clusters[present],
        n_clusters=n_clusters,
    )
    # One frame of the metrics one after another (the rows and dtypes of one frame per metric, concatenated).
    k = len(names)
    return pd.DataFrame(
        {
            "model": np.tile(model_of, k),
            "group": by,
            "value": np.tile(value_of, k),
            "metric": np.repeat(np.asarray(names, dtype=object), len(used)),
            "estimate": np.concatenate([values[name] for name in names]),
            "ci_low": np.concatenate([bounds[name][0] for name in names]),
            "ci_high": np.concatenate([bounds[name][1] for name in names]),
            "n": np.tile(sizes, k),
        }
    )


def overall_rows(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]],
    names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The overall metrics (default: the single-document ones) with their intervals in the breakdown's long layout."""
    names = single_document_metrics() if names is None else names
    records = []
    for model, values in metrics.items():
        for name in names:
            low, high = intervals.get(model, {}).get(name, (math.nan, math.nan))
            records.append(
                {
                    "model": model,
                    "group": "overall",
                    "value": "all",
                    "metric": name,
                    "estimate": values[name],
                    "ci_low": low,
                    "ci_high": high,
                    "n": int(values["n"]),
                }
            )
    return pd.DataFrame.from_records(records, columns=list(BREAKDOWN_COLUMNS)) if records else empty_breakdown()


def confusion(df: pd.DataFrame) -> pd.DataFrame:
    """Counts per model × expected × predicted (predicted = ANSWER or a canonical code)."""
    df = ensure_prepared(df)
    table = (
        df.groupby(["model", "expected", "decision"], sort=True, observed=True)
        .size()
        .reset_index(name="count")
        .rename(columns={"decision": "predicted"})
    )
    table["count"] = table["count"].astype(np.int64)
    return _plain_strings(table[["model", "expected", "predicted", "count"]], ["model", "expected", "predicted"])


def _plain_strings(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Output tables carry plain strings, not the prepared frame's categoricals."""
    return table.assign(**{c: table[c].astype(str) for c in columns})


def _intensity_order(values: Iterable[str]) -> list[str]:
    known = [i for i in INTENSITIES if i in set(values)]
    return known + sorted(set(values) - set(INTENSITIES))


def refusal_rate_by_intensity(df: pd.DataFrame) -> pd.DataFrame:
    """Refusal rate per model × intensity (LOW, MEDIUM, HIGH first): model, intensity, refusal_rate, n."""
    df = ensure_prepared(df)
    if "intensity" not in df.columns or df["intensity"].isna().all():
        return pd.DataFrame({"model": [], "intensity": [], "refusal_rate": [], "n": []})
    table = (
        df[df["intensity"].notna()]
        .groupby(["model", "intensity"], sort=True, observed=True)
        .agg(refusal_rate=("refused", "mean"), n=("refused", "size"))
        .reset_index()
    )
    table = _plain_strings(table, ["model", "intensity"])
    order = {v: i for i, v in enumerate(_intensity_order(table["intensity"]))}
    table = table.sort_values(["model", "intensity"], key=lambda s: s.map(order) if s.name == "intensity" else s)
    return table.reset_index(drop=True)


def class_intensity_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Share of correct responses per model × perturbation class × intensity (heatmap data)."""
    df = ensure_prepared(df)
    needed = ("perturbation_class", "intensity")
    if any(c not in df.columns or df[c].isna().all() for c in needed):
        return pd.DataFrame({"model": [], "perturbation_class": [], "intensity": [], "correct_rate": [], "n": []})
    present = df[df["perturbation_class"].notna() & df["intensity"].notna()]
    return (
        present.groupby(["model", "perturbation_class", "intensity"], sort=True, observed=True)
        .agg(correct_rate=("correct", "mean"), n=("correct", "size"))
        .reset_index()
        .pipe(_plain_strings, ["model", "perturbation_class", "intensity"])
    )


def calibration_table(df: pd.DataFrame) -> pd.DataFrame:
    """Reliability-diagram data: model, scope (all|answer|refusal), bin, label, kind, n,
    mean_confidence, accuracy — only bins holding at least one response."""
    df = ensure_prepared(df)
    codes, models = model_codes(df)
    stats = sufficient_stats(codes, len(models), row_arrays(df))
    block = confidence_block(stats)
    scopes = {"all": block.sum(axis=1), "answer": block[:, 0], "refusal": block[:, 1]}
    records = []
    for scope, cells in scopes.items():
        for m, b in zip(*np.nonzero(cells[..., 0] > 0)):
            count, correct, confidence = cells[m, b]
            records.append(
                {
                    "model": models[m],
                    "scope": scope,
                    "bin": int(b),
                    "label": bin_label(int(b)),
                    "kind": "verbal" if b < N_VERBAL_BINS else "float",
                    "n": int(count),
                    "mean_confidence": confidence / count,
                    "accuracy": correct / count,
                }
            )
    columns = ["model", "scope", "bin", "label", "kind", "n", "mean_confidence", "accuracy"]
    table = pd.DataFrame.from_records(records, columns=columns)
    return table.sort_values(["model", "scope", "bin"], kind="stable").reset_index(drop=True)


CHAMPION_METRICS: tuple[str, ...] = ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy")


def domain_champions(df: pd.DataFrame, metrics: Sequence[str] = CHAMPION_METRICS) -> pd.DataFrame:
    """Best model per domain for each metric: domain, metric, model, estimate, n.

    Best is the highest estimate, or the lowest for a metric declared lower-is-better. Ties
    go to the alphabetically first model; a domain where every model's metric is NaN has no
    champion for it. Empty when there is no domain column.
    """
    table = breakdown(df, "domain", list(metrics), n_resamples=0)
    columns = ["domain", "metric", "model", "estimate", "n"]
    if table.empty:
        return pd.DataFrame({c: [] for c in columns})
    table = table[table["metric"].isin(list(metrics)) & table["estimate"].notna()]
    lower = [name for name in metrics if metric_spec(name).higher_is_better is False]
    table = table.assign(goodness=table["estimate"].where(~table["metric"].isin(lower), -table["estimate"]))
    table = table.sort_values(["value", "metric", "goodness", "model"], ascending=[True, True, False, True])
    best = table.groupby(["value", "metric"], sort=True).head(1)
    return best.rename(columns={"value": "domain"})[columns].reset_index(drop=True)
