"""``refusalbench plan``: what a run of a config would take, and with ``--rounds`` how
large a refresh round must be for the error a team accepts (``tasks/refusalbench/rounds/round_sizing.py``).

``--format table`` is for people; ``json`` is the whole plan (``tasks/llm/plan_results.py``); ``csv``
is one row per stage and model, then per stage and for the run, for a spreadsheet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from refusalbench.flows.listing import ListFormat, all_keys, csv_text
from refusalbench.tasks.llm.plan_results import Plan


def plan_rows(plan: Plan) -> list[dict[str, Any]]:
    """The plan as CSV rows: one per stage and model (every field of its ``ModelPlan``), then one
    per stage and one for the run (``model`` empty)."""
    rows: list[dict[str, Any]] = []
    for stage, planned in plan.stages.items():
        for model, entry in planned.models.items():
            rows.append({"stage": stage, "model": model, **entry.model_dump(mode="json")})
    for stage, planned in plan.stages.items():
        rows.append({"stage": stage, "model": "", **planned.model_dump(mode="json", exclude={"models", "by_model"})})
    rows.append({"stage": "total", "model": "", **plan.total.model_dump(mode="json")})
    return rows


def plan_output(
    config: Path,
    *,
    fmt: ListFormat,
    latency: float,
    benchmark: str | None,
    all_models: bool,
    rounds: int | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    per_stratum: bool = False,
) -> str:
    """The plan as text or JSON; the round sizing added (``round_sizing``) when any of its options is given."""
    from refusalbench.flows.common import usable_models
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.knowornot.run_plan import plan_knowornot
    from refusalbench.tasks.refusalbench.plan.estimate import plan_run, plan_table
    from refusalbench.tasks.refusalbench.rounds.round_sizing import round_sizing, sizing_text

    cfg = load_config(config)
    available = None
    if cfg.skip_unavailable and not all_models:
        # The run would skip these: credentials and cached weights only, no endpoint probe.
        available = usable_models(cfg, cfg.used_models(), probe=False)
    if cfg.knowornot is not None and cfg.generation is None and cfg.evaluation is None and benchmark is None:
        result = plan_knowornot(cfg, latency_s=latency, available=available)
    else:
        result = plan_run(cfg, latency_s=latency, benchmark=benchmark, available=available)
    sizing = None
    if rounds is not None or epsilon is not None or delta is not None or per_stratum:
        sizing = round_sizing(
            cfg,
            rounds or cfg.refresh.rounds,
            epsilon if epsilon is not None else 0.05,
            delta if delta is not None else cfg.refresh.delta,
            per_stratum=per_stratum,
        )
    if fmt == ListFormat.csv:
        rows = plan_rows(result)
        return csv_text(rows, all_keys(rows, [])).rstrip("\n")
    if fmt == ListFormat.json:
        document = result.model_dump(mode="json")
        if sizing is not None:
            document["round_sizing"] = sizing.model_dump(mode="json")
        return json.dumps(document, indent=2)
    return plan_table(result) + ("\n\n" + sizing_text(sizing) if sizing is not None else "")
