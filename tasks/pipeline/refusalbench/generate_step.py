"""Stage: generate. Every generator realises every assigned lever (one task per generator x shard).

A rule-based generator (``model: rules/...``) runs as a task like the others but attempts
only the assignments its rules can realise; how many it left out, and why, goes into the
manifest (``counts.rule_skips``).
"""

from __future__ import annotations

from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.pipeline.fanout import content_digest
from refusalbench.tasks.pipeline.refusalbench.assign_step import GenerationInputs
from refusalbench.tasks.pipeline.refusalbench.shard_tasks import generate_shard
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.rule_generator import rule_skips, ruleset_hash
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import Assignment, Candidate
from refusalbench.tasks.refusalbench.stages.stage_outcomes import outcome_summary, tell_outcomes

STATUSES = ("ok", "parse_error", "call_error")


def generate_stage(run: StageRun, inputs: GenerationInputs, generators: list[str]) -> list[Candidate]:
    """All candidates, failed attempts included; written to ``candidates.parquet``."""
    rule_based = [g for g in generators if run.cfg.models[g].rule_based]
    # The rules' source is part of what a task reads only when a rule generator runs.
    rules = [{"rules": ruleset_hash()}] if rule_based else []

    def digest(chunk: list[Assignment]) -> str:
        # What a generate task reads besides its inputs: the assignments' base items,
        # the catalogue and the templates (and the rules).
        return content_digest(
            [a.model_dump() for a in chunk],
            [inputs.items_by_id[a.base_id].model_dump() for a in chunk],
            inputs.hashes,
            package_version(),
            *rules,
        )

    with run.recorder.stage("generate"):
        size = run.fanout.shard_size(run.cfg.generation, len(inputs.assignments), generators)
        shards = run.fanout.write_shards("assignments", inputs.assignments, Assignment, size, digest)
        candidates: list[Candidate] = run.fanout.gather(
            run.fanout.submit(generate_shard, generators, shards), Candidate
        )
        run.store.save(rb_files.CANDIDATES, candidates)
        run.recorder.artifact(rb_files.CANDIDATES)
        outcomes = outcome_summary(candidates, by="generator")
        run.recorder.count(
            candidates=len(candidates),
            candidates_by_status={s: sum(c.status == s for c in candidates) for s in STATUSES},
            generate_outcomes=outcomes,
        )
        tell_outcomes("generate", outcomes)
        if rule_based:
            levers = {lever.id: lever for lever in inputs.levers}
            run.recorder.count(rule_skips=dict(rule_skips(inputs.assignments, inputs.items_by_id, levers)))
    return candidates
