"""The flow-side steps of KnowOrNot: fan the answer, evaluation and comparison tasks out and gather them.

The tasks themselves are in ``knowornot_tasks``; what is checked before a run in
``knowornot_inputs``. The overlap audit runs in a thread beside the model calls.
"""

from __future__ import annotations

import importlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prefect import Task

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.human.labels import sample_ids_per_spec
from refusalbench.tasks.knowornot.report.contents import run_overlap_audit
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.json_files import OverlapAudit
from refusalbench.tasks.knowornot.schema.records import (
    EvalOutcome,
    ExperimentInput,
    ExperimentOutput,
)
from refusalbench.tasks.knowornot.stages.embeddings import embedder_for
from refusalbench.tasks.knowornot.stages.evaluation import run_specs
from refusalbench.tasks.knowornot.stages.model_steps import answer_messages
from refusalbench.tasks.pipeline.budget import Budget
from refusalbench.tasks.pipeline.budget_prices import call_ceiling, output_cap, text_tokens
from refusalbench.tasks.pipeline.fanout import (
    Fanout,
    Shard,
    content_digest,
    read_shared,
)
from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import knowornot_models, knowornot_section
from refusalbench.tasks.pipeline.knowornot.knowornot_tasks import (
    COMPARISON_INPUTS,
    INPUT_SHARDS,
    FilterSummary,
    GridSummary,
    KnowledgeBaseSummary,
    answer_shard,
    build_experiments,
    build_knowledge_base,
    compare_evaluator_shard,
    evaluate_shard,
    filter_and_index,
)
from refusalbench.tasks.pipeline.runtime import result_storage


def save_stage_failures(store: ArtifactStore, failures: list[dict[str, Any]]) -> int:
    """Items an LLM stage could not process go to ``stage_failures.json`` (never dropped silently)."""
    if failures:
        store.save(kon_files.STAGE_FAILURES, failures)
    return len(failures)


def audit_beside_calls(cfg: RunConfig, out: str) -> Future[OverlapAudit]:
    """The run's overlap audit (``report.run_overlap_audit``), computed on a thread while the answers and
    evaluations are in flight, and its chart built (the report's modules imported with it).

    All are CPU the metrics stage would otherwise spend after the last call: scikit-learn's TF-IDF
    (seconds to import on 2 cores) and the report package. The audit reads only what the experiment stage wrote,
    so it is the same audit; the calls' own thread mostly waits on the network meanwhile."""

    def audit() -> OverlapAudit:
        done = run_overlap_audit(ArtifactStore(out), embedder_for(cfg))
        importlib.import_module("refusalbench.tasks.knowornot.report.page").overlap_figure(done)
        return done

    worker = ThreadPoolExecutor(1, thread_name_prefix="kon-audit")
    try:
        return worker.submit(audit)
    finally:
        worker.shutdown(wait=False)  # the thread ends with its one task


def answer_and_evaluate(
    cfg: RunConfig, out: str, digest: str, api_bases: dict[str, str], budget: Budget | None = None
) -> dict[str, int]:
    """Every target answers the grid shard by shard; each answer shard is evaluated as soon as it is in.

    Writes ``experiment_outputs.parquet``, ``evaluations.parquet`` and the specs applied
    (``eval_specs.json``, which the label command reads); returns the counts for the
    manifest. Models sharing one local server take turns (see ``Fanout``); ``budget`` admits each shard.
    """
    kon = knowornot_section(cfg)
    fanout = Fanout(cfg, out, api_bases, budget)
    fanout.store.save(kon_files.RUN_SPECS, run_specs(kon.evaluations))
    rows = read_shared(out, kon_files.EXPERIMENT_INPUTS)  # the evaluate tasks read the same parse
    shards = fanout.write_shards(
        INPUT_SHARDS,
        rows,
        ExperimentInput,
        kon.shard_size,
        lambda chunk: content_digest(digest, [r.model_dump() for r in chunk]),
    )
    sharing = knowornot_models(kon)
    answered = fanout.submit(answer_shard, kon.targets, shards, sharing=sharing)
    evaluated = fanout.submit(
        evaluate_shard,
        kon.targets,
        lambda target: [
            Shard(future, content_digest(shard.digest, "evaluate")) for future, shard in zip(answered[target], shards)
        ],
        sharing=sharing,
    )
    outputs: list[ExperimentOutput] = fanout.gather(answered, ExperimentOutput)
    outcomes: list[EvalOutcome] = fanout.gather(evaluated, EvalOutcome)
    fanout.store.save(kon_files.EXPERIMENT_OUTPUTS, outputs)
    fanout.store.save(kon_files.EVALUATIONS, outcomes)
    return {
        "responses": len(outputs),
        "response_errors": sum(o.error is not None for o in outputs),
        "evaluations": len(outcomes),
        "evaluation_errors": sum(o.error is not None for o in outcomes),
    }


