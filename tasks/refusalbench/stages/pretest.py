"""Stage: pre-test. Keep only the base items every pre-test model answers correctly unperturbed.

The paper's base-set filter (App. C.1): an item enters the benchmark only if all the evaluated
frontier models answer it correctly as it is, so that a failure on one of its perturbations comes
from the perturbation, not from the item. Each pre-test model answers every base item once with
the target template (no confidence asked), and the pre-test judge scores the answer with the
evaluation's judge template, so a pre-test answer is judged exactly like an evaluation answer
(the functions of ``tasks.respond`` and ``tasks.judge``): single-document quality >= 4,
multi-document RAF = 1. A refusal is not correct and needs no judge call; a failed answer or
judge call is recorded in the row's ``error`` and the item is not kept. Each row keeps its
``outcome`` (ok, or why there was no usable answer or judgment) and what its two calls billed.

"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from refusalbench.tasks.llm.gateway import CallResult, Gateway
from refusalbench.tasks.refusalbench.schema.records import BaseItem, BenchmarkItem, Judgment, PretestRow, Response
from refusalbench.tasks.refusalbench.stages.judge import judge_responses, needs_judge
from refusalbench.tasks.refusalbench.stages.respond import respond
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

UNPERTURBED = "-"  # class, lever and generator of an item shown as it is


def unperturbed_item(item: BaseItem) -> BenchmarkItem:
    """A base item as an answerable benchmark item: the question and context as they are."""
    return BenchmarkItem(
        item_id=item.id,
        base_id=item.id,
        variant=item.variant,
        perturbation_class=UNPERTURBED,
        intensity="LOW",
        lever_id=UNPERTURBED,
        generator=UNPERTURBED,
        question=item.question,
        context=item.context,
        passages=item.passages,
        original_question=item.question,
        original_context=item.context,
        original_passages=item.passages,
        answers=item.answers,
        expected=ANSWER_CORRECTLY,
        domain=item.domain,
    )


def row_from_judgment(item: BenchmarkItem, judgment: Judgment, response: Response) -> PretestRow:
    score = judgment.raf if item.variant == "multi" else judgment.quality
    return PretestRow(
        item_id=item.item_id,
        model=judgment.model,
        variant=item.variant,
        answer=response.raw,
        decision=judgment.decision,
        score=score,
        correct=judgment.error is None and judgment.answer_correct is True,
        judge=judgment.judge,
        error=judgment.error,
        cached=response.cached,
        outcome=judgment.outcome or response.outcome,
        cost_usd=response.cost_usd,
        judge_cost_usd=judgment.judge_cost_usd,
    )


ProgressFactory = Callable[[str, int], Callable[[CallResult], None]]  # (title, total) -> per-call callback


def pretest_answers(
    gateway: Gateway, items: list[BaseItem], model: str, judge: str, *, progress: ProgressFactory | None = None
) -> list[PretestRow]:
    """``model`` answers every item unperturbed and ``judge`` scores each answer: one row per item."""
    shown = [unperturbed_item(item) for item in items]
    responses = respond(
        gateway,
        shown,
        model,
        confidence=False,
        role="pretest",
        on_result=progress(f"{model} pre-test", len(shown)) if progress else None,
    )
    by_id = {item.item_id: item for item in shown}
    to_judge = sum(needs_judge(by_id[r.item_id], r) for r in responses)
    judgments = judge_responses(
        gateway,
        by_id,
        responses,
        judge,
        role="pretest",
        on_result=progress(f"judge {model} pre-test", to_judge) if progress else None,
    )
    return [
        row_from_judgment(item, judgment, response) for item, response, judgment in zip(shown, responses, judgments)
    ]


def kept_items(item_ids: Iterable[str], rows: Iterable[PretestRow], models: list[str]) -> set[str]:
    """The items that every one of ``models`` answered correctly (a missing row is not correct)."""
    correct = {(row.item_id, row.model) for row in rows if row.correct}
    return {item_id for item_id in item_ids if all((item_id, model) in correct for model in models)}


def mark_kept(rows: list[PretestRow], kept: set[str]) -> list[PretestRow]:
    return [row.model_copy(update={"kept": row.item_id in kept}) for row in rows]


def summary_by_model(rows: list[PretestRow], models: list[str]) -> dict[str, dict[str, int]]:
    """Per pre-test model: items answered correctly, wrongly (a refusal counts as wrong), and failed."""
    out = {model: {"correct": 0, "wrong": 0, "failed": 0} for model in models}
    for row in rows:
        counts = out.setdefault(row.model, {"correct": 0, "wrong": 0, "failed": 0})
        counts["correct" if row.correct else "failed" if row.error else "wrong"] += 1
    return out


def summary_rows(summary: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """The per-model summary as table rows (Prefect artifact, report)."""
    rows = []
    for model, counts in summary.items():
        total = sum(counts.values())
        rows.append({"model": model, **counts, "correct_rate": round(counts["correct"] / total, 4) if total else None})
    return rows


__all__ = [
    "kept_items",
    "mark_kept",
    "pretest_answers",
    "row_from_judgment",
    "summary_by_model",
    "summary_rows",
    "unperturbed_item",
]
