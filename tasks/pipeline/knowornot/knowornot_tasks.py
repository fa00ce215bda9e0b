"""The KnowOrNot stages as Prefect tasks: run-folder files in, run-folder files out.

knowledge base -> diversity filter + FAISS index -> experiment grid -> answers (per target x
input shard) -> evaluations (per answer shard: the built-in specs, then the config's
``evaluations``) -> the ``evaluator_comparison`` candidates on the label sample's responses (per
candidate x shard). Each task reads what the stage before it wrote (declared in the run folder's
artifacts) and returns a small summary for the manifest, so a stage can be re-run alone and a
finished stage is served from Prefect's cache. What the cache key cannot see comes in as
``input_digest``; the run-time endpoints (``api_bases``) are left out of the key.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prefect import task
from pydantic import BaseModel

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.document_readers import read_documents
from refusalbench.tasks.knowornot.human.labels import sample_ids_per_spec
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.json_files import IndexMeta
from refusalbench.tasks.knowornot.schema.records import (
    EvalOutcome,
    ExperimentInput,
    ExperimentOutput,
    HypotheticalAnswers,
    OOKBQuestion,
    QAPair,
)
from refusalbench.tasks.knowornot.stages.diversity import diversity_filter, filter_method
from refusalbench.tasks.knowornot.stages.embeddings import Embedder, embedder_for
from refusalbench.tasks.knowornot.stages.evaluation import run_specs
from refusalbench.tasks.knowornot.stages.model_steps import (
    answer_experiments,
    evaluate_outputs,
    extract_facts,
    generate_qa,
    hyde_answers,
    synthetic_ookb_questions,
)
from refusalbench.tasks.knowornot.stages.retrieval import (
    build_experiment_inputs,
    build_index,
    index_from_bytes,
    index_to_bytes,
    kb_fingerprint,
    loo_violations,
    pair_text,
    strategies_need,
)
from refusalbench.tasks.knowornot.stages.sentences import document_sentences, spread_sentences
from refusalbench.tasks.knowornot.stages.sources import load_qa_pairs
from refusalbench.tasks.llm.gateway import gateway_for
from refusalbench.tasks.pipeline.budget import AdmittedCalls, not_after_a_stop
from refusalbench.tasks.pipeline.fanout import (
    progress_callback,
    read_shared,
    write_output_shard,
)
from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import knowornot_section
from refusalbench.tasks.pipeline.runtime import cache_policy, with_plugins

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
        return {
            "qa_pairs": self.kept,
            "removed_by_keyword_filter": self.removed_keyword,
            "removed_by_semantic_filter": self.removed_semantic,
        }


class GridSummary(BaseModel):
    """How many experiments the grid holds, and the items its LLM calls (HyDE, synthetic questions) failed on."""

    experiments: int
    failures: list[dict[str, Any]]


# ---------------------------------------------------------------- knowledge base, filters, grid


@task(
    name="kon-knowledge-base",
    task_run_name="kon-knowledge-base",
    cache_policy=STAGE_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=not_after_a_stop,
)
@with_plugins
def build_knowledge_base(
    cfg: RunConfig, out: str, input_digest: str, api_bases: dict[str, str]
) -> KnowledgeBaseSummary:
    """QA pairs from a QA file, or from documents via sentences -> facts -> QA (LLM)."""
    kon = knowornot_section(cfg)
    store = ArtifactStore(out)
    failures: list[dict[str, Any]] = []
    if kon.qa_pairs:
        pairs = load_qa_pairs(kon.qa_pairs)
    else:
        model = kon.extractor or kon.evaluator
        gateway = gateway_for(cfg, api_bases)
        facts_calls = AdmittedCalls(gateway, cfg, "facts", kon.shard_size)
        documents = read_documents(kon.documents or [])
        sentences = spread_sentences([s for d in documents for s in document_sentences(d)], kon.max_sentences)
        store.save(kon_files.SENTENCES, sentences)
        facts, fact_failures = extract_facts(
            facts_calls, model, documents, sentences, on_result=progress_callback("extract facts", len(sentences))
        )
        store.save(kon_files.FACTS, facts)
        pairs, qa_failures = generate_qa(
            AdmittedCalls(gateway, cfg, "qa", kon.shard_size),
            model,
            facts,
            on_result=progress_callback("write QA pairs", len(facts)),
        )
        failures = fact_failures + qa_failures
    store.save(kon_files.QA_PAIRS_ALL, pairs)
    return KnowledgeBaseSummary(pairs=len(pairs), failures=failures)


@task(
    name="kon-filter-index",
    task_run_name="kon-filter-index",
    cache_policy=STAGE_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=not_after_a_stop,
)
@with_plugins
def filter_and_index(cfg: RunConfig, out: str, input_digest: str) -> FilterSummary:
    """Diversity filters, then the FAISS index over the kept pairs (reused when the KB is unchanged)."""
    kon = knowornot_section(cfg)
    store = ArtifactStore(out)
    pairs = store.load(kon_files.QA_PAIRS_ALL)
    embedder = embedder_for(cfg)
    method = filter_method(kon.filters)  # a multi-base run's slice carries its base's own filters and thresholds
    question_vectors = embedder.embed([p.question for p in pairs]) if method in ("both", "semantic") else None
    kept, report = diversity_filter(
        pairs,
        question_vectors,
        method=method,
        keyword_threshold=kon.keyword_threshold,
        semantic_threshold=kon.semantic_threshold,
    )
    if kon.max_questions:
        kept = kept[: kon.max_questions]
    store.save(kon_files.QA_PAIRS, kept)
    store.save(kon_files.FILTER_REPORT, report)
    return FilterSummary(
        kept=len(kept),
        removed_keyword=report.removed_keyword,
        removed_semantic=report.removed_semantic,
        index_rebuilt=_ensure_index(store, kept, embedder),
    )


def _ensure_index(store: ArtifactStore, pairs: list[QAPair], embedder: Embedder) -> bool:
    """Build the FAISS index unless the run folder holds one of the same pairs and embedder; True if built."""
    fingerprint = kb_fingerprint(pairs, embedder.name)
    if (
        store.has(kon_files.KB_INDEX)
        and store.has(kon_files.KB_INDEX_META)
        and store.load(kon_files.KB_INDEX_META).fingerprint == fingerprint
    ):
        return False
    vectors = embedder.embed([pair_text(p) for p in pairs])
    store.save(kon_files.KB_INDEX, index_to_bytes(build_index(vectors)))
    store.save(kon_files.KB_INDEX_META, IndexMeta(fingerprint=fingerprint, embedder=embedder.name, size=len(pairs)))
    return True


@task(
    name="kon-experiments",
    task_run_name="kon-experiments",
    cache_policy=STAGE_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=not_after_a_stop,
)
@with_plugins
def build_experiments(cfg: RunConfig, out: str, input_digest: str, api_bases: dict[str, str]) -> GridSummary:
    """HyDE answers and synthetic questions (if asked for), then the grid with leave-one-out contexts."""
    kon = knowornot_section(cfg)
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
            answers, failures = hyde_answers(
                AdmittedCalls(gateway_for(cfg, api_bases), cfg, "hyde", kon.shard_size),
                model,
                pairs,
                kon.hyde_answers,
                on_result=progress_callback("HyDE answers", len(pairs)),
            )
            store.save(kon_files.HYDE_ANSWERS, answers)
            hyde = _embedded_answers(embedder, answers)
    ookb: list[OOKBQuestion] = []
    if kon.synthetic_ookb:
        ookb, ookb_failures = synthetic_ookb_questions(
            AdmittedCalls(gateway_for(cfg, api_bases), cfg, "ookb", kon.shard_size),
            model,
            pairs,
            kon.synthetic_ookb,
            seed=kon.seed,
            on_result=progress_callback("out-of-KB questions", 1),
        )
        failures += ookb_failures
        store.save(kon_files.OOKB_QUESTIONS, ookb)
        if hyde is not None:
            # Synthetic questions need hypothetical answers too, or HyDE would have no query for them.
            ookb_pairs = [QAPair(id=q.id, question=q.question, answer="") for q in ookb]
            hyde_calls = AdmittedCalls(gateway_for(cfg, api_bases), cfg, "hyde", kon.shard_size)
            extra, extra_failures = hyde_answers(hyde_calls, model, ookb_pairs, kon.hyde_answers)
            failures += extra_failures
            hyde.update(_embedded_answers(embedder, extra))
    rows = build_experiment_inputs(
        pairs,
        question_vectors.result(),
        index_from_bytes(store.load(kon_files.KB_INDEX)),
        kon.targets,
        kon.retrieval,
        kon.prompts,
        k=kon.k,
        hyde_embeddings=hyde,
        ookb_questions=ookb,
        ookb_embeddings=embedder.embed([q.question for q in ookb]) if ookb else None,
    )
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
        out[a.question_id] = vectors[start : start + len(a.answers)]
        start += len(a.answers)
    return out


# ---------------------------------------------------------------- answers and evaluations


@task(
    name="kon-answer-shard",
    task_run_name="kon-answer {target} {shard}",
    cache_policy=STAGE_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=not_after_a_stop,
)
@with_plugins
def answer_shard(
    cfg: RunConfig, out: str, target: str, shard: str, input_digest: str, api_bases: dict[str, str]
) -> str:
    """One target answers its rows of one input shard; returns the answer shard's name."""
    store = ArtifactStore(out)
    rows = [r for r in store.read_records(shard, ExperimentInput) if r.target == target]
    # The pairs and the grid are parsed once per process, not once per shard task (fanout.read_shared).
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    outputs = answer_experiments(
        gateway_for(cfg, api_bases), rows, pairs, on_result=progress_callback(f"{target} answers", len(rows))
    )
    return write_output_shard(out, ANSWER_SHARDS, target, shard, outputs, ExperimentOutput)


