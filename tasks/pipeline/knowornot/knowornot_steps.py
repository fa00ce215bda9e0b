"""The KnowOrNot stages as Prefect tasks: run-folder files in, run-folder files out.

knowledge base -> diversity filter + FAISS index -> experiment grid -> answers (per
target x input shard) -> evaluations (per answer shard: the built-in specs, then the
config's ``evaluations``) -> after the label sample, the ``evaluator_comparison`` candidates
on its responses (per candidate x shard). Each task reads what the stage
before it wrote (declared in ``runfolder``) and returns a small summary for the manifest,
so a stage can be re-run alone and a finished stage is served from Prefect's cache. Tasks
get the typed run config with the knowledge-base paths resolved (``with_resolved_sources``);
what their cache key cannot see (file contents, prompt templates, package version) comes
in as ``input_digest``. The run-time endpoints (``api_bases``) are left out of the key.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from prefect import Task, task
from pydantic import BaseModel

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.config_sections import KnowledgeBaseSource, KnowOrNotConfig
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.json_files import IndexMeta, OverlapAudit
from refusalbench.tasks.core.errors import InputError, ModelUnavailable
from refusalbench.tasks.llm.gateway import gateway_for
from refusalbench.tasks.knowornot.stages.diversity import diversity_filter, filter_method, load_text_tools
from refusalbench.tasks.knowornot.stages.embeddings import Embedder, embedder_for, start_loading
from refusalbench.tasks.knowornot.stages.evaluation import run_specs
from refusalbench.tasks.knowornot.human.labels import sample_ids_per_spec
from refusalbench.tasks.knowornot.report.contents import run_overlap_audit
from refusalbench.tasks.knowornot.stages.model_steps import (answer_experiments, evaluate_outputs, extract_facts, generate_qa,
                                                     hyde_answers, synthetic_ookb_questions)
from refusalbench.tasks.knowornot.schema.records import (EvalOutcome, ExperimentInput, ExperimentOutput, HypotheticalAnswers,
                                                  OOKBQuestion, QAPair)
from refusalbench.tasks.knowornot.stages.retrieval import (build_experiment_inputs, build_index, index_from_bytes, index_to_bytes,
                                                    kb_fingerprint, loo_violations, pair_text, strategies_need)
from refusalbench.tasks.knowornot.document_readers import read_documents
from refusalbench.tasks.knowornot.stages.sentences import document_sentences, spread_sentences
from refusalbench.tasks.knowornot.stages.sources import POLICYBENCH_FILES, load_qa_pairs, policybench_import_hint
from refusalbench.tasks.pipeline.runtime import cache_policy, result_storage, with_plugins
from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.pipeline.fanout import (Fanout, Shard, content_digest, progress_callback, read_shared,
                                                write_output_shard)
from refusalbench.tasks.core.store import ArtifactStore

# Shard kinds under the run folder's _work/ (runfolder.input_shard / output_shard).
INPUT_SHARDS = "kon-inputs"
ANSWER_SHARDS = "kon-answers"
EVALUATION_SHARDS = "kon-evaluations"
COMPARISON_INPUTS = "kon-comparison-inputs"
COMPARISON_SHARDS = "kon-comparison-evaluations"

# Inputs + task source; the endpoints of local servers change from run to run.
STAGE_CACHE = cache_policy() - "api_bases"


class KnowledgeBaseSummary(BaseModel):
    """What the knowledge-base stage made: how many QA pairs, and the items its LLM calls failed on."""

    pairs: int
    failures: list[dict[str, Any]]


class FilterSummary(BaseModel):
    """What the diversity filters kept and removed, and whether the FAISS index was rebuilt."""

    kept: int
    removed_keyword: int
    removed_semantic: int
    index_rebuilt: bool

    def counts(self) -> dict[str, int]:
        return {"qa_pairs": self.kept, "removed_by_keyword_filter": self.removed_keyword,
                "removed_by_semantic_filter": self.removed_semantic}


class GridSummary(BaseModel):
    """How many experiments the grid holds, and the items its LLM calls (HyDE, synthetic questions) failed on."""

    experiments: int
    failures: list[dict[str, Any]]


# ---------------------------------------------------------------- before a run

def _section(cfg: RunConfig) -> KnowOrNotConfig:
    """The config's knowornot section: a KnowOrNot run's config has one (``check_knowornot_inputs``)."""
    kon = cfg.knowornot
    assert kon is not None, "check_knowornot_inputs refuses a config without a knowornot section"
    return kon


def check_knowornot_inputs(cfg: RunConfig) -> None:
    """Everything a KnowOrNot run needs from its config, checked before anything is written."""
    if cfg.knowornot is None:
        raise InputError(str(cfg.source), "the config has no knowornot section (configs/knowornot-demo.yaml has one)",
                         field="knowornot")
    kon = _section(with_resolved_sources(cfg))
    written: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = cfg.knowornot.knowledge_bases or [cfg.knowornot]
    sources: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = kon.knowledge_bases or [kon]
    for source, as_written in zip(sources, written):
        if source.qa_pairs:
            _check_imported(source.qa_pairs, str(as_written.qa_pairs))
            load_qa_pairs(source.qa_pairs)
        else:
            read_documents(source.documents or [])


def _check_imported(path: str, as_written: str) -> None:
    """A released PolicyBench file that is not there yet: the one line says how to import it."""
    if Path(path).name in POLICYBENCH_FILES and "://" not in path and not Path(path).exists():
        raise InputError(as_written, "file not found (beside the config, nor in the working folder): "
                                     + policybench_import_hint(str(Path(as_written).parent)))


def with_resolved_sources(cfg: RunConfig) -> RunConfig:
    """The config with its QA file and documents resolved against the config's folder (tasks may run elsewhere)."""
    def resolved(source: Any) -> Any:
        return source.model_copy(update={
            "documents": [cfg.resolve_path(d) for d in source.documents or []] or None,
            "qa_pairs": cfg.resolve_path(source.qa_pairs) if source.qa_pairs else None,
        })

    kon = resolved(cfg.knowornot)
    if kon.knowledge_bases:
        kon = kon.model_copy(update={"knowledge_bases": [resolved(kb) for kb in kon.knowledge_bases]})
    return cfg.model_copy(update={"knowornot": kon})


