"""Stage: verify. Pre-checks first, then every verifier checks every parsed candidate that
passed them (one task per verifier x shard).

The pre-checks (``tasks.prechecks``) need no model: a candidate one of them rejects is
recorded as such in ``candidates.parquet`` (rewritten here) and sent to no verifier.

``exhaustive`` sends every candidate to every verifier at once. ``short_circuit`` asks
the verifiers one after another and sends a later verifier only the candidates every
earlier one passed; the pairs it never sees are recorded as ``SKIPPED`` rows.
"""

from __future__ import annotations

from collections import Counter

from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.pipeline.fanout import content_digest
from refusalbench.tasks.pipeline.refusalbench.assign_step import GenerationInputs
from refusalbench.tasks.pipeline.refusalbench.shard_tasks import verify_shard
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import Candidate, Verification
from refusalbench.tasks.refusalbench.stages.prechecks import apply_prechecks, awaits_verification, rule_name
from refusalbench.tasks.refusalbench.stages.stage_outcomes import outcome_summary, tell_outcomes
from refusalbench.tasks.refusalbench.stages.verify import skipped

VERDICTS = ("PASS", "FAIL", "ERROR", "SKIPPED")


def verify_stage(
    run: StageRun, inputs: GenerationInputs, candidates: list[Candidate], verifiers: list[str]
) -> list[Verification]:
    """One row per (pre-checked candidate, verifier); written to ``verifications.parquet``.

    ``candidates`` is updated in place with the pre-check outcome, so the stages after this
    one (the filter, the analysis) see the same rows as ``candidates.parquet``.
    """
    candidates[:] = precheck_candidates(run, inputs, candidates)
    gen = run.cfg.generation
    assert gen is not None, "a generation run's config has a generation section"
    short_circuit = gen.verification == "short_circuit"
    rounds = [[v] for v in verifiers] if short_circuit else [verifiers]
    pending = [c for c in candidates if awaits_verification(c)]
    verifications: list[Verification] = []
    with run.recorder.stage("verify"):
        for index, round_verifiers in enumerate(rounds):
            rows = verify_round(run, inputs, pending, round_verifiers, index, sharing=verifiers)
            verifications.extend(rows)
            if short_circuit:
                failed = {r.candidate_id for r in rows if r.verdict != "PASS"}
                later = [v for r in rounds[index + 1 :] for v in r]
                verifications.extend(skipped(c, v) for c in pending if c.candidate_id in failed for v in later)
                pending = [c for c in pending if c.candidate_id not in failed]
        run.store.save(rb_files.VERIFICATIONS, verifications)
        run.recorder.artifact(rb_files.VERIFICATIONS)
        outcomes = outcome_summary([r for r in verifications if r.verdict != "SKIPPED"], by="verifier")
        run.recorder.count(
            verifications=len(verifications),
            verifications_by_verdict={v: sum(r.verdict == v for r in verifications) for v in VERDICTS},
            inconsistent_verdicts=sum(r.consistent is False for r in verifications),
            verify_outcomes=outcomes,
        )
        tell_outcomes("verify", outcomes)
    return verifications


def precheck_candidates(run: StageRun, inputs: GenerationInputs, candidates: list[Candidate]) -> list[Candidate]:
    """The candidates with their pre-check outcome; ``candidates.parquet`` rewritten to hold it."""
    with run.recorder.stage("precheck"):
        checked = apply_prechecks(candidates, inputs.items_by_id, {lever.id: lever for lever in inputs.levers})
        run.store.save(rb_files.CANDIDATES, checked)
        failures = Counter(rule_name(f) for c in checked for f in c.precheck_failures or [])
        run.recorder.count(
            prechecked=sum(map(awaits_verification, checked)),
            precheck_rejected=sum(bool(c.precheck_failures) for c in checked),
            precheck_failures=dict(sorted(failures.items())),
        )
    return checked


def verify_round(
    run: StageRun,
    inputs: GenerationInputs,
    pending: list[Candidate],
    verifiers: list[str],
    index: int,
    *,
    sharing: list[str],
) -> list[Verification]:
    """``verifiers`` check ``pending`` (no task at all when nothing is pending)."""
    size = run.fanout.shard_size(run.cfg.generation, len(pending), verifiers)
    shards = run.fanout.write_shards(
        f"verify-input-{index:02d}",
        pending,
        Candidate,
        size,
        lambda chunk: content_digest([c.model_dump() for c in chunk], inputs.hashes, package_version()),
    )
    futures = run.fanout.submit(verify_shard, verifiers, shards if pending else [], sharing=sharing)
    return run.fanout.gather(futures, Verification)