@task(
    name="kon-evaluate-shard",
    task_run_name="kon-evaluate {target} {answers}",
    cache_policy=STAGE_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=not_after_a_stop,
)
@with_plugins
def evaluate_shard(
    cfg: RunConfig, out: str, target: str, answers: str, input_digest: str, api_bases: dict[str, str]
) -> str:
    """The evaluator judges one target's answer shard (abstention, factuality, then the config's own specs);
    returns the outcome shard."""
    store = ArtifactStore(out)
    outputs = store.read_records(answers, ExperimentOutput)
    rows = read_shared(out, kon_files.EXPERIMENT_INPUTS)
    kon = knowornot_section(cfg)
    specs = run_specs(kon.evaluations)
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    outcomes = evaluate_outputs(
        gateway_for(cfg, api_bases),
        kon.evaluator,
        specs,
        rows,
        outputs,
        on_result=progress_callback("evaluate answers", len(specs) * len(outputs)),
        pairs=pairs,
    )
    return write_output_shard(out, EVALUATION_SHARDS, target, answers, outcomes, EvalOutcome)


# ---------------------------------------------------------------- evaluator comparison (App. D.3)


@task(
    name="kon-compare-evaluators-shard",
    task_run_name="kon-compare-evaluators {evaluator} {shard}",
    cache_policy=STAGE_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=not_after_a_stop,
)
@with_plugins
def compare_evaluator_shard(
    cfg: RunConfig, out: str, evaluator: str, shard: str, input_digest: str, api_bases: dict[str, str]
) -> str:
    """One candidate evaluator judges one shard of the label sample's responses, each spec on its own
    sample's rows (the same evaluation code as the run's evaluator); returns the outcome shard."""
    store = ArtifactStore(out)
    outputs = store.read_records(shard, ExperimentOutput)
    specs = run_specs(knowornot_section(cfg).evaluations)
    pairs = {p.id: p for p in read_shared(out, kon_files.QA_PAIRS)}
    outcomes = evaluate_outputs(
        gateway_for(cfg, api_bases),
        evaluator,
        specs,
        read_shared(out, kon_files.EXPERIMENT_INPUTS),
        outputs,
        on_result=progress_callback(f"{evaluator} (comparison)", len(outputs)),
        pairs=pairs,
        judge_only=sample_ids_per_spec(store.load(kon_files.LABEL_SAMPLE)),
    )
    return write_output_shard(out, COMPARISON_SHARDS, evaluator, shard, outcomes, EvalOutcome)