def with_targets(cfg: RunConfig, usable: list[str]) -> RunConfig:
    """The config with only the targets that can run (``skip_unavailable`` left the others out)."""
    kon = _section(cfg)
    targets = [t for t in kon.targets if t in usable]
    if not targets:
        raise ModelUnavailable(f"{cfg.source or 'config'}: knowornot.targets: none of "
                               f"{', '.join(kon.targets)} can run")
    return cfg.model_copy(update={"knowornot": kon.model_copy(update={"targets": targets})})


def knowornot_models(kon: KnowOrNotConfig) -> list[str]:
    """The models a run calls: targets, evaluator, extractor and embedding model, each once."""
    helpers = [m for m in (kon.extractor, kon.embedding_model) if m]
    return list(dict.fromkeys(kon.targets + [kon.evaluator] + helpers))


def input_digest(kon: KnowOrNotConfig, templates: dict[str, str]) -> str:
    """What the stages read that their cache key cannot see: KB file contents, templates, package version."""
    return content_digest(kon.model_dump(mode="json"), source_digest(kon), templates, package_version())


def warm_up_embedder(cfg: RunConfig) -> None:
    """Start loading the embedding model in the background if this run will encode texts its call
    cache does not hold, so the model loads (seconds on 2 cores) while the flow run starts and the
    first stages run; a re-run over cached vectors never loads it. A base built from documents has
    its pairs only after its LLM calls, so it counts as needing the model."""
    kon = _section(with_resolved_sources(cfg))
    embedder = embedder_for(cfg)
    if not hasattr(getattr(embedder, "inner", embedder), "load_in_background"):
        return  # nothing to load (an API model, the hashing stand-in)
    texts: list[str] = []
    sources: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = kon.knowledge_bases or [kon]
    for source in sources:
        if not source.qa_pairs:
            start_loading(embedder)
            return
        texts += [pair_text(p) for p in load_qa_pairs(source.qa_pairs)]
    missing = getattr(embedder, "missing", None)
    if missing is None or missing(texts):
        start_loading(embedder)


