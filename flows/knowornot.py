"""KnowOrNot flow: out-of-knowledge-base robustness with leave-one-out experiments.

documents -> sentences (NLTK, offline) -> atomic facts (LLM) -> QA pairs (LLM)
  [or a QA file] -> diversity filters (TF-IDF + MiniLM) -> FAISS index (built once per KB,
  kept in the run folder) -> experiment grid (targets x retrieval x system prompt, the
  question's own pair never in its context) -> target answers -> evaluator (abstention,
  then factuality for answers) -> rates with bootstrap intervals -> a sample to label per spec
  [-> the knowornot.evaluator_comparison models judge that sample, App. D.3].

The stages are Prefect tasks in ``tasks/pipeline/knowornot/knowornot_tasks.py`` (files in, files out, so a
stage can be re-run alone and finished stages are served from cache); results, rates and
the report are built by ``tasks/knowornot/report/contents.py``.
"""

from __future__ import annotations

from prefect import flow

from refusalbench.flows.common import check_or_raise, model_endpoints, usable_models
from refusalbench.flows.results import KnowOrNotResult
from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.core.config_sections import KnowOrNotConfig
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.report.contents import publish_report, write_results
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.stages.embeddings import embedder_for
from refusalbench.tasks.llm.accounting import spend_gate
from refusalbench.tasks.llm.prompting import all_template_hashes
from refusalbench.tasks.pipeline.budget import Budget
from refusalbench.tasks.pipeline.knowornot.knowornot_bases import (
    KnowledgeBaseSlice,
    each_base,
    each_base_then,
    failures_of,
    knowledge_bases,
    merge_bases,
    summed,
)
from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import (
    check_knowornot_inputs,
    input_digest,
    knowornot_models,
    knowornot_section,
    warm_up_embedder,
    with_resolved_sources,
    with_targets,
)
from refusalbench.tasks.pipeline.knowornot.knowornot_steps import (
    answer_and_evaluate,
    audit_beside_calls,
    compare_evaluators,
    knowornot_budget,
    save_stage_failures,
    stage_tasks,
)
from refusalbench.tasks.pipeline.process_guard import follow_parent
from refusalbench.tasks.pipeline.runtime import CallCounter


@flow(name="refusalbench-knowornot", log_prints=True)
def knowornot_flow(config_path: str, out: str) -> KnowOrNotResult:
    follow_parent()  # a flow-run process that a worker started ends with that worker
    cfg = load_config(config_path)
    counter = CallCounter(cfg)  # this run's calls only: the process may have run other flows before
    kon = _checked_section(cfg)  # a deployment starts here, not through the CLI's check: fail clearly, write nothing
    warm_up_embedder(cfg)  # in the background, while the first stages run (started already if launched by the CLI)
    store = ArtifactStore(out)
    recorder = ManifestRecorder(store, "knowornot", config=cfg, seed=kon.seed)
    recorder.hashes(prompts=all_template_hashes())
    run_cfg, run_kon, digest, bases, budget = _task_inputs(cfg, out, recorder)
    stage = stage_tasks(out)
    with recorder.run(), spend_gate(budget):  # the calls a task sends whole ask the budget too
        usable = check_or_raise(cfg, knowornot_models(kon) + kon.evaluator_comparison)
        with model_endpoints(cfg, knowornot_models(run_kon)) as api_bases:
            with recorder.stage("knowledge base"):
                kbs = each_base(stage.knowledge_base, bases, api_bases)
                recorder.count(qa_pairs_all=sum(kb.pairs for kb in kbs))
            with recorder.stage("diversity filter + index"):  # each base's grid starts as its index is done
                filtered, grids_of = each_base_then(stage.filter_and_index, stage.experiments, bases, api_bases)
                recorder.count(**summed([f.counts() for f in filtered]))
            with recorder.stage("experiments"):
                grids = grids_of()
                merge_bases(store, bases)
                recorder.count(
                    experiments=sum(g.experiments for g in grids),
                    stage_failures=save_stage_failures(store, failures_of(bases, kbs) + failures_of(bases, grids)),
                )
            with recorder.stage("answer + evaluate"):
                audit = audit_beside_calls(cfg, out)  # the overlap audit needs no answer: it runs beside the calls
                recorder.count(**answer_and_evaluate(run_cfg, out, digest, api_bases, budget))
        with recorder.stage("metrics"):
            results = write_results(store, run_kon, embedder_for(cfg), audit.result())
            report = publish_report(store, results, recorder.manifest.counts)
        if comparison := [m for m in run_kon.evaluator_comparison if m in usable]:  # App. D.3
            with recorder.stage("evaluator comparison"), model_endpoints(cfg, comparison) as api_bases:
                recorder.count(**compare_evaluators(run_cfg, out, digest, api_bases, comparison, budget))
        counter.record(recorder)
    return KnowOrNotResult(
        metrics=store.uri(kon_files.KON_METRICS.name), report=report, experiments=sum(g.experiments for g in grids)
    )


def _checked_section(cfg: RunConfig) -> KnowOrNotConfig:
    """The config's knowornot section, once everything the run needs from the config is checked
    (``check_knowornot_inputs``: a problem is one line, exit 2, before anything is written)."""
    check_knowornot_inputs(cfg)
    return knowornot_section(cfg)


def _task_inputs(
    cfg: RunConfig, out: str, recorder: ManifestRecorder
) -> tuple[RunConfig, KnowOrNotConfig, str, list[KnowledgeBaseSlice], Budget | None]:
    """What the tasks get: the config with its KB paths resolved against the config's folder and only the
    targets that can run (skip_unavailable), its knowornot section, that section's input digest, the
    run's knowledge bases (each with its own digest), and the run's budget (counting from here, before
    any call; None without ``budget_usd``)."""
    run_cfg = with_targets(with_resolved_sources(cfg), usable_models(cfg, knowornot_section(cfg).targets))
    run_kon = knowornot_section(run_cfg)
    prompt_hashes = recorder.manifest.prompt_hashes
    digest = input_digest(run_kon, prompt_hashes)
    bases = knowledge_bases(run_cfg, out, lambda kon: input_digest(kon, prompt_hashes))
    return run_cfg, run_kon, digest, bases, knowornot_budget(run_cfg, recorder)
