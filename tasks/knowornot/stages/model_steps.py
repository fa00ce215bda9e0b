"""KnowOrNot stages that call models, each a pure function over the gateway.

- facts: one extraction call per sentence (with its document as context) -> atomic facts
- qa: one question/answer pair per fact
- hyde: hypothetical answers per question (HyDE retrieval)
- answer: the target answers each experiment input under its system prompt and context
- judge: the evaluator applies evaluation specs (abstention for all; factuality, and any
  spec with ``applies_to: answered``, only for responses that did not abstain, as in the paper)
Every call's failure stays in its row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.knowornot.schema.records import (
    AtomicFact,
    EvalOutcome,
    ExperimentInput,
    ExperimentOutput,
    HypotheticalAnswers,
    OOKBQuestion,
    QAPair,
    Sentence,
    SourceDocument,
)
from refusalbench.tasks.knowornot.stages.evaluation import parse_eval_reply, render_eval_messages
from refusalbench.tasks.knowornot.stages.retrieval import format_context
from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.prompting import render_messages
from refusalbench.tasks.llm.structured_outputs import AtomicFacts, HydeOutput, OOKBQuestionsOutput, QAPairOutput

OnResult = Callable[[CallResult], None] | None


class Completer(Protocol):
    """What the stages a task sends whole need of the gateway (the pipeline may hand them one that admits
    each shard of calls against the run's budget first)."""

    def complete_many(self, specs: Iterable[CallSpec], on_result: OnResult = None) -> list[CallResult]: ...


def _short_hash(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def extract_facts(
    gateway: Completer,
    model: str,
    documents: Sequence[SourceDocument],
    sentences: Sequence[Sentence],
    on_result: OnResult = None,
) -> tuple[list[AtomicFact], list[dict[str, Any]]]:
    texts = {d.doc_id: d.text for d in documents}
    specs = [
        CallSpec(
            model=model,
            schema=AtomicFacts,
            tag=f"{s.doc_id}:{s.index}",
            messages=render_messages(
                "kon_fact_extraction.j2", sentence=s.text, sentence_index=s.index, document_context=texts[s.doc_id]
            ),
        )
        for s in sentences
    ]
    facts: list[AtomicFact] = []
    failures: list[dict[str, Any]] = []
    for sentence, result in zip(sentences, gateway.complete_many(specs, on_result=on_result)):
        if not result.ok:
            failures.append({"stage": "facts", "item": f"{sentence.doc_id}:{sentence.index}", "error": result.error})
            continue
        for text in result.parsed.facts:
            if text.strip():
                facts.append(
                    AtomicFact(
                        fact_id=_short_hash(sentence.doc_id, str(sentence.index), text),
                        doc_id=sentence.doc_id,
                        sentence_index=sentence.index,
                        text=text.strip(),
                    )
                )
    return facts, failures


def generate_qa(
    gateway: Completer, model: str, facts: Sequence[AtomicFact], on_result: OnResult = None
) -> tuple[list[QAPair], list[dict[str, Any]]]:
    specs = [
        CallSpec(
            model=model,
            schema=QAPairOutput,
            tag=f.fact_id,
            messages=render_messages("kon_qa_generation.j2", fact=f.text),
        )
        for f in facts
    ]
    pairs: list[QAPair] = []
    failures: list[dict[str, Any]] = []
    for fact, result in zip(facts, gateway.complete_many(specs, on_result=on_result)):
        if not result.ok or not result.parsed.question.strip() or not result.parsed.answer.strip():
            failures.append({"stage": "qa", "item": fact.fact_id, "error": result.error or "blank question or answer"})
            continue
        pairs.append(
            QAPair(
                id=f"qa-{fact.fact_id}",
                question=result.parsed.question.strip(),
                answer=result.parsed.answer.strip(),
                source=fact.fact_id,
                doc_id=fact.doc_id,
                sentence_index=fact.sentence_index,
            )
        )
    return pairs, failures


def hyde_answers(
    gateway: Completer, model: str, pairs: Sequence[QAPair], n: int, on_result: OnResult = None
) -> tuple[list[HypotheticalAnswers], list[dict[str, Any]]]:
    specs = [
        CallSpec(
            model=model, schema=HydeOutput, tag=p.id, messages=render_messages("kon_hyde.j2", question=p.question, n=n)
        )
        for p in pairs
    ]
    out: list[HypotheticalAnswers] = []
    failures: list[dict[str, Any]] = []
    for pair, result in zip(pairs, gateway.complete_many(specs, on_result=on_result)):
        answers = [a for a in (result.parsed.answers if result.ok else []) if a.strip()]
        if not answers:
            # HyDE falls back to the question itself: the row still gets a context, and the failure is recorded.
            failures.append({"stage": "hyde", "item": pair.id, "error": result.error or "no hypothetical answer"})
            answers = [pair.question]
        out.append(HypotheticalAnswers(question_id=pair.id, model=model, answers=answers))
    return out, failures


def synthetic_ookb_questions(
    gateway: Completer,
    model: str,
    pairs: Sequence[QAPair],
    n: int,
    *,
    seed: int = 0,
    sample_size: int = 8,
    per_call: int = 5,
    on_result: OnResult = None,
) -> tuple[list[OOKBQuestion], list[dict[str, Any]]]:
    """``n`` questions on the knowledge base's subject that it likely cannot answer.

    Each call sees a different seeded sample of known questions, so the batches differ.
    Questions that repeat a known question (or each other) are dropped.
    """
    import random

    rng = random.Random(seed)
    known = [p.question for p in pairs]
    calls = []
    for batch in range(max(1, -(-n // per_call))):
        sample = rng.sample(known, min(sample_size, len(known)))
        calls.append(
            CallSpec(
                model=model,
                schema=OOKBQuestionsOutput,
                tag=f"ookb-{batch}",
                messages=render_messages("kon_ookb_questions.j2", sample_questions=sample, n=per_call),
            )
        )
    seen = {q.strip().lower() for q in known}
    out: list[OOKBQuestion] = []
    failures: list[dict[str, Any]] = []
    for spec, result in zip(calls, gateway.complete_many(calls, on_result=on_result)):
        if not result.ok:
            failures.append({"stage": "ookb", "item": spec.tag, "error": result.error})
            continue
        for text in result.parsed.questions:
            key = text.strip().lower()
            if key and key not in seen and len(out) < n:
                seen.add(key)
                out.append(OOKBQuestion(id=f"ookb-{_short_hash(text)}", question=text.strip(), source=model))
    return out, failures


def answer_messages(row: ExperimentInput, pairs: dict[str, QAPair]) -> list[dict[str, str]]:
    context = format_context([pairs[i] for i in row.context_ids]) if row.context_ids else ""
    return render_messages(f"kon_system_{row.prompt}.j2", context_block=context, question=row.question)


def answer_experiments(
    gateway: Gateway, rows: Sequence[ExperimentInput], pairs: dict[str, QAPair], on_result: OnResult = None
) -> list[ExperimentOutput]:
    specs = [CallSpec(model=row.target, messages=answer_messages(row, pairs), tag=row.experiment_id) for row in rows]
    outputs = []
    for row, result in zip(rows, gateway.complete_many(specs, on_result=on_result)):
        outputs.append(
            ExperimentOutput(
                experiment_id=row.experiment_id,
                question_id=row.question_id,
                target=row.target,
                retrieval=row.retrieval,
                prompt=row.prompt,
                ookb=row.ookb,
                response=result.text,
                error=result.error if not result.ok else None,
                cached=result.cached,
                latency_s=result.latency_s,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                cost_usd=result.cost_usd,
                **result.metadata(),
            )
        )
    return outputs


def _context_text(row: ExperimentInput, pairs: dict[str, QAPair] | None) -> str | None:
    """The context the target saw, as it saw it; a placeholder when it saw none (direct)."""
    if pairs is None:
        return None
    return format_context([pairs[i] for i in row.context_ids]) if row.context_ids else "(no context)"


def evaluate_outputs(
    gateway: Gateway,
    evaluator: str,
    specs: Sequence[EvalSpec],
    rows: Sequence[ExperimentInput],
    outputs: Sequence[ExperimentOutput],
    on_result: OnResult = None,
    pairs: dict[str, QAPair] | None = None,
    judge_only: Mapping[str, Collection[str]] | None = None,
) -> list[EvalOutcome]:
    """Apply each spec in order; a spec that ``applies_to`` answered responses (factuality) only
    where ``abstention``, applied before it, said "no". ``pairs`` lets a spec read the context.

    ``judge_only`` (spec name -> experiment ids): each spec judges exactly those responses, whatever
    this evaluator's own abstention verdict (an evaluator comparison scores every candidate on the
    same label sample)."""
    by_id = {row.experiment_id: row for row in rows}
    outcomes: list[EvalOutcome] = []
    abstained: dict[str, str | None] = {}
    for spec in specs:
        calls, owners = [], []
        for output in outputs:
            row = by_id[output.experiment_id]
            if judge_only is not None and output.experiment_id not in judge_only.get(spec.name, ()):
                continue
            if output.error is not None:
                outcomes.append(
                    EvalOutcome(
                        experiment_id=output.experiment_id,
                        spec=spec.name,
                        evaluator=evaluator,
                        error=f"no response: {output.error}",
                    )
                )
                continue
            if judge_only is None and spec.applies_to == "answered" and abstained.get(output.experiment_id) != "no":
                continue  # e.g. factuality is only defined for answers that were given
            fields = {
                "question": row.question,
                "response": output.response,
                "expected_answer": row.expected_answer,
                "context": _context_text(row, pairs) if "context" in spec.input_fields else None,
            }
            messages = render_eval_messages(spec, fields)
            if messages is None:
                continue  # e.g. synthetic out-of-KB questions have no expected answer to compare with
            calls.append(CallSpec(model=evaluator, messages=messages, tag=f"{spec.name}|{output.experiment_id}"))
            owners.append(output)
        for output, result in zip(owners, gateway.complete_many(calls, on_result=on_result)):
            if not result.ok:
                outcomes.append(
                    EvalOutcome(
                        experiment_id=output.experiment_id,
                        spec=spec.name,
                        evaluator=evaluator,
                        error=result.error,
                        raw=result.text,
                        cached=result.cached,
                        **result.metadata(),
                    )
                )
                continue
            outcome, problem = parse_eval_reply(spec, result.text)
            if spec.name == "abstention":
                abstained[output.experiment_id] = outcome
            outcomes.append(
                EvalOutcome(
                    experiment_id=output.experiment_id,
                    spec=spec.name,
                    evaluator=evaluator,
                    outcome=outcome,
                    error=problem,
                    raw=result.text,
                    cached=result.cached,
                    **result.metadata(),
                )
            )
    return outcomes
