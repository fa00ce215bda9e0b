"""Static benchmark vs a fresh round (paper §3.1, Theorem 3.1): does a model score higher on the fixed set?

A static set's score drifts once models have seen its items; a fresh round's does not. The check
evaluates the same targets on both sets and compares them per model: the overall score and the score
of each class × intensity stratum of calibrated refusal score, answer accuracy and refusal accuracy,
each computed by the scoring package's metric functions (the numbers ``metrics.json`` shows).

The test, in one place:

- gap = fresh − static, so a negative gap means the model does worse on items it cannot have seen;
- the two sets are independent samples: each resample draws the static set's base items with
  replacement and, independently, the fresh set's (the cluster bootstrap of ``scoring/clusters.py``,
  each base item with all of its benchmark items); the gap's 95% interval is the percentile interval of
  the resampled gaps and its p-value the two-sided percentile test (``stats.bootstrap_p_values``);
- the overall p-values of every model × metric are one family, adjusted with Benjamini-Hochberg
  (``stats.bh_adjust``) at ``refresh.fdr``; the strata's p-values are a second family, adjusted the same
  way. A gap is flagged when its adjusted p-value is at most the rate and the gap is negative; a model
  is flagged when one of its overall gaps is;
- a gap that fewer than ``stats.MIN_CLUSTERS`` base items support in either set (base items with a row
  in the metric's denominator) gets no interval, no p-value and no flag: "insufficient data".

The overall figures are computed over the strata both sets hold, so a stratum only one set covers
does not pass for contamination.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import (
    MIN_CLUSTERS,
    bh_adjust,
    bootstrap_p_values,
    enough_clusters,
    percentile_interval,
    resampled_cluster_sums,
    seeded_rng,
)
from refusalbench.tasks.core.store import split_uri
from refusalbench.tasks.refusalbench.scoring.clusters import cluster_codes
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.metrics import metrics_from_stats
from refusalbench.tasks.refusalbench.scoring.row_statistics import row_arrays, stat_sum, sufficient_stats
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec
from refusalbench.tasks.refusalbench.taxonomy import UnknownName, parse_stratum

SCHEMA_VERSION = "1"
FILE = "contamination.json"
HTML_FILE = "contamination.html"
STATIC_FOLDER, FRESH_FOLDER = "static", "fresh"
METRICS: tuple[str, ...] = ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy")
OVERALL = "overall"
LEVEL = 0.95
DIRECTION = (
    "gap = fresh - static; a model is flagged when a gap is significantly negative (it does worse on the "
    "fresh items than on the static set's, as a model that has seen the static items would)"
)
TEST = (
    "independent cluster bootstrap: base items resampled within each set, independently; 95% percentile "
    "interval of the gap; two-sided percentile p-value; Benjamini-Hochberg across models x metrics (overall), "
    "and across models x metrics x strata (per stratum); no test below stats.MIN_CLUSTERS base items"
)


def stratum_name(perturbation_class: str, intensity: str) -> str:
    return f"{perturbation_class}/{intensity}"


def static_strata(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """The class × intensity strata of a static set's items (``(class, intensity)`` pairs), as
    ``generation.strata`` spells them, in sorted order; pairs outside the taxonomy are left out."""
    found = set()
    for perturbation_class, intensity in pairs:
        try:
            found.add(stratum_name(*parse_stratum(stratum_name(perturbation_class, intensity))))
        except UnknownName:
            continue
    return sorted(found)


def file_sha256(uri: str) -> str:
    store, name = split_uri(uri)
    return hashlib.sha256(store.read_bytes(name)).hexdigest()


def _strata_column(frame: pd.DataFrame) -> pd.Series:
    return frame["perturbation_class"].astype(str) + "/" + frame["intensity"].astype(str)


def _support(per_cluster: np.ndarray, metric: str) -> int:
    """Base items with at least one scored row in ``metric``'s denominator (a formula: its scarcest input)."""
    spec = metric_spec(metric)
    if spec.formula is not None:
        return min(_support(per_cluster, name) for name in spec.of)
    return int((stat_sum(per_cluster, spec.denominator) > 0).sum())


def _cluster_stats(rows: pd.DataFrame) -> np.ndarray:
    """(base items × statistics) of one model's rows in one set (its base items, :mod:`.clusters`)."""
    if rows.empty:
        return np.zeros((0, 1))
    codes, n_clusters = cluster_codes(rows)
    return sufficient_stats(codes, n_clusters, row_arrays(rows))


def _figures(per_cluster: np.ndarray) -> dict[str, Any]:
    """The metrics of one set's rows, their rows and base items, and each metric's supporting base items."""
    if per_cluster.shape[0] == 0:
        return {name: None for name in METRICS} | {"base_items": 0, "support": dict.fromkeys(METRICS, 0)}
    values = metrics_from_stats(per_cluster.sum(axis=0), METRICS)
    out: dict[str, Any] = {name: _number(values[name]) for name in METRICS}
    out["base_items"] = int(per_cluster.shape[0])
    out["support"] = {name: _support(per_cluster, name) for name in METRICS}
    return out


def _number(value: Any) -> float | None:
    number = float(value)
    return None if math.isnan(number) else number


def _draws(per_cluster: np.ndarray, label: str, n_resamples: int, seed: int) -> dict[str, np.ndarray]:
    sums = resampled_cluster_sums(per_cluster, seeded_rng(seed, label), n_resamples)
    return metrics_from_stats(sums, METRICS)


