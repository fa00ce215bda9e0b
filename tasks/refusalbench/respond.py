"""Stage: respond. Every target model answers (or refuses) every benchmark item.

The target sees only the perturbed question and context (or passages) and must answer
from them or reply with exactly one refusal code; optionally it states a verbal
confidence level. Replies are parsed here into a decision (ANSWER or a canonical code);
a failed call is a ``Response`` with ``error`` set, so every (item, model) pair has a row.
"""

from __future__ import annotations

from typing import Callable

from refusalbench.tasks.refusalbench.decisions import parse_confidence, parse_decision
from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.prompting import render_messages
from refusalbench.tasks.refusalbench.prompt_vocabulary import TARGET_VOCABULARY
from refusalbench.tasks.refusalbench.records import BenchmarkItem, Response


def target_messages(item: BenchmarkItem, confidence: bool) -> list[dict[str, str]]:
    if item.variant == "multi":
        return render_messages("target_multi.j2", question=item.question, passages=item.passages, confidence=confidence,
                               **TARGET_VOCABULARY)
    return render_messages("target_single.j2", question=item.question, context=item.context, confidence=confidence,
                           **TARGET_VOCABULARY)


def response_from_result(item: BenchmarkItem, model: str, result: CallResult, confidence: bool) -> Response:
    base = dict(item_id=item.item_id, model=model, raw=result.text, latency_s=result.latency_s,
                prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                cost_usd=result.cost_usd, cached=result.cached, **result.metadata())
    if not result.ok:
        # No usable response (failed, truncated, blocked, empty, too long): never parsed for a decision.
        return Response(error=result.error, outcome=result.outcome, **base)
    return Response(decision=parse_decision(result.text), outcome=result.outcome,
                    confidence=parse_confidence(result.text) if confidence else None, **base)


def respond(gateway: Gateway, items: list[BenchmarkItem], model: str, *, confidence: bool = False,
            on_result: Callable[[CallResult], None] | None = None, role: str = "targets") -> list[Response]:
    """``model`` answers every item; ``role``: the calls' cache scope (the pre-test's are ``pretest``)."""
    specs = [CallSpec(model=model, messages=target_messages(item, confidence), tag=item.item_id, role=role)
             for item in items]
    results = gateway.complete_many(specs, on_result=on_result)
    return [response_from_result(item, model, result, confidence) for item, result in zip(items, results)]