def warm_up_overlap_audit() -> None:
    """Start importing what the overlap audit needs (scikit-learn, NLTK's stemmer, the report's plotting)
    on a background thread: the command's start mostly waits on Prefect's API, so the imports cost no
    wall time there, while beside the calls (``audit_beside_calls``) they would compete for the GIL."""
    def load() -> None:
        load_text_tools()
        importlib.import_module("refusalbench.tasks.knowornot.report.page")

    threading.Thread(target=load, name="kon-audit-imports", daemon=True).start()


def source_digest(kon: KnowOrNotConfig) -> str:
    """Content hash of the knowledge-base files (Prefect's cache cannot see file contents)."""
    digest = hashlib.sha256()
    sources: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = kon.knowledge_bases or [kon]
    for path in [p for s in sources for p in ([s.qa_pairs] if s.qa_pairs else []) + list(s.documents or [])]:
        p = Path(path)
        for file in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if file.is_file():
                digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------- knowledge base, filters, grid

@task(name="kon-knowledge-base", task_run_name="kon-knowledge-base", cache_policy=STAGE_CACHE, retries=1,
      retry_delay_seconds=2)
@with_plugins
def build_knowledge_base(cfg: RunConfig, out: str, input_digest: str, api_bases: dict[str, str]) -> KnowledgeBaseSummary:
    """QA pairs from a QA file, or from documents via sentences -> facts -> QA (LLM)."""
    kon = _section(cfg)
    store = ArtifactStore(out)
    failures: list[dict[str, Any]] = []
    if kon.qa_pairs:
        pairs = load_qa_pairs(kon.qa_pairs)
    else:
        model = kon.extractor or kon.evaluator
        gateway = gateway_for(cfg, api_bases)
        documents = read_documents(kon.documents or [])
        sentences = spread_sentences([s for d in documents for s in document_sentences(d)], kon.max_sentences)
        store.save(kon_files.SENTENCES, sentences)
        facts, fact_failures = extract_facts(gateway, model, documents, sentences,
                                             on_result=progress_callback("extract facts", len(sentences)))
        store.save(kon_files.FACTS, facts)
        pairs, qa_failures = generate_qa(gateway, model, facts, on_result=progress_callback("write QA pairs", len(facts)))
        failures = fact_failures + qa_failures
    store.save(kon_files.QA_PAIRS_ALL, pairs)
    return KnowledgeBaseSummary(pairs=len(pairs), failures=failures)


@task(name="kon-filter-index", task_run_name="kon-filter-index", cache_policy=STAGE_CACHE, retries=1,
      retry_delay_seconds=2)
@with_plugins
def filter_and_index(cfg: RunConfig, out: str, input_digest: str) -> FilterSummary:
    """Diversity filters, then the FAISS index over the kept pairs (reused when the KB is unchanged)."""
    kon = _section(cfg)
    store = ArtifactStore(out)
    pairs = store.load(kon_files.QA_PAIRS_ALL)
    embedder = embedder_for(cfg)
    method = filter_method(kon.filters)  # a multi-base run's slice carries its base's own filters and thresholds
    question_vectors = embedder.embed([p.question for p in pairs]) if method in ("both", "semantic") else None
    kept, report = diversity_filter(pairs, question_vectors, method=method, keyword_threshold=kon.keyword_threshold,
                                    semantic_threshold=kon.semantic_threshold)
    if kon.max_questions:
        kept = kept[: kon.max_questions]
    store.save(kon_files.QA_PAIRS, kept)
    store.save(kon_files.FILTER_REPORT, report)
    return FilterSummary(kept=len(kept), removed_keyword=report.removed_keyword, removed_semantic=report.removed_semantic,
                         index_rebuilt=_ensure_index(store, kept, embedder))


