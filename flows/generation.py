"""The generation flow: base set -> (pre-test) -> levers -> generators (fan out) -> verifiers
(fan in) -> consensus filter -> stratified sample -> benchmark.parquet (seed paper §3.3-3.4).

With ``generation.pretest`` the whole base set is pre-tested first and ``base_sample`` items are
drawn from the items every pre-test model answered correctly (see ``flows.pretest``).

Tasks exchange file names inside the run folder, never DataFrames. One task per
(model, shard); inside a task the calls run concurrently through the gateway. The
stages themselves live in ``tasks.stages``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from refusalbench.flows.common import check_or_raise, model_endpoints
from refusalbench.flows.pretest import pretest_models
from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.pipeline.runtime import run_call_stats
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.pipeline.analyse_step import analyse
from refusalbench.tasks.pipeline.assign_step import prepare_inputs, record_inputs
from refusalbench.tasks.pipeline.generate_step import generate_candidates
from refusalbench.tasks.pipeline.pretest_step import pretested_inputs
from refusalbench.tasks.pipeline.select_step import select_benchmark
from refusalbench.tasks.pipeline.verify_step import verify_candidates
from refusalbench.tasks.core.store import ArtifactStore


@flow(name="refusalbench-generate", log_prints=True)
def generation_flow(config_path: str, out: str, seed: int | None = None) -> dict[str, Any]:
    cfg = load_config(config_path)
    inputs = prepare_inputs(cfg, cfg.generation.seed if seed is None else seed)
    recorder = ManifestRecorder(ArtifactStore(out), "generate", config=cfg, seed=inputs.seed)
    with recorder.run():
        generators = check_or_raise(cfg, cfg.generation.generators)
        verifiers = check_or_raise(cfg, cfg.generation.verifiers)
        pretesters, pretest_judge = pretest_models(cfg)
        calling = generators + verifiers + pretesters + ([pretest_judge] if pretest_judge else [])
        with model_endpoints(cfg, calling) as api_bases:
            run = StageRun(cfg, out, recorder, api_bases)
            inputs, funnel = pretested_inputs(run, inputs, pretesters, pretest_judge)
            record_inputs(recorder, inputs, funnel)
            candidates = generate_candidates(run, inputs, generators)
            verifications = verify_candidates(run, inputs, candidates, verifiers)
        selection = select_benchmark(run, inputs, candidates, verifications, verifiers, generators)
        analyse(run, selection, generators, verifiers)
        recorder.calls(run_call_stats(cfg))
    return {"benchmark": run.store.uri(runfolder.BENCHMARK.name), "accepted": len(selection.accepted_ids),
            "sampled": len(selection.benchmark), "candidates": len(candidates), "verifications": len(verifications),
            "run": run.store.uri("")}