def _comparison(
    static: np.ndarray, fresh: np.ndarray, label: str, n_resamples: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(static figures, fresh figures, gaps, intervals and p-values) of one model on one scope."""
    a, b = _figures(static), _figures(fresh)
    gap = {m: None if a[m] is None or b[m] is None else b[m] - a[m] for m in METRICS}
    tests: dict[str, Any] = {}
    enough = {m: enough_clusters(min(a["support"][m], b["support"][m])) for m in METRICS}
    drawn_a = _draws(static, f"contamination/static/{label}", n_resamples, seed) if any(enough.values()) else {}
    drawn_b = _draws(fresh, f"contamination/fresh/{label}", n_resamples, seed) if any(enough.values()) else {}
    for m in METRICS:
        n = min(a["support"][m], b["support"][m])
        if not enough[m] or gap[m] is None:
            tests[m] = {"interval": None, "p_value": None, "support": n, "note": f"insufficient data (n = {n})"}
            continue
        differences = drawn_b[m] - drawn_a[m]
        low, high = percentile_interval(differences, LEVEL)
        p = float(bootstrap_p_values(differences[None, :], np.array([gap[m]]))[0])
        tests[m] = {"interval": [_number(low), _number(high)], "p_value": _number(p), "support": n, "note": None}
    return a, b, gap, tests


def _model_entry(
    static: pd.DataFrame, fresh: pd.DataFrame, model: str, strata: list[str], n_resamples: int, seed: int
) -> dict[str, Any]:
    entry: dict[str, Any] = {part: {} for part in ("static", "fresh", "gap", "ci")}
    for scope in [OVERALL, *strata]:
        a, b = static[static["model"] == model], fresh[fresh["model"] == model]
        if scope != OVERALL:
            a, b = a[a["_stratum"] == scope], b[b["_stratum"] == scope]
        parts = _comparison(_cluster_stats(a), _cluster_stats(b), f"{model}/{scope}", n_resamples, seed)
        for part, value in zip(("static", "fresh", "gap", "ci"), parts):
            entry[part][scope] = value
    return entry


def _adjust(entries: Mapping[str, dict[str, Any]], scopes: list[str], fdr: float) -> None:
    """Benjamini-Hochberg over the tests of ``scopes`` of every model, each test marked flagged or not."""
    tests = [entry["ci"][scope][m] for entry in entries.values() for scope in scopes for m in METRICS]
    gaps = [entry["gap"][scope][m] for entry in entries.values() for scope in scopes for m in METRICS]
    adjusted = bh_adjust([math.nan if t["p_value"] is None else t["p_value"] for t in tests])
    for test, gap, q in zip(tests, gaps, adjusted):
        test["adjusted_p_value"] = _number(q)
        test["flagged"] = bool(not math.isnan(q) and q <= fdr and gap is not None and gap < 0)


def contamination_document(
    static: pd.DataFrame,
    fresh: pd.DataFrame,
    static_facts: dict[str, Any],
    fresh_facts: dict[str, Any],
    *,
    fdr: float,
    n_resamples: int,
    seed: int,
) -> dict[str, Any]:
    """``contamination.json`` from the two sets' judged rows (``judged.parquet``) and what each set is."""
    static, fresh = ensure_prepared(static), ensure_prepared(fresh)
    static, fresh = static.assign(_stratum=_strata_column(static)), fresh.assign(_stratum=_strata_column(fresh))
    strata = sorted(set(static["_stratum"]) & set(fresh["_stratum"]))
    static, fresh = static[static["_stratum"].isin(strata)], fresh[fresh["_stratum"].isin(strata)]
    models = sorted(set(static["model"].astype(str)) & set(fresh["model"].astype(str)))
    entries = {m: _model_entry(static, fresh, m, strata, n_resamples, seed) for m in models}
    _adjust(entries, [OVERALL], fdr)
    _adjust(entries, strata, fdr)
    for entry in entries.values():
        entry["flagged_metrics"] = [m for m in METRICS if entry["ci"][OVERALL][m]["flagged"]]
        entry["flagged"] = bool(entry["flagged_metrics"])
    return {
        "schema_version": SCHEMA_VERSION,
        "direction": DIRECTION,
        "test": TEST,
        "fdr": fdr,
        "level": LEVEL,
        "resamples": n_resamples,
        "min_clusters": MIN_CLUSTERS,
        "metrics": list(METRICS),
        "strata": strata,
        "static": static_facts,
        "fresh": fresh_facts,
        "models": entries,
    }


def terminal_rows(document: Mapping[str, Any]) -> list[list[str]]:
    """One row per model and metric: static, fresh, gap [interval], adjusted p, flag."""
    rows = []
    for model, entry in sorted(document.get("models", {}).items()):
        for m in document.get("metrics", METRICS):
            test = entry["ci"][OVERALL][m]
            rows.append(
                [
                    model,
                    metric_spec(m).label,
                    _fmt(entry["static"][OVERALL][m]),
                    _fmt(entry["fresh"][OVERALL][m]),
                    gap_text(entry["gap"][OVERALL][m], test),
                    "—" if test.get("adjusted_p_value") is None else f"{test['adjusted_p_value']:.3f}",
                    "FLAGGED" if test.get("flagged") else "",
                ]
            )
    return rows


TERMINAL_HEADER = ["model", "metric", "static", "fresh", "gap [95% CI]", "adj. p", "flag"]


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def gap_text(gap: float | None, test: Mapping[str, Any]) -> str:
    """``-0.250 [-0.400, -0.100]``, or the gap with "insufficient data (n = K)" where too few base items."""
    if gap is None:
        return "—"
    if test.get("interval") is None:
        return f"{gap:+.3f} ({test.get('note') or 'no interval'})"
    low, high = test["interval"]
    return f"{gap:+.3f} [{low:+.3f}, {high:+.3f}]"
