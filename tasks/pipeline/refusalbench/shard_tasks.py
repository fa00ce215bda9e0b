"""The model-calling stage tasks: one Prefect task per (model, shard), thin over the pure stage logic.

Each task reads its input shard from the run folder, runs the pure function of its stage
(``tasks/refusalbench/<stage>.py``) through the gateway, and writes one output shard;
``tasks/pipeline/fanout.py`` submits them over models x shards and gathers what they wrote.
``content_hash`` carries what the task's arguments cannot show (the shard's items, the
templates, the catalogue, the package version), so Prefect's cache key sees it. A task's shard
argument is a list of shards when its model sends the stage through the batch API (the fan-out
gives such a model's shards of a stage to one task: ``fanout.BATCH_CALLERS``, registered below).
"""

from __future__ import annotations

from collections.abc import Callable

from prefect import task

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.gateway import CallResult, Gateway, gateway_for
from refusalbench.tasks.pipeline.fanout import (
    BATCH_CALLERS,
    one_model_at_a_time,
    progress_callback,
    read_input,
    read_shared,
    timed_body,
    write_output_shard,
)
from refusalbench.tasks.pipeline.runtime import cache_policy, with_plugins
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import (
    Assignment,
    BaseItem,
    BenchmarkItem,
    Candidate,
    Judgment,
    PretestRow,
    Response,
    Verification,
)
from refusalbench.tasks.refusalbench.stages.generate import generate_candidates, rule_candidates
from refusalbench.tasks.refusalbench.stages.judge import judge_responses, judging_ahead, needs_judge
from refusalbench.tasks.refusalbench.stages.prechecks import awaits_verification
from refusalbench.tasks.refusalbench.stages.pretest import pretest_answers
from refusalbench.tasks.refusalbench.stages.respond import calibrate, respond
from refusalbench.tasks.refusalbench.stages.verify import verify_candidates


@task(
    name="generate-shard",
    task_run_name="generate {generator} {assignments_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def generate_shard(
    config: RunConfig,
    run_root: str,
    generator: str,
    assignments_name: str,
    content_hash: str,
    api_bases: dict[str, str],
) -> str:
    """Generate one shard of assignments with one generator; returns the output shard's name.

    ``content_hash`` covers what the task source does not: the shard's assignments, the
    base items, the catalogue, the prompt templates and the rule set (Prefect's cache key uses it).
    """
    store = ArtifactStore(run_root)
    assignments = read_input(run_root, assignments_name, Assignment)
    items = {item.id: item for item in store.load(rb_files.BASE_ITEMS)}
    levers = {lever.id: lever for lever in load_catalogue()}
    if config.models[generator].rule_based:
        candidates = rule_candidates(assignments, items, levers, generator)
    else:
        candidates = generate_candidates(
            gateway_for(config, api_bases),
            assignments,
            items,
            levers,
            generator,
            on_result=progress_callback(f"generate with {generator}", len(assignments)),
            edit_templates=config.generation.edit_templates() if config.generation else (),
        )
    return write_output_shard(run_root, "candidates", generator, assignments_name, candidates, Candidate)


@task(
    name="verify-shard",
    task_run_name="verify {verifier} {candidates_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def verify_shard(
    config: RunConfig, run_root: str, verifier: str, candidates_name: str, content_hash: str, api_bases: dict[str, str]
) -> str:
    """Verify one shard of candidates with one verifier; returns the output shard's name."""
    store = ArtifactStore(run_root)
    candidates = read_input(run_root, candidates_name, Candidate)
    items = {item.id: item for item in store.load(rb_files.BASE_ITEMS)}
    levers = {lever.id: lever for lever in load_catalogue()}
    rows = verify_candidates(
        gateway_for(config, api_bases),
        candidates,
        items,
        levers,
        verifier,
        on_result=progress_callback(f"verify with {verifier}", sum(map(awaits_verification, candidates))),
    )
    return write_output_shard(run_root, "verifications", verifier, candidates_name, rows, Verification)


@task(
    name="respond-shard",
    task_run_name="respond {target} {items_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def respond_shard(
    config: RunConfig, run_root: str, target: str, items_name: str, content_hash: str, api_bases: dict[str, str]
) -> str:
    """One target answers one shard of benchmark items; returns the output shard's name.

    ``content_hash`` covers what the cache key cannot see: the shard's items, the
    templates and the package version.
    """
    items = read_input(run_root, items_name, BenchmarkItem)
    gateway = gateway_for(config, api_bases)
    progress = progress_callback(f"{target} responds", len(items))
    judging = judging_ahead_here(config, gateway, items, target)

    def reply_in(result: CallResult) -> None:
        progress(result)
        if judging is not None:
            judging(result)

    # Always the plain prompt: confidence is elicited by the calibration pass (calibrate_shard).
    protocol = config.evaluation.protocol if config.evaluation is not None else "default"
    rows = respond(gateway, items, target, on_result=reply_in, protocol=protocol)
    return write_output_shard(run_root, "responses", target, items_name, rows, Response)


