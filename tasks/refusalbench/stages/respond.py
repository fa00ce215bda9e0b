"""Stage: respond. Every target model answers (or refuses) every benchmark item.

The target sees only the perturbed question and context (or passages) and must answer
from them or reply with exactly one refusal code. Replies are parsed here into a decision
(ANSWER or a canonical code); a failed call is a ``Response`` with ``error`` set, so every
(item, model) pair has a row.

The main responses use the plain prompt of ``evaluation.protocol``: ``default`` (this project's,
with a line of help per code) or ``paper`` (``target_paper.j2``: the released benchmarks' shape,
the seven codes listed and only the code asked for on a refusal). With ``evaluation.confidence`` a
separate calibration pass (App. F.2) asks the same items again with the prompt that also
elicits a verbal confidence level (:func:`calibrate`): its own calls, its own files, the
only source of ECE, so the headline metrics never see the modified prompt.
"""

from __future__ import annotations

from collections.abc import Callable

from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.prompting import render_messages
from refusalbench.tasks.refusalbench.decisions import parse_confidence, parse_decision
from refusalbench.tasks.refusalbench.prompt_vocabulary import PAPER_TARGET_VOCABULARY, TARGET_VOCABULARY
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Response


def target_messages(item: BenchmarkItem, confidence: bool = False, protocol: str = "default") -> list[dict[str, str]]:
    """The target's prompt for ``item``; ``confidence``: the calibration pass's (asks for a CONFIDENCE line);
    ``protocol``: ``evaluation.protocol`` (the calibration pass keeps the default prompt, which elicits it)."""
    if protocol == "paper" and not confidence:
        return render_messages(
            "target_paper.j2",
            question=item.question,
            context=item.context,
            passages=item.passages,
            **PAPER_TARGET_VOCABULARY,
        )
    if item.variant == "multi":
        return render_messages(
            "target_multi.j2",
            question=item.question,
            passages=item.passages,
            confidence=confidence,
            **TARGET_VOCABULARY,
        )
    return render_messages(
        "target_single.j2", question=item.question, context=item.context, confidence=confidence, **TARGET_VOCABULARY
    )


def response_from_result(item: BenchmarkItem, model: str, result: CallResult, confidence: bool) -> Response:
    base = dict(
        item_id=item.item_id,
        model=model,
        raw=result.text,
        latency_s=result.latency_s,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cost_usd=result.cost_usd,
        cached=result.cached,
        **result.metadata(),
    )
    if not result.ok:
        # No usable response (failed, truncated, blocked, empty, too long): never parsed for a decision.
        return Response(error=result.error, outcome=result.outcome, **base)
    return Response(
        decision=parse_decision(result.text),
        outcome=result.outcome,
        confidence=parse_confidence(result.text) if confidence else None,
        **base,
    )


def respond(
    gateway: Gateway,
    items: list[BenchmarkItem],
    model: str,
    *,
    confidence: bool = False,
    on_result: Callable[[CallResult], None] | None = None,
    role: str = "targets",
    protocol: str = "default",
) -> list[Response]:
    """``model`` answers every item; ``role``: the calls' cache scope (the pre-test's are ``pretest``);
    ``protocol``: ``evaluation.protocol``, whose prompt the target sees.

    ``confidence``: the calibration pass's prompt and its parsed confidence (see :func:`calibrate`).
    """
    specs = [
        CallSpec(model=model, messages=target_messages(item, confidence, protocol), tag=item.item_id, role=role)
        for item in items
    ]
    results = gateway.complete_many(specs, on_result=on_result)
    return [response_from_result(item, model, result, confidence) for item, result in zip(items, results)]


def calibrate(
    gateway: Gateway, items: list[BenchmarkItem], model: str, *, on_result: Callable[[CallResult], None] | None = None
) -> list[Response]:
    """The calibration pass: ``model`` answers every item with the confidence-eliciting prompt.

    Its messages differ from the main pass's, so its calls have their own cache keys (role
    ``targets``); the responses carry the stated ``confidence`` and are judged like the main ones.
    """
    return respond(gateway, items, model, confidence=True, on_result=on_result)
