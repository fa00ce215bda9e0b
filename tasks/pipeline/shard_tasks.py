"""The model-calling stage tasks: one Prefect task per (model, shard), thin over the pure stage logic.

Each task reads its input shard from the run folder, runs the pure function of its stage
(``tasks/refusalbench/<stage>.py``) through the gateway, and writes one output shard;
``tasks/pipeline/fanout.py`` submits them over models x shards and gathers what they wrote.
``content_hash`` carries what the task's arguments cannot show (the shard's items, the
templates, the catalogue, the package version), so Prefect's cache key sees it.
"""

from __future__ import annotations

from prefect import task

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.refusalbench import artifacts as rb_files
from refusalbench.tasks.refusalbench.records import (Assignment, BaseItem, BenchmarkItem, Candidate, Judgment,
                                                     PretestRow, Response, Verification)
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.gateway import gateway_for
from refusalbench.tasks.pipeline.fanout import progress_callback, write_output_shard
from refusalbench.tasks.pipeline.runtime import cache_policy
from refusalbench.tasks.refusalbench.generate import generate_candidates, rule_candidates
from refusalbench.tasks.refusalbench.judge import judge_responses, needs_judge
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.prechecks import awaits_verification
from refusalbench.tasks.refusalbench.pretest import pretest_answers
from refusalbench.tasks.refusalbench.respond import respond
from refusalbench.tasks.refusalbench.verify import verify_candidates


@task(name="generate-shard", task_run_name="generate {generator} {assignments_name}",
      cache_policy=cache_policy() - "api_bases", retries=1, retry_delay_seconds=2)
def generate_shard(config: RunConfig, run_root: str, generator: str, assignments_name: str, content_hash: str,
                   api_bases: dict[str, str]) -> str:
    """Generate one shard of assignments with one generator; returns the output shard's name.

    ``content_hash`` covers what the task source does not: the shard's assignments, the
    base items, the catalogue, the prompt templates and the rule set (Prefect's cache key uses it).
    """
    store = ArtifactStore(run_root)
    assignments = store.read_records(assignments_name, Assignment)
    items = {item.id: item for item in store.load(rb_files.BASE_ITEMS)}
    levers = {lever.id: lever for lever in load_catalogue()}
    if config.models[generator].rule_based:
        candidates = rule_candidates(assignments, items, levers, generator)
    else:
        candidates = generate_candidates(gateway_for(config, api_bases), assignments, items, levers, generator,
                                         on_result=progress_callback(f"generate with {generator}", len(assignments)))
    return write_output_shard(run_root, "candidates", generator, assignments_name, candidates, Candidate)


@task(name="verify-shard", task_run_name="verify {verifier} {candidates_name}",
      cache_policy=cache_policy() - "api_bases", retries=1, retry_delay_seconds=2)
def verify_shard(config: RunConfig, run_root: str, verifier: str, candidates_name: str, content_hash: str,
                 api_bases: dict[str, str]) -> str:
    """Verify one shard of candidates with one verifier; returns the output shard's name."""
    store = ArtifactStore(run_root)
    candidates = store.read_records(candidates_name, Candidate)
    items = {item.id: item for item in store.load(rb_files.BASE_ITEMS)}
    levers = {lever.id: lever for lever in load_catalogue()}
    rows = verify_candidates(gateway_for(config, api_bases), candidates, items, levers, verifier,
                             on_result=progress_callback(f"verify with {verifier}", sum(map(awaits_verification, candidates))))
    return write_output_shard(run_root, "verifications", verifier, candidates_name, rows, Verification)


@task(name="respond-shard", task_run_name="respond {target} {items_name}",
      cache_policy=cache_policy() - "api_bases", retries=1, retry_delay_seconds=2)
def respond_shard(config: RunConfig, run_root: str, target: str, items_name: str, content_hash: str,
                  api_bases: dict[str, str]) -> str:
    """One target answers one shard of benchmark items; returns the output shard's name.

    ``content_hash`` covers what the cache key cannot see: the shard's items, the
    templates and the package version.
    """
    items = ArtifactStore(run_root).read_records(items_name, BenchmarkItem)
    rows = respond(gateway_for(config, api_bases), items, target, confidence=config.evaluation.confidence,
                   on_result=progress_callback(f"{target} responds", len(items)))
    return write_output_shard(run_root, "responses", target, items_name, rows, Response)


@task(name="judge-shard", task_run_name="judge {target} {responses_name}",
      cache_policy=cache_policy() - "api_bases", retries=1, retry_delay_seconds=2)
def judge_shard(config: RunConfig, run_root: str, target: str, responses_name: str, content_hash: str,
                api_bases: dict[str, str]) -> str:
    """The judge decides one target's shard of responses; returns the output shard's name.

    Passed the respond task's future as ``responses_name``, it starts when that shard is done.
    """
    store = ArtifactStore(run_root)
    responses = store.read_records(responses_name, Response)
    items = {item.item_id: item for item in store.load(rb_files.BENCHMARK)}
    judge = config.evaluation.judge
    total = sum(needs_judge(items[r.item_id], r) for r in responses)
    rows = judge_responses(gateway_for(config, api_bases), items, responses, judge,
                           on_result=progress_callback(f"judge {target}", total))
    return write_output_shard(run_root, "judgments", target, responses_name, rows, Judgment)


@task(name="pretest-shard", task_run_name="pretest {model} {items_name}",
      cache_policy=cache_policy() - "api_bases", retries=1, retry_delay_seconds=2)
def pretest_shard(config: RunConfig, run_root: str, model: str, items_name: str, content_hash: str,
                  api_bases: dict[str, str]) -> str:
    """One pre-test model answers one shard of base items and the judge scores the answers.

    ``content_hash`` covers what the cache key cannot see: the shard's items, the target
    and judge templates and the package version. Returns the output shard's name.
    """
    items = ArtifactStore(run_root).read_records(items_name, BaseItem)
    judge = config.generation.pretest.judge
    rows = pretest_answers(gateway_for(config, api_bases), items, model, judge, progress=progress_callback)
    return write_output_shard(run_root, "pretest", model, items_name, rows, PretestRow)
