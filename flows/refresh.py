"""Scheduled refresh rounds: generative evaluation with fresh samples every round.

Each round draws a new seed, hence a new base sample and a new lever assignment,
generates and verifies a fresh benchmark, evaluates the configured targets, and stores
everything under ``<out_root>/round-<UTC time>-s<seed>/``. It then compares the round
with earlier ones: a per-model trend of the metrics with their 95% intervals, and a flag
for every model whose score left the interval of its previous round.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

import pandas as pd
from prefect import flow

from refusalbench.flows.common import configured
from refusalbench.flows.main import check_main_inputs, main_flow
from refusalbench.tasks.store import ArtifactStore

TREND_METRICS = ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy", "false_refusal_rate",
                 "missed_refusal_rate", "detection_f1")
FLAG_METRIC = "calibrated_refusal_score"


def round_name(now: dt.datetime, seed: int) -> str:
    return f"round-{now.strftime('%Y%m%dT%H%M%SZ')}-s{seed}"


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
    rounds = sorted({name.split("/", 1)[0] for name in root.list() if name.startswith("round-") and name.endswith("/metrics.json")})
    rows: list[dict[str, Any]] = []
    for round_id in rounds[-limit:]:
        rows.extend(round_rows(round_id, root.child(round_id).read_json("metrics.json")))
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


@flow(name="refusalbench-refresh", log_prints=True)
def refresh_flow(config_path: str, out_root: str, rounds_to_compare: int = 5, seed: int | None = None) -> dict[str, Any]:
    from refusalbench.flows.evaluation import build_report_for
    from refusalbench.tasks.ui_artifacts import publish_markdown, publish_table

    cfg = check_main_inputs(config_path)
    seed = secrets.randbelow(2**31) if seed is None else seed  # a fresh round: new sample, new levers
    now = dt.datetime.now(dt.timezone.utc)
    root = ArtifactStore(out_root)
    round_id = round_name(now, seed)
    round_store = root.child(round_id)
    print(f"refresh round {round_id} (seed {seed})")
    configured(main_flow, cfg, round_store.uri(""))(config_path, round_store.uri(""), seed)
    trend = collect_trend(root, rounds_to_compare)
    flags = flag_moves(trend)
    round_store.write_frame("round_trend.parquet", trend)
    round_store.write_json("trend.json", {"rounds": sorted(trend["round"].unique().tolist()) if len(trend) else [],
                                          "flags": flags, "metric": FLAG_METRIC})
    report = build_report_for(round_store.uri(""))  # rebuilt so it shows the trend across rounds
    publish_table("refresh-trend", trend.where(trend.notna(), None).to_dict(orient="records"),
                  "Metrics per model and round (95% intervals)")
    if flags:
        lines = [f"- **{f['model']}**: {f['metric']} {f['previous']:.3f} -> {f['latest']:.3f} ({f['direction']}, outside "
                 f"[{f['previous_interval'][0]:.3f}, {f['previous_interval'][1]:.3f}])" for f in flags]
        publish_markdown("refresh-flags", "# Models that moved beyond their interval\n\n" + "\n".join(lines))
    return {"round": round_id, "seed": seed, "report": report, "flags": flags, "rounds": int(trend["round"].nunique()) if len(trend) else 0}


def run_refresh(config_path: str, out_root: str, rounds_to_compare: int = 5, seed: int | None = None) -> dict[str, Any]:
    check_main_inputs(config_path)
    return refresh_flow(config_path, out_root, rounds_to_compare, seed)
