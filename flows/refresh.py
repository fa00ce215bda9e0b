"""Scheduled refresh rounds: generative evaluation with fresh samples every round.

Each round draws a new seed, hence a new base sample and a new lever assignment,
generates and verifies a fresh benchmark, evaluates the configured targets, and stores
everything under ``<out_root>/round-<UTC time>-s<seed>/``. It then compares the round
with earlier ones (``tasks.trend``): a per-model trend of the metrics with their 95%
intervals, and a flag for every model whose score left the interval of its previous round.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from prefect import flow

from refusalbench.flows.common import configured
from refusalbench.flows.main import check_main_inputs, main_flow
from refusalbench.tasks.refusalbench.outputs import build_report_for
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.trend import collect_trend, flag_moves, flags_markdown, round_name, rounds_in, save_trend
from refusalbench.tasks.pipeline.ui import publish_markdown, publish_table


@flow(name="refusalbench-refresh", log_prints=True)
def refresh_flow(config_path: str, out_root: str, rounds_to_compare: int = 5, seed: int | None = None) -> dict[str, Any]:
    cfg = check_main_inputs(config_path)
    seed = secrets.randbelow(2**31) if seed is None else seed  # a fresh round: new sample, new levers
    root = ArtifactStore(out_root)
    round_id = round_name(dt.datetime.now(dt.timezone.utc), seed)
    round_folder = root.child(round_id).uri("")
    print(f"refresh round {round_id} (seed {seed})")
    configured(main_flow, cfg, round_folder)(config_path, round_folder, seed)
    trend = collect_trend(root, rounds_to_compare)
    flags = flag_moves(trend)
    save_trend(root.child(round_id), trend, flags)
    report = build_report_for(round_folder)  # rebuilt so it shows the trend across rounds
    publish_table("refresh-trend", trend.where(trend.notna(), None).to_dict(orient="records"),
                  "Metrics per model and round (95% intervals)")
    if flags:
        publish_markdown("refresh-flags", flags_markdown(flags))
    return {"round": round_id, "seed": seed, "report": report, "flags": flags, "rounds": len(rounds_in(trend))}
