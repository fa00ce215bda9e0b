"""The generation flow: base set -> (pre-test) -> levers -> generators (fan out) -> verifiers
(fan in) -> consensus filter -> stratified sample -> benchmark.parquet (seed paper §3.3-3.4).

With ``generation.pretest`` the whole base set is pre-tested first and ``base_sample`` items are
drawn from the items every pre-test model answered correctly (see ``flows.pretest``).

Tasks exchange file names inside the run folder, never DataFrames. One task per
(model, shard); inside a task the calls run concurrently through the gateway. The
steps live in ``tasks/pipeline/<stage>_step.py``, the pure stage logic in ``tasks/refusalbench/``.
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import check_or_raise, model_endpoints
from refusalbench.flows.pretest import pretest_models
from refusalbench.flows.results import GenerationResult
from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.core.errors import RunIncomplete
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.budget_prices import check_budget_prices
from refusalbench.tasks.pipeline.cache_scoping import scoped_config
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.refusalbench.analyse_step import analyse
from refusalbench.tasks.pipeline.refusalbench.assign_step import GenerationInputs, prepare_inputs, record_inputs
from refusalbench.tasks.pipeline.refusalbench.generate_step import generate_stage
from refusalbench.tasks.pipeline.refusalbench.pretest_step import pretested_inputs
from refusalbench.tasks.pipeline.refusalbench.select_step import select_benchmark
from refusalbench.tasks.pipeline.refusalbench.verify_step import verify_stage
from refusalbench.tasks.pipeline.runtime import CallCounter
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.rounds.freshness import earlier_pairs
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.stages.stage_outcomes import empty_benchmark_reason


def check_generation_inputs(
    cfg: RunConfig, seed: int | None = None, avoid: frozenset[tuple[str, str]] = frozenset()
) -> GenerationInputs:
    """The base set, levers and settings, checked before anything is written (``seed``: instead of
    generation.seed; ``avoid``: earlier rounds' pairs). A config without a generation section fails
    in one line (``prepare_inputs``)."""
    default = cfg.generation.seed if cfg.generation is not None else 0
    inputs = prepare_inputs(cfg, default if seed is None else seed, avoid)
    check_budget_prices(cfg, [name for key, name in cfg.referenced_models() if key.startswith("generation.")])
    return inputs


def with_strata(cfg: RunConfig, strata: list[str] | None) -> RunConfig:
    """The config with ``strata`` in place of generation.strata (None: as it is)."""
    if strata is None or cfg.generation is None:
        return cfg
    return cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"strata": list(strata)})})


@flow(name="refusalbench-generate", log_prints=True)
def generation_flow(
    config_path: str,
    out: str,
    seed: int | None = None,
    round_id: str | None = None,
    fresh: list[str] | None = None,
    report: bool = True,
    strata: list[str] | None = None,
) -> GenerationResult:
    """``report``: the generation-only report.html (not in ``run``); ``strata``: instead of generation.strata."""
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = scoped_config(with_strata(load_config(config_path), strata), out, round_id, fresh)  # the run's cache scope
    counter = CallCounter(cfg)  # this run's calls only: the process may have run other flows before
    avoid = frozenset(earlier_pairs(out)) if round_id else frozenset()  # new pairs while the pool allows
    inputs = check_generation_inputs(cfg, seed, avoid)  # a deployment starts here, without the CLI's check
    recorder = ManifestRecorder(ArtifactStore(out), "generate", config=cfg, seed=inputs.seed)
    with recorder.run():
        generators = check_or_raise(cfg, cfg.generation_section().generators)
        verifiers = check_or_raise(cfg, cfg.generation_section().verifiers)
        pretesters, pretest_judge = pretest_models(cfg)
        calling = generators + verifiers + pretesters + ([pretest_judge] if pretest_judge else [])
        with model_endpoints(cfg, calling) as api_bases:
            run = StageRun(cfg, out, recorder, api_bases)
            inputs, funnel = pretested_inputs(run, inputs, pretesters, pretest_judge)
            record_inputs(recorder, inputs, funnel)
            candidates = generate_stage(run, inputs, generators)
            verifications = verify_stage(run, inputs, candidates, verifiers)
        selection = select_benchmark(run, inputs, candidates, verifications, verifiers, generators)
        counter.record(recorder)  # before analyse: its report shows the manifest
        analyse(run, selection, generators, verifiers, report=report)
    if not selection.benchmark and (reason := empty_benchmark_reason(candidates, verifications)):
        raise RunIncomplete(reason)  # after the run folder is whole: its report and manifest say the rest
    return GenerationResult(
        benchmark=run.store.uri(rb_files.BENCHMARK.name),
        accepted=len(selection.accepted_ids),
        sampled=len(selection.benchmark),
        candidates=len(candidates),
        verifications=len(verifications),
        run=run.store.uri(""),
    )
