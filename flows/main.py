"""The main job: generate -> evaluate -> report, in one run folder.

With the embedded default config this pulls the local models (first run only), starts
llama.cpp once for both stages, and needs no API key and no second terminal. ``round_id``: the
refresh round this run is (its cache scope, ``tasks/pipeline/cache_scoping.py``); ``fresh``: the
roles whose calls ignore earlier cache entries (``--fresh``).
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import check_or_raise, configured, model_endpoints
from refusalbench.flows.evaluation import evaluation_flow
from refusalbench.flows.generation import check_generation_inputs, generation_flow
from refusalbench.flows.pretest import pretest_models
from refusalbench.flows.results import MainResult
from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.budget import budget_span
from refusalbench.tasks.pipeline.budget_prices import check_budget_prices
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.refusalbench.report_step import publish_run_summary
from refusalbench.tasks.pipeline.ui import story
from refusalbench.tasks.refusalbench.report.run_outputs import write_generation_report


@flow(name="refusalbench-run", log_prints=True)
def main_flow(
    config_path: str, out: str, seed: int | None = None, round_id: str | None = None, fresh: list[str] | None = None
) -> MainResult:
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = load_config(config_path)
    with model_endpoints(cfg, cfg.used_models()), budget_span(cfg):  # one budget_usd for both flows
        # No generation-only report: the final one holds its figures, drawn while the targets answer.
        generated = configured(generation_flow, cfg, out)(config_path, out, seed, round_id, fresh, report=False)
        story(
            "benchmark: %d items (%d accepted of %d candidates)",
            generated.sampled,
            generated.accepted,
            generated.candidates,
        )
        if generated.sampled == 0:
            # Nothing to evaluate. Still leave a report of the generation funnel and the
            # verifier analysis, which say why, then fail the run.
            report = write_generation_report(ArtifactStore(out))
            raise RuntimeError(
                f"the benchmark is empty: no candidate passed {cfg.generation_section().filter} verification; "
                f"see the generator-verifier analysis in {report}"
            )
        try:
            evaluated = configured(evaluation_flow, cfg, out)(config_path, generated.benchmark, out, round_id, fresh)
        except Exception:  # not on an interrupt or a cancellation: those stop at once
            _report_the_generation(ArtifactStore(out))
            raise
        story("report: %s", evaluated.report)
        publish_run_summary(ArtifactStore(out), evaluated.report)  # on this run's page too, not only the evaluation's
    return MainResult(
        benchmark=generated.benchmark,
        report=evaluated.report,
        metrics=evaluated.metrics,
        generation=generated,
        incomplete=evaluated.incomplete,
    )


def _report_the_generation(store: ArtifactStore) -> None:
    """After a failed evaluation that wrote no report of its own: report.html of the generation's funnel
    and analysis (the run skipped it, leaving the figures to the final report), else the folder would
    keep no report or an earlier run's."""
    manifest = store.load(runfolder.MANIFEST) if store.has(runfolder.MANIFEST) else None
    if manifest is not None and manifest.kind == "evaluate" and runfolder.REPORT.name in manifest.artifacts:
        return
    try:
        write_generation_report(store)
    except Exception as exc:  # noqa: BLE001 - the evaluation's error is the one to raise
        story("the generation report could not be written either: %s: %s", type(exc).__name__, exc)


def check_main_inputs(config_path: str, seed: int | None = None) -> RunConfig:
    """All input of the main job checked (exit 2 on a problem) before anything runs, every model
    of both stages included: a judge that cannot run is found before the generation budget is spent."""
    cfg = load_config(config_path)
    if cfg.generation is None or cfg.evaluation is None:
        raise InputError(str(config_path), "the main job needs both a generation and an evaluation section")
    check_budget_prices(cfg, cfg.used_models())  # one line naming every unpriced model of both stages
    check_generation_inputs(cfg, seed)
    check_or_raise(cfg, cfg.generation.generators)
    check_or_raise(cfg, cfg.generation.verifiers)
    pretest_models(cfg)
    check_or_raise(cfg, cfg.evaluation.targets)
    check_or_raise(cfg, [cfg.evaluation.judge])
    return cfg
