"""Scheduled refresh rounds: generative evaluation with fresh samples every round.

Each round draws a new seed, hence a new base sample and a new lever assignment,
generates and verifies a fresh benchmark, evaluates the configured targets, and stores
everything under ``<out_root>/round-<UTC time>-s<seed>/``. It then compares the round
with earlier ones (``tasks/refusalbench/rounds/trend.py``): a per-model trend of the metrics with their
95% intervals, and the changes since the previous round that are significant at the configured
false-discovery rate. What the run shows in the UI is ``tasks/pipeline/refusalbench/refresh_step.py``.
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import configured
from refusalbench.flows.contamination import round_contamination
from refusalbench.flows.main import check_main_inputs, main_flow
from refusalbench.flows.results import RefreshResult
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.budget import budget_span
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.refusalbench.freshness_step import record_freshness
from refusalbench.tasks.pipeline.refusalbench.refresh_rounds import (
    finish_round,
    record_round_failed,
    start_round,
    stopped_by_budget,
)
from refusalbench.tasks.pipeline.refusalbench.refresh_step import (
    compare_and_report,
    main_job_lines,
    publish_round,
    stage,
)


@flow(name="refusalbench-refresh", log_prints=True, on_failure=[record_round_failed])
def refresh_flow(config_path: str, out_root: str, rounds_to_compare: int = 5, seed: int | None = None) -> RefreshResult:
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = check_main_inputs(config_path)
    record = start_round(out_root, seed)  # a fresh round, or the one a crashed run left (same seed, folder)
    seed, round_id, root = record.seed, record.round_id, ArtifactStore(out_root)
    round_folder = root.child(round_id).uri("")
    print(f"refresh round {round_id} (seed {seed})")
    with stopped_by_budget(out_root, record), budget_span(cfg):  # one budget_usd: the round and its check
        with stage("main job (generate -> evaluate)"):
            main = configured(main_flow, cfg, round_folder)(config_path, round_folder, seed, round_id=round_id)
        with stage("contamination"):  # with refresh.contamination_static only
            contamination = round_contamination(cfg, config_path, round_folder)
    main_job_lines(root.child(round_id))
    with stage("freshness"):
        record_freshness(cfg, root, round_id)  # items, pairs and calls earlier rounds saw; fingerprint changes
    with stage("trend and report"):
        outcome = compare_and_report(cfg, root, round_id, rounds_to_compare)  # rebuilt: it shows the trend
    publish_round(cfg, root, round_id, seed, outcome)
    finish_round(out_root, record)
    return RefreshResult(
        round=round_id,
        seed=seed,
        report=outcome.report,
        rounds=len(outcome.trend.rounds),
        flags=outcome.document.flags,
        incomplete_rounds=[r.round for r in outcome.document.incomplete_rounds],
        incomplete=main.incomplete,
        contamination=None if contamination is None else contamination.json_uri,
        contamination_flagged=[] if contamination is None else contamination.flagged,
    )