def compare_evaluators(
    cfg: RunConfig,
    out: str,
    digest: str,
    api_bases: dict[str, str],
    evaluators: list[str],
    budget: Budget | None = None,
) -> dict[str, int]:
    """The ``knowornot.evaluator_comparison`` models that can run (``evaluators``) judge the label
    sample's responses, written to ``evaluator_comparison.parquet``; the human labels come after the
    run, so the scores against them are computed by ``knowornot agreement``. Returns the counts for
    the manifest."""
    kon = knowornot_section(cfg)
    fanout = Fanout(cfg, out, api_bases, budget)
    per_spec = sample_ids_per_spec(fanout.store.load(kon_files.LABEL_SAMPLE))
    wanted = set().union(*per_spec.values()) if per_spec else set()
    outputs = [o for o in fanout.store.load(kon_files.EXPERIMENT_OUTPUTS) if o.experiment_id in wanted]
    # The shard's digest carries which spec each of its rows is sampled for: the task reads that from the sample.
    shards = fanout.write_shards(
        COMPARISON_INPUTS,
        outputs,
        ExperimentOutput,
        kon.shard_size,
        lambda chunk: content_digest(
            digest,
            "compare",
            [(o.experiment_id, sorted(s for s, ids in per_spec.items() if o.experiment_id in ids)) for o in chunk],
        ),
    )
    futures = fanout.submit(compare_evaluator_shard, evaluators, shards)
    outcomes: list[EvalOutcome] = fanout.gather(futures, EvalOutcome)
    fanout.store.save(kon_files.EVALUATOR_COMPARISON, outcomes)
    return {
        "comparison_evaluations": len(outcomes),
        "comparison_evaluation_errors": sum(o.error is not None for o in outcomes),
    }


# ---------------------------------------------------------------- the budget


def knowornot_budget(cfg: RunConfig, recorder: ManifestRecorder) -> Budget | None:
    """The run's ``budget_usd`` (None without one), counting from now: its shards estimated by
    :func:`row_ceilings` on the experiment grid, read when the first shard is admitted."""
    out = recorder.store.uri("")
    known: dict[str, dict[str, float]] = {}

    def estimates(stage: str) -> dict[str, float]:
        if not known:
            known.update(row_ceilings(cfg, out))
        return known.get(stage, {})

    return Budget.of(cfg, recorder, estimates)


def row_ceilings(cfg: RunConfig, out: str) -> dict[str, dict[str, float]]:
    """{stage: {model: USD per row of a shard}}: a target's answer (its prompts rendered on its grid rows,
    tokens counted as ``plan`` counts them), and each evaluation spec's call per answer, its prompt the
    answer's prompt plus the longest answer a target may give."""
    kon = knowornot_section(cfg)
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    rows: list[ExperimentInput] = read_shared(out, kon_files.EXPERIMENT_INPUTS)
    chars: dict[str, list[int]] = {}
    for row in rows:
        chars.setdefault(row.target, []).append(sum(len(m["content"]) for m in answer_messages(row, pairs)))
    prompt = {target: text_tokens(sum(c) / len(c)) for target, c in chars.items()}
    judged = max(prompt.values(), default=0.0) + max((output_cap(cfg.models[t]) for t in kon.targets), default=0)
    specs = len(run_specs(kon.evaluations))
    return {
        "kon-answer": {t: call_ceiling(cfg, t, "kon-answer", prompt.get(t, 0.0)) for t in kon.targets},
        "kon-evaluate": {kon.evaluator: specs * call_ceiling(cfg, kon.evaluator, "kon-evaluate", judged)},
        "kon-compare-evaluators": {
            m: specs * call_ceiling(cfg, m, "kon-compare-evaluators", judged) for m in kon.evaluator_comparison
        },
    }


# ---------------------------------------------------------------- the tasks of one run


@dataclass(frozen=True)
class StageTasks:
    """The single-run stage tasks with their results persisted in this run's folder."""

    knowledge_base: Task[..., KnowledgeBaseSummary]
    filter_and_index: Task[..., FilterSummary]
    experiments: Task[..., GridSummary]


def stage_tasks(out: str) -> StageTasks:
    """The stage tasks for the run folder ``out``, so their results persist there however the flow started."""
    storage = result_storage(out)
    return StageTasks(
        build_knowledge_base.with_options(result_storage=storage),
        filter_and_index.with_options(result_storage=storage),
        build_experiments.with_options(result_storage=storage),
    )