def _ensure_index(store: ArtifactStore, pairs: list[QAPair], embedder: Embedder) -> bool:
    """Build the FAISS index unless the run folder holds one of the same pairs and embedder; True if built."""
    fingerprint = kb_fingerprint(pairs, embedder.name)
    if (store.has(kon_files.KB_INDEX) and store.has(kon_files.KB_INDEX_META)
            and store.load(kon_files.KB_INDEX_META).fingerprint == fingerprint):
        return False
    vectors = embedder.embed([pair_text(p) for p in pairs])
    store.save(kon_files.KB_INDEX, index_to_bytes(build_index(vectors)))
    store.save(kon_files.KB_INDEX_META, IndexMeta(fingerprint=fingerprint, embedder=embedder.name, size=len(pairs)))
    return True


@task(name="kon-experiments", task_run_name="kon-experiments", cache_policy=STAGE_CACHE, retries=1,
      retry_delay_seconds=2)
@with_plugins
def build_experiments(cfg: RunConfig, out: str, input_digest: str, api_bases: dict[str, str]) -> GridSummary:
    """HyDE answers and synthetic questions (if asked for), then the grid with leave-one-out contexts."""
    kon = _section(cfg)
    store = ArtifactStore(out)
    pairs = store.load(kon_files.QA_PAIRS)
    embedder = embedder_for(cfg, api_bases)
    model = kon.extractor or kon.evaluator
    hyde: dict[str, Any] | None = None
    failures: list[dict[str, Any]] = []
    with ThreadPoolExecutor(1, thread_name_prefix="kon-questions") as encoder:
        # The questions are encoded while the HyDE calls are in flight (the same vectors either way).
        question_vectors = encoder.submit(embedder.embed, [p.question for p in pairs])
        if strategies_need(kon.retrieval, "hyde_embeddings"):
            answers, failures = hyde_answers(gateway_for(cfg, api_bases), model, pairs, kon.hyde_answers,
                                             on_result=progress_callback("HyDE answers", len(pairs)))
            store.save(kon_files.HYDE_ANSWERS, answers)
            hyde = _embedded_answers(embedder, answers)
    ookb: list[OOKBQuestion] = []
    if kon.synthetic_ookb:
        ookb, ookb_failures = synthetic_ookb_questions(gateway_for(cfg, api_bases), model, pairs, kon.synthetic_ookb,
                                                       seed=kon.seed, on_result=progress_callback("out-of-KB questions", 1))
        failures += ookb_failures
        store.save(kon_files.OOKB_QUESTIONS, ookb)
        if hyde is not None:
            # Synthetic questions need hypothetical answers too, or HyDE would have no query for them.
            ookb_pairs = [QAPair(id=q.id, question=q.question, answer="") for q in ookb]
            extra, extra_failures = hyde_answers(gateway_for(cfg, api_bases), model, ookb_pairs, kon.hyde_answers)
            failures += extra_failures
            hyde.update(_embedded_answers(embedder, extra))
    rows = build_experiment_inputs(pairs, question_vectors.result(),
                                   index_from_bytes(store.load(kon_files.KB_INDEX)), kon.targets, kon.retrieval,
                                   kon.prompts, k=kon.k, hyde_embeddings=hyde, ookb_questions=ookb,
                                   ookb_embeddings=embedder.embed([q.question for q in ookb]) if ookb else None)
    violations = loo_violations(rows)
    if violations:  # never send a leaked context to a target
        raise RuntimeError(f"leave-one-out violated: {violations[0]}")
    store.save(kon_files.EXPERIMENT_INPUTS, rows)
    return GridSummary(experiments=len(rows), failures=failures)


