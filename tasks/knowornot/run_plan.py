"""KnowOrNot's plan before spending: the calls, tokens, dollars and hours a run of a config would take.

``plan_knowornot`` makes no model call. Per knowledge base it reads what the run would read (its
documents, split into sentences by NLTK's Punkt as the run splits them, or its QA file) and counts
the calls of each stage; ``llm/plan_pricing.py`` prices, times and sums them as for RefusalBench.

- facts: one extraction call per sentence (after ``max_sentences``): exact.
- qa: one call per extracted fact. How many facts a sentence gives is known only after the run, so
  the count is an estimate (``~``) at ``FACTS_PER_SENTENCE`` facts per sentence.
- filter: the diversity filters and the index: embeddings, no model call.
- embed: the embedding model's requests (``embedder: api``), ``EMBED_BATCH`` texts each: every question
  (the semantic filter and the grid's retrieval share their vectors), every pair for the index, each
  HyDE answer and each synthetic question; tokens as characters / 4 of those texts, no output. A
  local embedder (MiniLM) makes no call.
- hyde: one call per question when a retrieval strategy reads hypothetical answers (``hyde_rag``),
  and one per synthetic out-of-KB question.
- ookb: one call per five synthetic out-of-KB questions (``synthetic_ookb``).
- answer: every question (leave-one-out) and synthetic question x retrieval strategy x system prompt,
  per target.
- evaluate: abstention for every answer; factuality and each ``applies_to: answered`` spec at most for
  every answer (only those that did not abstain; never a synthetic question's, which has no expected
  answer); each other spec of the config's for every answer.
- compare: each ``evaluator_comparison`` model judges at most ``label_sample`` responses per spec.

The questions are the pairs the diversity filters keep, capped by ``max_questions``: a QA file's
count is exact without filters and a bound with them; from documents it is ``max_questions`` (a
bound) where the estimated pairs reach it, else the estimate.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.config_sections import KnowledgeBaseSource, KnowOrNotConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.knowornot.document_readers import read_documents
from refusalbench.tasks.knowornot.schema.records import QAPair
from refusalbench.tasks.knowornot.stages.evaluation import render_eval_messages, run_specs
from refusalbench.tasks.knowornot.stages.retrieval import RETRIEVERS, format_context, pair_text, strategies_need
from refusalbench.tasks.knowornot.stages.sentences import document_sentences, spread_sentences
from refusalbench.tasks.knowornot.stages.sources import POLICYBENCH_FILES, load_qa_pairs, policybench_import_hint
from refusalbench.tasks.llm.plan_pricing import CHARS_PER_TOKEN, Prompt, StageWork, counted, priced_plan, prompt
from refusalbench.tasks.llm.plan_results import Plan
from refusalbench.tasks.llm.prompting import render_messages
from refusalbench.tasks.llm.structured_outputs import AtomicFacts, HydeOutput, OOKBQuestionsOutput, QAPairOutput

STAGES = ("facts", "qa", "filter", "hyde", "ookb", "embed", "answer", "evaluate", "compare")
EMBED_BATCH = 64  # texts per embedding request (the ``api`` embedder's batch_size)
# Atomic facts per document sentence: an assumption (a sentence usually states one to three facts).
FACTS_PER_SENTENCE = 2
OOKB_PER_CALL = 5  # synthetic out-of-KB questions asked for per call (model_steps.synthetic_ookb_questions)
SAMPLE_PROMPTS = 8  # prompts rendered per stage to size its calls (their mean stands for every call)


@dataclass
class _Base:
    """What one knowledge base would give the run: its questions, and how sure that count is."""

    name: str
    sentences: int  # 0: a QA file
    pairs: list[QAPair]  # the real pairs (QA file) or stand-ins made from the sentences
    questions: int
    bounded: bool  # questions is a ceiling
    estimated: bool  # questions rests on FACTS_PER_SENTENCE
    fact_prompts: list[Prompt]


def _fail(cfg: RunConfig, field: str, problem: str) -> InputError:
    return InputError(str(cfg.source), f"knowornot: {problem}", field=field)


def _read_base(cfg: RunConfig, kon: KnowOrNotConfig, source: KnowledgeBaseSource | KnowOrNotConfig, name: str) -> _Base:
    filters = source.filtering(kon)["filters"] if isinstance(source, KnowledgeBaseSource) else kon.filters
    field = f"knowornot.knowledge_bases.{name}" if isinstance(source, KnowledgeBaseSource) else "knowornot"
    cap = kon.max_questions
    if source.qa_pairs:
        path = cfg.resolve_path(source.qa_pairs)
        if Path(path).name in POLICYBENCH_FILES and "://" not in path and not Path(path).exists():
            hint = policybench_import_hint(str(Path(source.qa_pairs).parent))
            raise InputError(source.qa_pairs, f"file not found (beside the config, nor in the working folder): {hint}")
        pairs = load_qa_pairs(path)
        if not pairs:
            raise _fail(cfg, f"{field}.qa_pairs", f"0 QA pairs in {source.qa_pairs}")
        questions = min(len(pairs), cap) if cap else len(pairs)
        return _Base(name, 0, pairs, questions, bool(filters), False, [])
    documents = read_documents([cfg.resolve_path(d) for d in source.documents or []])
    sentences = spread_sentences([s for d in documents for s in document_sentences(d)], kon.max_sentences)
    if not sentences:
        raise _fail(cfg, f"{field}.documents", "0 sentences in the documents: no fact to extract")
    texts = {d.doc_id: d.text for d in documents}
    fact_prompts = [
        prompt(
            render_messages(
                "kon_fact_extraction.j2", sentence=s.text, sentence_index=s.index, document_context=texts[s.doc_id]
            ),
            AtomicFacts,
        )
        for s in sentences[:SAMPLE_PROMPTS]
    ]
    # Stand-in pairs: a sentence as both question and answer sizes the prompts that carry pairs.
    stand_ins = [QAPair(id=f"s{i}", question=s.text, answer=s.text) for i, s in enumerate(sentences)]
    expected = len(sentences) * FACTS_PER_SENTENCE
    if cap and expected >= cap:
        return _Base(name, len(sentences), stand_ins, cap, True, False, fact_prompts)
    return _Base(name, len(sentences), stand_ins, expected, False, True, fact_prompts)


def _context_size(retrieval: str, k: int, questions: int) -> int:
    """Pairs in one question's context: none (direct), k (a k-neighbour strategy), else every other pair."""
    if retrieval == "direct":
        return 0
    others = max(questions - 1, 0)
    return min(k, others) if RETRIEVERS.lookup(retrieval).uses_k else others


