"""The generation flow: base set -> levers -> generators (fan out) -> verifiers (fan in)
-> consensus filter -> stratified sample -> benchmark.parquet (seed paper §3.3-3.4).

Tasks exchange file names inside the run folder, never DataFrames. One task per
(model, shard); inside a task the calls run concurrently through the gateway. The
stages themselves live in ``tasks.stages``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from refusalbench.flows.common import check_or_raise, model_endpoints
from refusalbench.tasks import runfolder
from refusalbench.tasks.config import load_config
from refusalbench.tasks.prefect_runtime import run_call_stats
from refusalbench.tasks.provenance import ManifestRecorder
from refusalbench.tasks.stages import StageRun
from refusalbench.tasks.stages.analyse import analyse
from refusalbench.tasks.stages.assign import prepare_inputs, record_inputs
from refusalbench.tasks.stages.generate import generate_candidates
from refusalbench.tasks.stages.select import select_benchmark
from refusalbench.tasks.stages.verify import verify_candidates
from refusalbench.tasks.store import ArtifactStore


@flow(name="refusalbench-generate", log_prints=True)
def generation_flow(config_path: str, out: str, seed: int | None = None) -> dict[str, Any]:
    cfg = load_config(config_path)
    inputs = prepare_inputs(cfg, cfg.generation.seed if seed is None else seed)
    recorder = ManifestRecorder(ArtifactStore(out), "generate", config=cfg, seed=inputs.seed)
    with recorder.run():
        record_inputs(recorder, inputs)
        generators = check_or_raise(cfg, cfg.generation.generators)
        verifiers = check_or_raise(cfg, cfg.generation.verifiers)
        with model_endpoints(cfg, generators + verifiers) as api_bases:
            run = StageRun(cfg, out, recorder, api_bases)
            candidates = generate_candidates(run, inputs, generators)
            verifications = verify_candidates(run, inputs, candidates, verifiers)
        selection = select_benchmark(run, inputs, candidates, verifications, verifiers)
        analyse(run, selection, generators, verifiers)
        recorder.calls(run_call_stats(cfg))
    return {"benchmark": run.store.uri(runfolder.BENCHMARK.name), "accepted": len(selection.accepted_ids),
            "sampled": len(selection.benchmark), "candidates": len(candidates), "verifications": len(verifications),
            "run": run.store.uri("")}