def judging_ahead_here(
    config: RunConfig, gateway: Gateway, items: list[BenchmarkItem], target: str
) -> Callable[[CallResult], None] | None:
    """The judge's calls started as ``target``'s replies come in (``judge.judging_ahead``), where the judge
    task that asks for them runs in this process and sends them itself: not under Dask (another worker), not
    for a judge in ``mode: batch`` (its batch job prices them), not where one local server takes the models
    in turns (a judge call would swap the target's weights out), not under a ``budget_usd`` (each judge shard
    is admitted by the budget on its own, and a call sent ahead would not wait for that)."""
    ev = config.evaluation
    assert ev is not None, "only an evaluation responds and judges"
    if (
        config.runner != "thread"
        or config.budget_usd is not None
        or config.models[ev.judge].batch_mode("judge")
        or one_model_at_a_time(config, [*ev.targets, ev.judge])
    ):
        return None
    by_id = {item.item_id: item for item in items}
    return judging_ahead(gateway, by_id, target, ev.judge, ev.decision, ev.protocol, judge_sharing(config))


def judge_sharing(config: RunConfig) -> int:
    """How many judge calls share an item's prompt prefix: one per target, twice with the calibration pass."""
    ev = config.evaluation
    assert ev is not None, "only an evaluation judges"
    return len(ev.targets) * (2 if ev.confidence else 1)


@task(
    name="calibrate-shard",
    task_run_name="calibrate {target} {items_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def calibrate_shard(
    config: RunConfig, run_root: str, target: str, items_name: str, content_hash: str, api_bases: dict[str, str]
) -> str:
    """The calibration pass (``evaluation.confidence``): one target answers one shard of items
    with the confidence-eliciting prompt; returns the output shard's name."""
    items = read_input(run_root, items_name, BenchmarkItem)
    rows = calibrate(
        gateway_for(config, api_bases), items, target, on_result=progress_callback(f"{target} calibration", len(items))
    )
    return write_output_shard(run_root, "calibration_responses", target, items_name, rows, Response)


@task(
    name="calibration-judge-shard",
    task_run_name="judge calibration {target} {responses_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def calibration_judge_shard(
    config: RunConfig, run_root: str, target: str, responses_name: str, content_hash: str, api_bases: dict[str, str]
) -> str:
    """The judge decides one target's shard of calibration responses, through the same
    ``judge_responses`` as the main pass; returns the output shard's name."""
    rows = judged_rows(config, api_bases, run_root, responses_name, f"judge {target} calibration")
    return write_output_shard(run_root, "calibration_judgments", target, responses_name, rows, Judgment)


@task(
    name="judge-shard",
    task_run_name="judge {target} {responses_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def judge_shard(
    config: RunConfig, run_root: str, target: str, responses_name: str, content_hash: str, api_bases: dict[str, str]
) -> str:
    """The judge decides one target's shard of responses; returns the output shard's name.

    Passed the respond task's future as ``responses_name``, it starts when that shard is done.
    """
    rows = judged_rows(config, api_bases, run_root, responses_name, f"judge {target}")
    return write_output_shard(run_root, "judgments", target, responses_name, rows, Judgment)


def judged_rows(
    config: RunConfig, api_bases: dict[str, str], run_root: str, responses_name: str, title: str
) -> list[Judgment]:
    """The judge's judgments of one shard of responses: the main pass's and the calibration pass's alike."""
    responses = read_input(run_root, responses_name, Response)
    items = {item.item_id: item for item in read_shared(run_root, rb_files.BENCHMARK)}
    ev = config.evaluation
    assert ev is not None, "only an evaluation judges"
    judge, decision = ev.judge, ev.decision
    total = sum(needs_judge(items[r.item_id], r, decision, ev.protocol) for r in responses)
    return judge_responses(
        gateway_for(config, api_bases),
        items,
        responses,
        judge,
        on_result=progress_callback(title, total),
        decision=decision,
        protocol=ev.protocol,
        shared_by=judge_sharing(config),
    )


@task(
    name="pretest-shard",
    task_run_name="pretest {model} {items_name}",
    cache_policy=cache_policy() - "api_bases",
    retries=1,
    retry_delay_seconds=2,
)
@with_plugins
@timed_body
def pretest_shard(
    config: RunConfig, run_root: str, model: str, items_name: str, content_hash: str, api_bases: dict[str, str]
) -> str:
    """One pre-test model answers one shard of base items and the judge scores the answers.

    ``content_hash`` covers what the cache key cannot see: the shard's items, the target
    and judge templates and the package version. Returns the output shard's name.
    """
    items = read_input(run_root, items_name, BaseItem)
    gen = config.generation
    assert gen is not None and gen.pretest is not None, "a pre-test shard runs only for a configured pre-test"
    judge = gen.pretest.judge
    rows = pretest_answers(gateway_for(config, api_bases), items, model, judge, progress=progress_callback)
    return write_output_shard(run_root, "pretest", model, items_name, rows, PretestRow)


# Whose calls each task makes: where one of them sends the stage through the batch API, the fan-out
# gives the task all of its model's shards of the stage (one batch job). The judge's tasks are fanned
# out over the targets but call the judge; a pre-test task calls its model and the pre-test judge.
BATCH_CALLERS.add(generate_shard.name, lambda cfg, generator: [generator])
BATCH_CALLERS.add(verify_shard.name, lambda cfg, verifier: [verifier])
BATCH_CALLERS.add(respond_shard.name, lambda cfg, target: [target])
BATCH_CALLERS.add(calibrate_shard.name, lambda cfg, target: [target])
BATCH_CALLERS.add(judge_shard.name, lambda cfg, target: [cfg.evaluation.judge])
BATCH_CALLERS.add(calibration_judge_shard.name, lambda cfg, target: [cfg.evaluation.judge])
BATCH_CALLERS.add(pretest_shard.name, lambda cfg, model: [model, cfg.generation.pretest.judge])