def _answer_prompts(kon: KnowOrNotConfig, base: _Base) -> list[Prompt]:
    pairs = base.pairs[: max(base.questions, 1)]
    out = []
    for retrieval in kon.retrieval:
        context = format_context(pairs[1 : 1 + _context_size(retrieval, kon.k, len(pairs))])
        for name in kon.prompts:
            messages = render_messages(f"kon_system_{name}.j2", context_block=context, question=pairs[0].question)
            out.append(prompt(messages))
    return out


def _eval_prompts(kon: KnowOrNotConfig, base: _Base) -> dict[str, list[Prompt]]:
    """Per spec, its prompts with the reference answer standing in for the response."""
    out: dict[str, list[Prompt]] = {}
    for spec in run_specs(kon.evaluations):
        rendered = []
        for pair in base.pairs[:SAMPLE_PROMPTS]:
            fields: dict[str, Any] = {
                "question": pair.question,
                "response": pair.answer,
                "expected_answer": pair.answer,
                "context": format_context(base.pairs[1 : 1 + kon.k]) or "(no context)",
            }
            messages = render_eval_messages(spec, fields)
            if messages is not None:
                rendered.append(prompt(messages))
        out[spec.name] = rendered
    return out


def _bases(cfg: RunConfig, kon: KnowOrNotConfig) -> list[_Base]:
    if kon.knowledge_bases:
        return [_read_base(cfg, kon, kb, kb.name) for kb in kon.knowledge_bases]
    return [_read_base(cfg, kon, kon, "")]


