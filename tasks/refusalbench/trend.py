"""The trend across refresh rounds: per-model metrics with intervals, and the models that moved.

Each refresh round is a run folder ``round-<UTC time>-s<seed>/`` under one root. The
trend is one row per (round, model) with the estimates and 95% intervals of
:data:`TREND_METRICS`; a model is flagged when its latest estimate of :data:`FLAG_METRIC`
lies outside the interval of its previous round.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd

from refusalbench.tasks.refusalbench import artifacts as rb_files
from refusalbench.tasks.refusalbench.documents import TrendDocument
from refusalbench.tasks.core.store import ArtifactStore

TREND_METRICS = ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy", "false_refusal_rate",
                 "missed_refusal_rate", "detection_f1")
FLAG_METRIC = "calibrated_refusal_score"
ROUND_PREFIX = "round-"


def round_name(now: dt.datetime, seed: int) -> str:
    return f"{ROUND_PREFIX}{now.strftime('%Y%m%dT%H%M%SZ')}-s{seed}"


def round_rows(round_id: str, metrics_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model: the round's estimates and intervals of the trend metrics."""
    rows = []
    intervals = metrics_doc.get("intervals") or {}
    for model, values in (metrics_doc.get("models") or {}).items():
        row: dict[str, Any] = {"round": round_id, "model": model}
        for metric in TREND_METRICS:
            row[metric] = values.get(metric)
            low, high = (intervals.get(model, {}).get(metric) or (None, None))
            row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = low, high
        rows.append(row)
    return rows


def collect_trend(root: ArtifactStore, limit: int) -> pd.DataFrame:
    """Trend rows of the last ``limit`` rounds under ``root`` that finished an evaluation."""
    metrics_suffix = "/" + rb_files.METRICS.name
    rounds = sorted({name.split("/", 1)[0] for name in root.list()
                     if name.startswith(ROUND_PREFIX) and name.endswith(metrics_suffix)})
    rows: list[dict[str, Any]] = []
    for round_id in rounds[-limit:]:
        rows.extend(round_rows(round_id, root.child(round_id).load(rb_files.METRICS).model_dump()))
    return pd.DataFrame(rows)


def flag_moves(trend: pd.DataFrame, metric: str = FLAG_METRIC) -> list[dict[str, Any]]:
    """Models whose latest estimate lies outside their previous round's 95% interval."""
    flags = []
    if trend.empty:
        return flags
    for model, part in trend.sort_values("round").groupby("model"):
        if len(part) < 2:
            continue
        previous, latest = part.iloc[-2], part.iloc[-1]
        low, high, value = previous[f"{metric}_ci_low"], previous[f"{metric}_ci_high"], latest[metric]
        if pd.isna(low) or pd.isna(high) or pd.isna(value):
            continue
        if value < low or value > high:
            flags.append({"model": model, "metric": metric, "previous_round": previous["round"], "round": latest["round"],
                          "previous": float(previous[metric]), "previous_interval": [float(low), float(high)],
                          "latest": float(value), "direction": "up" if value > high else "down"})
    return flags


def rounds_in(trend: pd.DataFrame) -> list[str]:
    return sorted(trend["round"].unique().tolist()) if len(trend) else []


def save_trend(round_store: ArtifactStore, trend: pd.DataFrame, flags: list[dict[str, Any]]) -> None:
    """``round_trend.parquet`` and ``trend.json`` into the round's run folder."""
    round_store.save(rb_files.ROUND_TREND, trend)
    round_store.save(rb_files.TREND, TrendDocument(rounds=rounds_in(trend), flags=flags, metric=FLAG_METRIC))


def flags_markdown(flags: list[dict[str, Any]]) -> str:
    lines = [f"- **{f['model']}**: {f['metric']} {f['previous']:.3f} -> {f['latest']:.3f} ({f['direction']}, outside "
             f"[{f['previous_interval'][0]:.3f}, {f['previous_interval'][1]:.3f}])" for f in flags]
    return "# Models that moved beyond their interval\n\n" + "\n".join(lines)
