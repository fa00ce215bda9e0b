"""Two RefusalBench runs side by side: how each model's metrics moved, and which items' decisions changed.

Metric changes are run B − run A with the interval of a difference of two independent
estimates (``core.stats.independent_difference``, from each run's bootstrap standard errors),
as refresh rounds are compared. Items are matched by ``item_id`` when the runs share ids (two
evaluations of one benchmark), else by base item and lever (two rounds, each with its own
generated items).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from refusalbench.tasks.core.stats import independent_difference
from refusalbench.tasks.viewer.data import RefusalBenchRun

# The metrics compared, as (metrics.json name, label).
COMPARED = (
    ("calibrated_refusal_score", "CRS"),
    ("answer_accuracy", "Answer acc."),
    ("refusal_accuracy", "Refusal acc."),
    ("false_refusal_rate", "FRR"),
    ("missed_refusal_rate", "MRR"),
)
MAX_CHANGED = 500


@dataclass
class Comparison:
    a: str
    b: str
    matched_by: str  # "item_id" | "base_id + lever_id"
    matched: int
    metric_rows: list[dict[str, Any]]
    changed: list[dict[str, Any]]
    changed_total: int


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def model_in(document: dict[str, Any], model: str) -> bool:
    return model in (document.get("models") or {})


def metric_changes(a: RefusalBenchRun, b: RefusalBenchRun) -> list[dict[str, Any]]:
    """Per model in both runs and metric: A's and B's value and interval, B − A and its interval."""
    if not a.metrics or not b.metrics:
        return []
    documents = (a.metrics, b.metrics)
    rows = []
    for model in [m for m in b.models if all(model_in(d, m) for d in documents)]:
        for metric, label in COMPARED:
            values = [_number(d["models"][model].get(metric)) for d in documents]
            errors = [_number((d.get("standard_errors") or {}).get(model, {}).get(metric)) for d in documents]
            difference, low, high, p = independent_difference(
                np.array([values[0]]), np.array([errors[0]]), np.array([values[1]]), np.array([errors[1]])
            )
            rows.append(
                {
                    "model": model,
                    "metric": metric,
                    "label": label,
                    "a": values[0],
                    "b": values[1],
                    "a_interval": (documents[0].get("intervals") or {}).get(model, {}).get(metric),
                    "b_interval": (documents[1].get("intervals") or {}).get(model, {}).get(metric),
                    "difference": float(difference[0]),
                    "low": float(low[0]),
                    "high": float(high[0]),
                    "p": float(p[0]),
                }
            )
    return rows


def _keys(run: RefusalBenchRun, by_id: bool) -> list[str]:
    if by_id:
        return [str(k) for k in run.items["item_id"]]
    return [f"{base}|{lever}" for base, lever in zip(run.items["base_id"], run.items["lever_id"], strict=True)]


def compare_runs(a: RefusalBenchRun, b: RefusalBenchRun, limit: int = MAX_CHANGED) -> Comparison:
    """Metric changes, and the (item, model) pairs whose decision differs between the runs."""
    shared_ids = set(a.row_of) & set(b.row_of)
    by_id = bool(shared_ids)
    keys_a, keys_b = _keys(a, by_id), _keys(b, by_id)
    where_a = {key: i for i, key in enumerate(keys_a)}
    pairs = [(where_a[key], j) for j, key in enumerate(keys_b) if key in where_a]
    in_a = np.array([i for i, _ in pairs], dtype=int)
    in_b = np.array([j for _, j in pairs], dtype=int)
    changed: list[dict[str, Any]] = []
    total = 0
    for model in [m for m in b.models if m in a.models]:
        before, after = a.decision[model][in_a], b.decision[model][in_b]
        moved = np.flatnonzero(before != after)  # elementwise over object arrays: None == None
        total += len(moved)
        for k in moved[: max(limit - len(changed), 0)]:
            i, j = int(in_a[k]), int(in_b[k])
            changed.append(
                {
                    "item_a": str(a.items["item_id"].iat[i]),
                    "item_b": str(b.items["item_id"].iat[j]),
                    "question": b.items["question"].iat[j],
                    "class": b.items["perturbation_class"].iat[j],
                    "intensity": b.items["intensity"].iat[j],
                    "expected": b.items["expected"].iat[j],
                    "model": model,
                    "decision_a": before[k],
                    "decision_b": after[k],
                    "verdict_a": a.verdict[model][i],
                    "verdict_b": b.verdict[model][j],
                }
            )
    return Comparison(
        a=a.name,
        b=b.name,
        matched_by="item_id" if by_id else "base_id + lever_id",
        matched=len(pairs),
        metric_rows=metric_changes(a, b),
        changed=changed,
        changed_total=total,
    )
