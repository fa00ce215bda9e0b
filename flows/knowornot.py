"""KnowOrNot flow: out-of-knowledge-base robustness with leave-one-out experiments.

documents -> sentences (NLTK, offline) -> atomic facts (LLM) -> QA pairs (LLM)
  [or a QA file] -> diversity filters (TF-IDF + MiniLM) -> FAISS index (built once per KB,
  kept in the run folder) -> experiment grid (targets x retrieval x system prompt, the
  question's own pair never in its context) -> target answers -> evaluator (abstention,
  then factuality for answers) -> rates with bootstrap intervals -> a sample to label.

Each stage is a Prefect task reading and writing files in the run folder, so a stage can
be re-run alone and finished stages are served from cache.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd
from prefect import flow

from refusalbench.flows.common import check_or_raise, chunks, content_digest, configured, model_endpoints
from refusalbench.tasks.config import load_config
from refusalbench.tasks.errors import InputError
from refusalbench.tasks.provenance import ManifestRecorder, package_version
from refusalbench.tasks.store import ArtifactStore

INDEX_FILE = "kb.faiss"


def _embedder(name: str):
    from refusalbench.tasks.knowornot.embeddings import HashingEmbedder, get_embedder

    return HashingEmbedder() if name == "hashing" else get_embedder()


def _cached_task(fn, name: str, out: str):
    from refusalbench.tasks.shards import model_task

    return model_task(fn, name, name, out)


# ---------------------------------------------------------------- stages (thin: files in, files out)

def build_kb(config: dict, out: str, input_digest: str, api_bases: dict[str, str]) -> dict[str, Any]:
    """QA pairs from a QA file, or from documents via sentences -> facts -> QA (LLM)."""
    from refusalbench.tasks.gateway import gateway_for
    from refusalbench.tasks.knowornot.llm_stages import extract_facts, generate_qa
    from refusalbench.tasks.knowornot.records import AtomicFact, QAPair, Sentence, load_qa_pairs
    from refusalbench.tasks.knowornot.sentences import document_sentences, read_documents
    from refusalbench.tasks.shards import progress_callback

    kon = config["knowornot"]
    store = ArtifactStore(out)
    failures: list[dict] = []
    if kon.get("qa_pairs"):
        pairs = load_qa_pairs(kon["qa_pairs"])
    else:
        model = kon.get("extractor") or kon["evaluator"]
        gateway = gateway_for(config, api_bases)
        documents = read_documents(kon["documents"])
        sentences = [s for d in documents for s in document_sentences(d)]
        store.write_records("sentences.parquet", sentences, Sentence)
        facts, fact_failures = extract_facts(gateway, model, documents, sentences,
                                             on_result=progress_callback("extract facts", len(sentences)))
        store.write_records("facts.parquet", facts, AtomicFact)
        pairs, qa_failures = generate_qa(gateway, model, facts, on_result=progress_callback("write QA pairs", len(facts)))
        failures = fact_failures + qa_failures
    store.write_records("qa_pairs_all.parquet", pairs, QAPair)
    return {"pairs": len(pairs), "failures": failures}


def filter_and_index(config: dict, out: str, input_digest: str) -> dict[str, Any]:
    """Diversity filters, then the FAISS index over the kept pairs (reused when the KB is unchanged)."""
    from refusalbench.tasks.knowornot.diversity import diversity_filter
    from refusalbench.tasks.knowornot.records import QAPair
    from refusalbench.tasks.knowornot.retrieval import build_index, index_to_bytes, kb_fingerprint, pair_text

    kon = config["knowornot"]
    store = ArtifactStore(out)
    pairs = store.read_records("qa_pairs_all.parquet", QAPair)
    embedder = _embedder(kon.get("embedder", "minilm"))
    filters = kon.get("filters") or []
    method = "both" if len(filters) == 2 else (filters[0] if filters else "none")
    question_vectors = embedder.embed([p.question for p in pairs]) if method in ("both", "semantic") else None
    kept, report = diversity_filter(pairs, question_vectors, method=method, keyword_threshold=kon["keyword_threshold"],
                                    semantic_threshold=kon["semantic_threshold"])
    if kon.get("max_questions"):
        kept = kept[: kon["max_questions"]]
    store.write_records("qa_pairs.parquet", kept, QAPair)
    store.write_json("filter_report.json", report.model_dump())
    fingerprint = kb_fingerprint(kept, embedder.name)
    meta = store.read_json(INDEX_FILE + ".json") if store.exists(INDEX_FILE + ".json") else {}
    if meta.get("fingerprint") != fingerprint or not store.exists(INDEX_FILE):
        vectors = embedder.embed([pair_text(p) for p in kept])
        store.write_bytes(INDEX_FILE, index_to_bytes(build_index(vectors)))
        store.write_json(INDEX_FILE + ".json", {"fingerprint": fingerprint, "embedder": embedder.name, "size": len(kept)})
        rebuilt = True
    else:
        rebuilt = False
    return {"kept": len(kept), "removed_keyword": report.removed_keyword, "removed_semantic": report.removed_semantic,
            "index_rebuilt": rebuilt}


def build_experiments(config: dict, out: str, input_digest: str, api_bases: dict[str, str]) -> dict[str, Any]:
    """HyDE answers (if asked for) and the experiment grid with leave-one-out contexts."""
    from refusalbench.tasks.gateway import gateway_for
    from refusalbench.tasks.knowornot.llm_stages import hyde_answers, synthetic_ookb_questions
    from refusalbench.tasks.knowornot.records import ExperimentInput, HypotheticalAnswers, OOKBQuestion, QAPair
    from refusalbench.tasks.knowornot.retrieval import build_experiment_inputs, index_from_bytes, loo_violations
    from refusalbench.tasks.shards import progress_callback

    kon = config["knowornot"]
    store = ArtifactStore(out)
    pairs = store.read_records("qa_pairs.parquet", QAPair)
    embedder = _embedder(kon.get("embedder", "minilm"))
    index = index_from_bytes(store.read_bytes(INDEX_FILE))
    question_vectors = embedder.embed([p.question for p in pairs])
    hyde = None
    failures: list[dict] = []
    if "hyde_rag" in kon["retrieval"]:
        model = kon.get("extractor") or kon["evaluator"]
        answers, failures = hyde_answers(gateway_for(config, api_bases), model, pairs, kon["hyde_answers"],
                                         on_result=progress_callback("HyDE answers", len(pairs)))
        store.write_records("hyde_answers.parquet", answers, HypotheticalAnswers)
        hyde = {a.question_id: embedder.embed(a.answers) for a in answers}
    ookb: list = []
    if kon.get("synthetic_ookb"):
        model = kon.get("extractor") or kon["evaluator"]
        ookb, ookb_failures = synthetic_ookb_questions(gateway_for(config, api_bases), model, pairs, kon["synthetic_ookb"],
                                                       seed=kon["seed"], on_result=progress_callback("out-of-KB questions", 1))
        failures += ookb_failures
        store.write_records("ookb_questions.parquet", ookb, OOKBQuestion)
        if hyde is not None:
            # Synthetic questions need hypothetical answers too, or hyde_rag would have no query for them.
            ookb_pairs = [QAPair(id=q.id, question=q.question, answer="") for q in ookb]
            extra, extra_failures = hyde_answers(gateway_for(config, api_bases), model, ookb_pairs, kon["hyde_answers"])
            failures += extra_failures
            hyde.update({a.question_id: embedder.embed(a.answers) for a in extra})
    rows = build_experiment_inputs(pairs, question_vectors, index, kon["targets"], kon["retrieval"], kon["prompts"],
                                   k=kon["k"], hyde_embeddings=hyde, ookb_questions=ookb,
                                   ookb_embeddings=embedder.embed([q.question for q in ookb]) if ookb else None)
    violations = loo_violations(rows)
    if violations:  # never send a leaked context to a target
        raise RuntimeError(f"leave-one-out violated: {violations[0]}")
    store.write_records("experiment_inputs.parquet", rows, ExperimentInput)
    return {"experiments": len(rows), "failures": failures}


def answer_shard(config: dict, out: str, target: str, shard: str, input_digest: str, api_bases: dict[str, str]) -> str:
    from refusalbench.tasks.gateway import gateway_for
    from refusalbench.tasks.knowornot.llm_stages import answer_experiments
    from refusalbench.tasks.knowornot.records import ExperimentInput, ExperimentOutput, QAPair
    from refusalbench.tasks.shards import progress_callback, write_output_shard

    store = ArtifactStore(out)
    rows = [r for r in store.read_records(shard, ExperimentInput) if r.target == target]
    pairs = {p.id: p for p in store.read_records("qa_pairs.parquet", QAPair)}
    outputs = answer_experiments(gateway_for(config, api_bases), rows, pairs,
                                 on_result=progress_callback(f"{target} answers", len(rows)))
    return write_output_shard(out, "kon-answers", target, shard, outputs, ExperimentOutput)


def evaluate_shard(config: dict, out: str, answers: str, input_digest: str, api_bases: dict[str, str]) -> str:
    from refusalbench.tasks.gateway import gateway_for
    from refusalbench.tasks.knowornot.evaluation import ABSTENTION, FACTUALITY
    from refusalbench.tasks.knowornot.llm_stages import evaluate_outputs
    from refusalbench.tasks.knowornot.records import EvalOutcome, ExperimentInput, ExperimentOutput
    from refusalbench.tasks.shards import progress_callback

    kon = config["knowornot"]
    store = ArtifactStore(out)
    outputs = store.read_records(answers, ExperimentOutput)
    rows = store.read_records("experiment_inputs.parquet", ExperimentInput)
    outcomes = evaluate_outputs(gateway_for(config, api_bases), kon["evaluator"], [ABSTENTION, FACTUALITY], rows, outputs,
                                on_result=progress_callback("evaluate answers", 2 * len(outputs)))
    name = answers.replace("kon-answers", "kon-evaluations")
    store.write_records(name, outcomes, EvalOutcome)
    return name


# ---------------------------------------------------------------- flow

@flow(name="refusalbench-knowornot", log_prints=True)
def knowornot_flow(config_path: str, out: str) -> dict[str, Any]:
    from refusalbench.tasks.knowornot.evaluation import knowornot_metrics
    from refusalbench.tasks.knowornot.labels import stratified_label_sample
    from refusalbench.tasks.knowornot.records import EvalOutcome, ExperimentInput, ExperimentOutput, QAPair
    from refusalbench.tasks.ui_artifacts import publish_link, publish_table
    from refusalbench.tasks.prompting import all_template_hashes

    cfg = load_config(config_path)
    kon = cfg.knowornot
    store = ArtifactStore(out)
    recorder = ManifestRecorder(store, "knowornot", config=cfg, seed=kon.seed)
    template_hashes = all_template_hashes()
    recorder.hashes(prompts=template_hashes)
    config_dump = cfg.model_dump(mode="json")
    config_dump["knowornot"]["documents"] = [cfg.resolve_path(d) for d in kon.documents or []] or None
    config_dump["knowornot"]["qa_pairs"] = cfg.resolve_path(kon.qa_pairs) if kon.qa_pairs else None
    base_digest = content_digest(config_dump["knowornot"], _source_digest(config_dump["knowornot"]), template_hashes,
                          package_version())
    try:
        needed = list(dict.fromkeys(kon.targets + [kon.evaluator] + ([kon.extractor] if kon.extractor else [])))
        check_or_raise(cfg, needed)
        with model_endpoints(cfg, needed) as api_bases:
            with recorder.stage("knowledge base"):
                kb = _cached_task(build_kb, "kon-knowledge-base", out)(config_dump, out, base_digest, api_bases)
                recorder.count(qa_pairs_all=kb["pairs"])
            with recorder.stage("diversity filter + index"):
                filtered = _cached_task(filter_and_index, "kon-filter-index", out)(config_dump, out, base_digest)
                recorder.count(qa_pairs=filtered["kept"], removed_by_keyword_filter=filtered["removed_keyword"],
                               removed_by_semantic_filter=filtered["removed_semantic"])
            with recorder.stage("experiments"):
                grid = _cached_task(build_experiments, "kon-experiments", out)(config_dump, out, base_digest, api_bases)
                recorder.count(experiments=grid["experiments"])
                failures = kb["failures"] + grid["failures"]
                recorder.count(stage_failures=len(failures))
                if failures:
                    store.write_json("stage_failures.json", failures)
            with recorder.stage("answer + evaluate"):
                rows = store.read_records("experiment_inputs.parquet", ExperimentInput)
                shards = []
                for index, chunk in enumerate(chunks(rows, kon.shard_size)):
                    name = f"_work/kon-inputs-{index:04d}.parquet"
                    store.write_records(name, chunk, ExperimentInput)
                    shards.append(name)
                answer = _cached_task(answer_shard, "kon-answer-shard", out)
                evaluate = _cached_task(evaluate_shard, "kon-evaluate-shard", out)
                answer_futures = [answer.submit(config_dump, out, t, s, content_digest(base_digest, s, len(rows)), api_bases)
                                  for t in kon.targets for s in shards]
                eval_futures = [evaluate.submit(config_dump, out, f, content_digest(base_digest, "eval"), api_bases)
                                for f in answer_futures]
                outputs = [o for f in answer_futures for o in store.read_records(f.result(), ExperimentOutput)]
                outcomes = [o for f in eval_futures for o in store.read_records(f.result(), EvalOutcome)]
                store.write_records("experiment_outputs.parquet", outputs, ExperimentOutput)
                store.write_records("evaluations.parquet", outcomes, EvalOutcome)
                recorder.count(responses=len(outputs), response_errors=sum(o.error is not None for o in outputs),
                               evaluations=len(outcomes), evaluation_errors=sum(o.error is not None for o in outcomes))
        with recorder.stage("metrics"):
            frame = results_frame(rows, outputs, outcomes, store.read_records("qa_pairs.parquet", QAPair))
            store.write_frame("results.parquet", frame)
            metrics = knowornot_metrics(frame, seed=kon.seed)
            store.write_frame("metrics.parquet", metrics)
            store.write_json("metrics.json", {"configurations": metrics.to_dict(orient="records"),
                                              "filter_report": store.read_json("filter_report.json")})
            sample = stratified_label_sample(frame[frame["response"].notna()], kon.label_sample, seed=kon.seed)
            store.write_frame("label_sample.parquet", sample)
            report_uri = store.write_text("report.html", knowornot_report(metrics, store.read_json("filter_report.json"),
                                                                          recorder.manifest.counts))
            publish_table("knowornot-rates", _records(metrics), "Abstention and factuality per configuration")
            publish_link("knowornot-report", report_uri if "://" in report_uri else f"file://{report_uri}", "report.html")
        from refusalbench.tasks.prefect_runtime import run_call_stats

        recorder.calls(run_call_stats(config_dump))
        recorder.finish("completed")
    except BaseException:
        recorder.finish("failed")
        raise
    return {"metrics": store.uri("metrics.json"), "report": store.uri("report.html"), "experiments": len(rows)}


def _source_digest(kon: dict) -> str:
    """Content hash of the knowledge-base files (Prefect's cache cannot see file contents)."""
    from pathlib import Path

    digest = hashlib.sha256()
    for path in ([kon["qa_pairs"]] if kon.get("qa_pairs") else []) + list(kon.get("documents") or []):
        p = Path(path)
        for file in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if file.is_file():
                digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


def results_frame(rows, outputs, outcomes, pairs) -> pd.DataFrame:
    """One row per experiment: inputs, response, and the evaluator's outcomes."""
    base = pd.DataFrame([r.model_dump() for r in rows])
    answers = pd.DataFrame([o.model_dump() for o in outputs])[["experiment_id", "response", "error"]]
    frame = base.merge(answers, on="experiment_id", how="left")
    judged = pd.DataFrame([o.model_dump() for o in outcomes]) if outcomes else pd.DataFrame(columns=["experiment_id", "spec", "outcome"])
    for spec in ("abstention", "factuality"):
        column = judged[judged["spec"] == spec].set_index("experiment_id")["outcome"] if len(judged) else pd.Series(dtype=object)
        frame[spec] = frame["experiment_id"].map(column)
    texts = {p.id: p for p in pairs}
    frame["context"] = frame["context_ids"].map(lambda ids: "\n".join(texts[i].question + " " + texts[i].answer for i in ids))
    return frame


def knowornot_report(metrics: pd.DataFrame, filter_report: dict, counts: dict) -> str:
    import html

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "–" if np.isnan(v) else f"{v:.3f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in metrics.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in metrics.itertuples(index=False))
    facts = "".join(f"<li>{html.escape(str(k))}: {cell(v)}</li>" for k, v in counts.items())
    filt = (f"kept {filter_report.get('n_kept')} of {filter_report.get('n_input')} QA pairs; keyword filter removed "
            f"{filter_report.get('removed_keyword')}, semantic filter removed {filter_report.get('removed_semantic')}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>KnowOrNot report</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
            "</style></head><body><h1>KnowOrNot: out-of-knowledge-base robustness</h1>"
            f"<p>{html.escape(filt)}</p><h2>Abstention and factuality per configuration</h2>"
            "<p>abstention rate = abstained / evaluated; factuality rate = (tier_1 + tier_2) / answers evaluated; "
            "95% bootstrap intervals.</p>"
            f"<table><tr>{head}</tr>{body}</table><h2>Counts</h2><ul>{facts}</ul></body></html>")


def run_knowornot(config_path: str, out: str) -> dict[str, Any]:
    """CLI entry: bad input is reported before anything is written."""
    from refusalbench.tasks.knowornot.records import load_qa_pairs
    from refusalbench.tasks.knowornot.sentences import read_documents

    cfg = load_config(config_path)
    if cfg.knowornot is None:
        raise InputError(str(config_path), "the config has no knowornot section", field="knowornot")
    if cfg.knowornot.qa_pairs:
        load_qa_pairs(cfg.resolve_path(cfg.knowornot.qa_pairs))
    else:
        read_documents([cfg.resolve_path(d) for d in cfg.knowornot.documents or []])
    return configured(knowornot_flow, cfg, out)(config_path, out)