def _embedded_answers(embedder: Embedder, answers: list[HypotheticalAnswers]) -> dict[str, Any]:
    """Question id -> its hypothetical answers' vectors, all answers encoded in one batch."""
    vectors = embedder.embed([text for a in answers for text in a.answers])
    out, start = {}, 0
    for a in answers:
        out[a.question_id] = vectors[start:start + len(a.answers)]
        start += len(a.answers)
    return out


def save_stage_failures(store: ArtifactStore, failures: list[dict[str, Any]]) -> int:
    """Items an LLM stage could not process go to ``stage_failures.json`` (never dropped silently)."""
    if failures:
        store.save(kon_files.STAGE_FAILURES, failures)
    return len(failures)


# ---------------------------------------------------------------- answers and evaluations

def audit_beside_calls(cfg: RunConfig, out: str) -> Future[OverlapAudit]:
    """The run's overlap audit (``report.run_overlap_audit``), computed on a thread while the answers and
    evaluations are in flight, and its figure drawn (the report's plotting modules imported with it).

    All are CPU the metrics stage would otherwise spend after the last call: scikit-learn's TF-IDF
    (seconds to import on 2 cores) and matplotlib. The audit reads only what the experiment stage wrote,
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


@task(name="kon-answer-shard", task_run_name="kon-answer {target} {shard}", cache_policy=STAGE_CACHE, retries=1,
      retry_delay_seconds=2)
@with_plugins
def answer_shard(cfg: RunConfig, out: str, target: str, shard: str, input_digest: str, api_bases: dict[str, str]) -> str:
    """One target answers its rows of one input shard; returns the answer shard's name."""
    store = ArtifactStore(out)
    rows = [r for r in store.read_records(shard, ExperimentInput) if r.target == target]
    # The pairs and the grid are parsed once per process, not once per shard task (fanout.read_shared).
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    outputs = answer_experiments(gateway_for(cfg, api_bases), rows, pairs,
                                 on_result=progress_callback(f"{target} answers", len(rows)))
    return write_output_shard(out, ANSWER_SHARDS, target, shard, outputs, ExperimentOutput)


@task(name="kon-evaluate-shard", task_run_name="kon-evaluate {target} {answers}", cache_policy=STAGE_CACHE, retries=1,
      retry_delay_seconds=2)
@with_plugins
def evaluate_shard(cfg: RunConfig, out: str, target: str, answers: str, input_digest: str,
                   api_bases: dict[str, str]) -> str:
    """The evaluator judges one target's answer shard (abstention, factuality, then the config's own specs);
    returns the outcome shard."""
    store = ArtifactStore(out)
    outputs = store.read_records(answers, ExperimentOutput)
    rows = read_shared(out, kon_files.EXPERIMENT_INPUTS)
    kon = _section(cfg)
    specs = run_specs(kon.evaluations)
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    outcomes = evaluate_outputs(gateway_for(cfg, api_bases), kon.evaluator, specs, rows, outputs,
                                on_result=progress_callback("evaluate answers", len(specs) * len(outputs)), pairs=pairs)
    return write_output_shard(out, EVALUATION_SHARDS, target, answers, outcomes, EvalOutcome)


def answer_and_evaluate(cfg: RunConfig, out: str, digest: str, api_bases: dict[str, str]) -> dict[str, int]:
    """Every target answers the grid shard by shard; each answer shard is evaluated as soon as it is in.

    Writes ``experiment_outputs.parquet``, ``evaluations.parquet`` and the specs applied
    (``eval_specs.json``, which the label command reads); returns the counts for the
    manifest. Models sharing one local server take turns (see ``Fanout``).
    """
    kon = _section(cfg)
    fanout = Fanout(cfg, out, api_bases)
    fanout.store.save(kon_files.RUN_SPECS, run_specs(kon.evaluations))
    rows = read_shared(out, kon_files.EXPERIMENT_INPUTS)  # the evaluate tasks read the same parse
    shards = fanout.write_shards(INPUT_SHARDS, rows, ExperimentInput, kon.shard_size,
                                 lambda chunk: content_digest(digest, [r.model_dump() for r in chunk]))
    sharing = knowornot_models(kon)
    answered = fanout.submit(answer_shard, kon.targets, shards, sharing=sharing)
    evaluated = fanout.submit(evaluate_shard, kon.targets, lambda target: [
        Shard(future, content_digest(shard.digest, "evaluate")) for future, shard in zip(answered[target], shards)],
                              sharing=sharing)
    outputs: list[ExperimentOutput] = fanout.gather(answered, ExperimentOutput)
    outcomes: list[EvalOutcome] = fanout.gather(evaluated, EvalOutcome)
    fanout.store.save(kon_files.EXPERIMENT_OUTPUTS, outputs)
    fanout.store.save(kon_files.EVALUATIONS, outcomes)
    return {"responses": len(outputs), "response_errors": sum(o.error is not None for o in outputs),
            "evaluations": len(outcomes), "evaluation_errors": sum(o.error is not None for o in outcomes)}


