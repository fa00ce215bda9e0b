"""Stage: select. The consensus filter, then a stratified sample: ``benchmark.parquet``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refusalbench.tasks.pipeline.refusalbench.assign_step import GenerationInputs
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import FilterDecision
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Candidate, Verification
from refusalbench.tasks.refusalbench.stages.select import benchmark_items, filter_candidates, stratified_sample
from refusalbench.tasks.refusalbench.stages.stage_outcomes import failed_calls
from refusalbench.tasks.refusalbench.taxonomy import STRATA


@dataclass
class Selection:
    decisions: list[FilterDecision]
    accepted_ids: set[str]
    benchmark: list[BenchmarkItem]
    shortfalls: dict[str, Any]  # stratum -> {"wanted", "got"[, "generators"]}: strata short of their quota


def select_benchmark(
    run: StageRun,
    inputs: GenerationInputs,
    candidates: list[Candidate],
    verifications: list[Verification],
    verifiers: list[str],
    generators: list[str] | None = None,
) -> Selection:
    """``generators``: the run's generators, for ``balance: generator`` (default: those with candidates)."""
    gen = run.cfg.generation
    assert gen is not None, "a generation run's config has a generation section"
    generators = generators if generators is not None else list(dict.fromkeys(c.generator for c in candidates))
    with run.recorder.stage("select"):
        decisions = filter_candidates(candidates, verifications, verifiers, gen.filter)
        accepted_ids = {d.candidate_id for d in decisions if d.accepted}
        accepted = [c for c in candidates if c.candidate_id in accepted_ids]
        assigned = {(a.perturbation_class, a.intensity) for a in inputs.assignments}
        sample, shortfalls = stratified_sample(
            accepted,
            gen.target_size,
            inputs.seed,
            [s for s in STRATA if s in assigned],
            balance=gen.balance,
            generators=generators,
        )
        bench = benchmark_items(sample, inputs.items_by_id)
        run.store.save(rb_files.BENCHMARK, bench)
        run.store.save(rb_files.FILTER_DECISIONS, decisions)
        run.recorder.artifact(rb_files.BENCHMARK, rb_files.FILTER_DECISIONS)
        run.recorder.count(accepted=len(accepted), sampled=len(bench), shortfalls=shortfalls)
        if shortfalls and gen.balance == "generator":
            run.recorder.note(
                f"{len(shortfalls)} strata have a generator with fewer accepted items than its share: "
                "every generator gives that many there (see counts.shortfalls, per generator)"
            )
        elif shortfalls and any(failed_calls(candidates, verifications).values()):
            # Not the data's imbalance: calls that brought no usable reply left the strata short.
            lost = {stage: sum(n.values()) for stage, n in failed_calls(candidates, verifications).items()}
            run.recorder.note(
                f"{len(shortfalls)} strata have fewer accepted items than their quota, and "
                f"{lost['generate']} generator and {lost['verify']} verifier calls brought no usable "
                "reply (see counts.shortfalls, counts.generate_outcomes, counts.verify_outcomes)"
            )
        elif shortfalls:
            run.recorder.note(
                f"{len(shortfalls)} strata have fewer accepted items than their quota (natural imbalance, "
                f"see counts.shortfalls)"
            )
        if gen.balance == "generator" and gen.target_size and generators and gen.target_size % len(generators):
            run.recorder.note(
                f"target_size {gen.target_size} is not a multiple of {len(generators)} generators: "
                f"{gen.target_size // len(generators)} per generator"
            )
    return Selection(decisions, accepted_ids, bench, shortfalls)
