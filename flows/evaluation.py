"""The evaluation flow: benchmark -> targets respond (map) -> judge -> score -> report.

One task per (target, shard); the calls inside run concurrently within each model's
limits. Per-target shard files mean a re-run that adds a target only computes the new
target (the others come from Prefect's cache and the call cache). The steps live
in ``tasks/pipeline/<stage>_step.py``, the pure stage logic in ``tasks/refusalbench/``.
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import check_or_raise, model_endpoints
from refusalbench.flows.results import EvaluationResult
from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.prompting import all_template_hashes
from refusalbench.tasks.pipeline.budget_prices import check_budget_prices
from refusalbench.tasks.pipeline.cache_scoping import scoped_config
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.refusalbench.report_step import report_results
from refusalbench.tasks.pipeline.refusalbench.respond_step import respond_and_judge
from refusalbench.tasks.pipeline.refusalbench.score_step import score_judgments
from refusalbench.tasks.pipeline.runtime import CallCounter
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.benchmark_file import (
    keep_generation_manifest,
    place_benchmark,
    read_benchmark,
)
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem


def check_evaluation_inputs(cfg: RunConfig, benchmark: str) -> list[BenchmarkItem]:
    """The evaluation section and the benchmark, checked before anything is written."""
    evaluation = cfg.evaluation_section()  # a config without one: one line, exit 2
    check_budget_prices(cfg, [*evaluation.targets, evaluation.judge])  # a budget bounds every model it covers
    return read_benchmark(benchmark)


@flow(name="refusalbench-evaluate", log_prints=True)
def evaluation_flow(
    config_path: str, benchmark: str, out: str, round_id: str | None = None, fresh: list[str] | None = None
) -> EvaluationResult:
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = scoped_config(load_config(config_path), out, round_id, fresh)  # the run's cache scope
    counter = CallCounter(cfg)  # this run's calls only: in ``run`` the generation's came before
    items = check_evaluation_inputs(cfg, benchmark)  # a deployment starts here, without the CLI's check
    evaluation = cfg.evaluation_section()
    store = ArtifactStore(out)
    keep_generation_manifest(store)
    recorder = ManifestRecorder(store, "evaluate", config=cfg, seed=evaluation.seed)
    recorder.hashes(prompts=all_template_hashes())
    with recorder.run():
        if (released := place_benchmark(store, benchmark, items)) is not None:
            recorder.note(released)  # a released benchmark's license travels with the run
        targets = check_or_raise(cfg, evaluation.targets)
        (judge,) = check_or_raise(cfg, [evaluation.judge])
        with model_endpoints(cfg, targets + [judge]) as api_bases:
            run = StageRun(cfg, out, recorder, api_bases)
            responses, judgments = respond_and_judge(run, items, targets, judge)
        result = score_judgments(run, items, targets, responses, judgments)
        counter.record(recorder)
        report_uri = report_results(run, result)
    return EvaluationResult(
        metrics=store.uri(rb_files.METRICS.name),
        report=report_uri,
        responses=len(responses),
        models=result.metrics,
        incomplete=result.incomplete,
        no_scored_rows=result.unscorable,
    )