# ---------------------------------------------------------------- evaluator comparison (App. D.3)

@task(name="kon-compare-evaluators-shard", task_run_name="kon-compare-evaluators {evaluator} {shard}",
      cache_policy=STAGE_CACHE, retries=1, retry_delay_seconds=2)
@with_plugins
def compare_evaluator_shard(cfg: RunConfig, out: str, evaluator: str, shard: str, input_digest: str,
                            api_bases: dict[str, str]) -> str:
    """One candidate evaluator judges one shard of the label sample's responses, each spec on its own
    sample's rows (the same evaluation code as the run's evaluator); returns the outcome shard."""
    store = ArtifactStore(out)
    outputs = store.read_records(shard, ExperimentOutput)
    specs = run_specs(_section(cfg).evaluations)
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    outcomes = evaluate_outputs(gateway_for(cfg, api_bases), evaluator, specs, read_shared(out, kon_files.EXPERIMENT_INPUTS),
                                outputs, on_result=progress_callback(f"{evaluator} (comparison)", len(outputs)),
                                pairs=pairs, judge_only=sample_ids_per_spec(store.load(kon_files.LABEL_SAMPLE)))
    return write_output_shard(out, COMPARISON_SHARDS, evaluator, shard, outcomes, EvalOutcome)


def compare_evaluators(cfg: RunConfig, out: str, digest: str, api_bases: dict[str, str],
                       evaluators: list[str]) -> dict[str, int]:
    """The ``knowornot.evaluator_comparison`` models that can run (``evaluators``) judge the label
    sample's responses, written to ``evaluator_comparison.parquet``; the human labels come after the
    run, so the scores against them are computed by ``knowornot agreement``. Returns the counts for
    the manifest."""
    kon = _section(cfg)
    fanout = Fanout(cfg, out, api_bases)
    per_spec = sample_ids_per_spec(fanout.store.load(kon_files.LABEL_SAMPLE))
    wanted = set().union(*per_spec.values()) if per_spec else set()
    outputs = [o for o in fanout.store.load(kon_files.EXPERIMENT_OUTPUTS) if o.experiment_id in wanted]
    # The shard's digest carries which spec each of its rows is sampled for: the task reads that from the sample.
    shards = fanout.write_shards(COMPARISON_INPUTS, outputs, ExperimentOutput, kon.shard_size, lambda chunk: content_digest(
        digest, "compare", [(o.experiment_id, sorted(s for s, ids in per_spec.items() if o.experiment_id in ids))
                            for o in chunk]))
    futures = fanout.submit(compare_evaluator_shard, evaluators, shards)
    outcomes: list[EvalOutcome] = fanout.gather(futures, EvalOutcome)
    fanout.store.save(kon_files.EVALUATOR_COMPARISON, outcomes)
    return {"comparison_evaluations": len(outcomes),
            "comparison_evaluation_errors": sum(o.error is not None for o in outcomes)}


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
    return StageTasks(build_knowledge_base.with_options(result_storage=storage),
                      filter_and_index.with_options(result_storage=storage),
                      build_experiments.with_options(result_storage=storage))