def _work(cfg: RunConfig, kon: KnowOrNotConfig, bases: list[_Base], targets: list[str]) -> dict[str, StageWork]:
    models, helper = cfg.models, kon.extractor or kon.evaluator
    grid = len(kon.retrieval) * len(kon.prompts)
    ookb = kon.synthetic_ookb
    sentences = sum(b.sentences for b in bases)
    questions = sum(b.questions for b in bases) + ookb * len(bases)
    facts = sentences * FACTS_PER_SENTENCE
    work = {name: StageWork(note="") for name in STAGES}
    work["facts"].note = f"{counted(sentences, 'sentence')} (NLTK Punkt, after max_sentences) x 1 call (exact)"
    work["qa"].note = f"~{counted(facts, 'fact')} (assumed {FACTS_PER_SENTENCE} per sentence) x 1 call"
    pairs_note = "the QA files' pairs" if not sentences else "the generated pairs"
    work["filter"].note = (
        f"diversity filters ({', '.join(kon.filters) or 'none'}) and the index over {pairs_note}: "
        f"embeddings by {kon.embedder}, no model call"
    )
    hyde = strategies_need(kon.retrieval, "hyde_embeddings")
    work["hyde"].note = (
        f"{counted(questions, 'question')} x 1 call ({kon.hyde_answers} hypothetical answers each)"
        if hyde
        else "no retrieval strategy reads hypothetical answers"
    )
    ookb_calls = max(1, -(-ookb // OOKB_PER_CALL)) * len(bases) if ookb else 0
    _embed_work(cfg, kon, bases, work["embed"], hyde)
    work["ookb"].note = f"{counted(ookb_calls, 'call')} for {counted(ookb, 'synthetic question')} per base"
    answers = questions * grid
    work["answer"].note = (
        f"{counted(questions, 'question')} x {counted(len(kon.retrieval), 'retrieval strategy', 'retrieval strategies')}"
        f" x {counted(len(kon.prompts), 'system prompt')} = {counted(answers, 'answer')} per target"
        f" x {counted(len(targets), 'target')}"
    )
    for base in bases:
        if base.sentences:
            work["facts"].add(helper, models[helper], base.sentences, base.fact_prompts, bounded=False, stage="facts")
            qa_prompts = [
                prompt(render_messages("kon_qa_generation.j2", fact=p.answer), QAPairOutput)
                for p in base.pairs[:SAMPLE_PROMPTS]
            ]
            n = base.sentences * FACTS_PER_SENTENCE
            work["qa"].add(helper, models[helper], n, qa_prompts, bounded=False, stage="qa", estimated=True)
        asked = base.questions + ookb
        sample = base.pairs[:SAMPLE_PROMPTS]
        if hyde:
            hyde_prompts = [
                prompt(render_messages("kon_hyde.j2", question=p.question, n=kon.hyde_answers), HydeOutput)
                for p in sample
            ]
            work["hyde"].add(
                helper,
                models[helper],
                asked,
                hyde_prompts,
                bounded=base.bounded or ookb > 0,
                stage="hyde",
                estimated=base.estimated,
            )
        if ookb:
            known = [p.question for p in sample]
            ookb_prompt = prompt(
                render_messages("kon_ookb_questions.j2", sample_questions=known, n=OOKB_PER_CALL), OOKBQuestionsOutput
            )
            work["ookb"].add(
                helper, models[helper], ookb_calls // len(bases), [ookb_prompt], bounded=False, stage="ookb"
            )
        answer_prompts = _answer_prompts(kon, base)
        eval_prompts = _eval_prompts(kon, base)
        rows = asked * grid
        for target in targets:
            work["answer"].add(
                target,
                models[target],
                rows,
                answer_prompts,
                bounded=base.bounded or ookb > 0,
                stage="answer",
                estimated=base.estimated,
            )
        for spec in run_specs(kon.evaluations):
            # A synthetic question has no expected answer: specs that read one skip its rows.
            judged = (base.questions if "expected_answer" in spec.input_fields else asked) * grid * len(targets)
            work["evaluate"].add(
                kon.evaluator,
                models[kon.evaluator],
                judged,
                eval_prompts[spec.name],
                bounded=True,
                stage="evaluate",
                estimated=base.estimated,
            )
    specs = run_specs(kon.evaluations)
    work["evaluate"].note = (
        f"at most {counted(len(specs), 'spec')} ({', '.join(s.name for s in specs)}) per answer: abstention "
        "judges every answer, the specs for answered questions only those that did not abstain"
    )
    sampled = min(kon.label_sample, answers * len(targets))
    for candidate in kon.evaluator_comparison:
        work["compare"].add(
            candidate,
            models[candidate],
            sampled * len(specs),
            [p for name in eval_prompts for p in eval_prompts[name]] if bases else [],
            bounded=True,
            stage="compare",
        )
    work["compare"].note = (
        f"at most {counted(sampled, 'labelled response')} x {counted(len(specs), 'spec')} per comparison evaluator"
        if kon.evaluator_comparison
        else "no evaluator_comparison"
    )
    return {name: stage for name, stage in work.items() if stage.calls or name in ("filter", "answer", "evaluate")}


def _embed_work(cfg: RunConfig, kon: KnowOrNotConfig, bases: list[_Base], work: StageWork, hyde: bool) -> None:
    """The embedding model's requests (``embedder: api``); nothing for a local embedder."""
    model = kon.embedding_model
    if kon.embedder != "api" or not model:
        work.note = f"embeddings by {kon.embedder} in this process: no model call"
        return
    texts = chars = requests = 0
    for base in bases:
        sample = base.pairs[:SAMPLE_PROMPTS] or [QAPair(id="none", question="", answer="")]
        question = sum(len(p.question) for p in sample) / len(sample)
        pair = sum(len(pair_text(p)) for p in sample) / len(sample)
        answer = sum(len(p.answer) for p in sample) / len(sample)  # a hypothetical answer's size
        hyde_texts = (base.questions + kon.synthetic_ookb) * kon.hyde_answers if hyde else 0
        base_texts = 2 * base.questions + hyde_texts + kon.synthetic_ookb
        texts += base_texts
        requests += -(-base_texts // EMBED_BATCH)
        chars += round(base.questions * (question + pair) + hyde_texts * answer + kon.synthetic_ookb * question)
    work.embeddings.add(model)
    work.add(
        model,
        cfg.models[model],
        requests,
        [(round(chars / max(requests, 1)), None, [], None)],
        bounded=True,
        stage="embed",
    )
    work.note = (
        f"{counted(texts, 'text')} (questions, pairs for the index, HyDE answers, synthetic questions) in "
        f"requests of up to {EMBED_BATCH} texts to {model}; input tokens only"
    )


def plan_knowornot(cfg: RunConfig, *, latency_s: float = 2.0, available: Collection[str] | None = None) -> Plan:
    """The plan of a KnowOrNot run of ``cfg`` (see the module doc); no model is called. ``available``
    (optional): the models that can run; targets outside it are left out, as ``skip_unavailable`` would."""
    kon = cfg.knowornot
    if kon is None:
        raise InputError(str(cfg.source), "the config has no knowornot section", field="knowornot")
    if latency_s <= 0:
        raise ValueError(f"latency_s must be positive, got {latency_s}")
    for field, values, what in (
        ("targets", kon.targets, "no targets"),
        ("retrieval", kon.retrieval, "no retrieval strategies"),
        ("prompts", kon.prompts, "no system prompts"),
    ):
        if not values:
            raise _fail(cfg, f"knowornot.{field}", what)
    bases = _bases(cfg, kon)
    targets = [t for t in kon.targets if available is None or t in available]
    warnings: list[str] = []
    if not targets:
        warnings.append(
            f"knowornot: every target is left out as unavailable ({', '.join(kon.targets)}): the run would stop "
            "here; set their credentials or plan with --all-models"
        )
    notes = [
        f"tokens estimated as characters / {CHARS_PER_TOKEN} of the rendered prompts (no tokenizer offline); "
        "pair-carrying prompts are rendered on the first pairs (from documents: the sentences stand in)",
        "time per model = max(calls x its seconds per call / max_concurrency, calls / rpm x 60); the models of "
        "a stage run in parallel, the stages one after another; retries and cached calls are not counted",
        "output tokens and cost_usd are ceilings: every call is counted at the model's max_tokens",
    ]
    if any(b.estimated for b in bases):
        notes.append(f"~ counts assume {FACTS_PER_SENTENCE} atomic facts per sentence, one QA pair per fact")
    if available is not None:
        skipped = sorted(set(kon.targets) - set(targets))
        if skipped:
            notes.append(f"left out as unavailable: {', '.join(skipped)}")
    return priced_plan(
        cfg,
        _work(cfg, kon, bases, targets),
        latency_s=latency_s,
        notes=notes,
        method="knowornot",
        warnings=warnings,
        uses=[*kon.targets, kon.evaluator, *(m for m in (kon.extractor, kon.embedding_model) if m)],
    )
