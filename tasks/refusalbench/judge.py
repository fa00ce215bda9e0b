"""Stage: judge. Decide whether each response is correct (seed paper §4.1, App. D).

- A refusal is correct when its code equals the expected code: no model call.
- An answer to an unanswerable item is a missed refusal: wrong, no model call.
- An answer to an answerable item goes to the judge model: single-document quality
  1-5 against the reference answers (correct = 4 or 5); multi-document eligibility,
  factuality and RAF (correct = RAF 1); a reply with RAF 1 but eligibility 0 is
  impossible and counts as a failed judgment.
A response whose call failed, or whose judging failed, keeps its error in the row and
is left out of the metrics (counted separately), rather than silently scored as wrong.
Each judgment says its ``outcome``: ``ok`` (scored), the response's when it had no usable
reply (truncated, provider_blocked, empty, too_long, call_error), or ``judge_error``.
"""

from __future__ import annotations

from typing import Callable

from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.reply_outcomes import CALL_ERROR, JUDGE_ERROR, OK
from refusalbench.tasks.llm.prompting import render_messages
from refusalbench.tasks.refusalbench.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.llm.structured_outputs import RAF_WITHOUT_ELIGIBILITY, JudgeMultiOutput, JudgeSingleOutput
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

CORRECT_QUALITY = 4


def needs_judge(item: BenchmarkItem, response: Response) -> bool:
    return response.error is None and response.decision == "ANSWER" and item.expected == ANSWER_CORRECTLY


def judge_messages(item: BenchmarkItem, response: Response) -> list[dict[str, str]]:
    if item.variant == "multi":
        return render_messages("judge_multi.j2", question=item.question, passages=item.passages,
                               answers=item.answers, response=response.raw or "")
    return render_messages("judge_single.j2", question=item.question, context=item.context,
                           answers=item.answers, response=response.raw or "")


def _base(item: BenchmarkItem, response: Response) -> dict:
    return dict(item_id=item.item_id, model=response.model, expected=item.expected, decision=response.decision,
                confidence=response.confidence, perturbation_class=item.perturbation_class, intensity=item.intensity,
                lever_id=item.lever_id, domain=item.domain, generator=item.generator)


def judgment_without_model(item: BenchmarkItem, response: Response) -> Judgment:
    base = _base(item, response)
    if response.error is not None:
        # The row keeps why there is no usable response (truncated, blocked, ...); rows written
        # before outcomes were recorded say only that the call failed.
        outcome = response.outcome if response.outcome not in (None, OK) else CALL_ERROR
        return Judgment(error=f"response failed: {response.error}", outcome=outcome, **base)
    refused = response.decision != "ANSWER"
    if item.expected == ANSWER_CORRECTLY:
        # Answerable item refused: a false refusal.
        return Judgment(answer_correct=False, refusal_correct=None, outcome=OK, **base)
    # Unanswerable item: right code = correct refusal; an answer = missed refusal.
    return Judgment(refusal_correct=refused and response.decision == item.expected,
                    answer_correct=False if not refused else None, outcome=OK, **base)


def judgment_from_result(item: BenchmarkItem, response: Response, judge: str, result: CallResult) -> Judgment:
    base = {**_base(item, response), **result.metadata("judge_")}
    output = result.parsed
    if not result.ok or output is None:
        return Judgment(judge=judge, judge_raw=result.text, error=f"judge failed: {result.error}", outcome=JUDGE_ERROR,
                        **base)
    if isinstance(output, JudgeMultiOutput):
        if output.raf == 1 and output.eligibility == 0:
            # The schema refuses this reply; a parsed object built around it (a cache, a test) must not pass either.
            return Judgment(judge=judge, judge_raw=result.text, error=f"judge failed: {RAF_WITHOUT_ELIGIBILITY}",
                            outcome=JUDGE_ERROR, **base)
        return Judgment(judge=judge, judge_raw=result.text, eligibility=output.eligibility, factuality=output.factuality,
                        raf=output.raf, answer_correct=output.raf == 1, outcome=OK, **base)
    return Judgment(judge=judge, judge_raw=result.text, quality=output.quality,
                    answer_correct=output.quality >= CORRECT_QUALITY, outcome=OK, **base)


def judge_responses(gateway: Gateway, items: dict[str, BenchmarkItem], responses: list[Response], judge: str,
                    on_result: Callable[[CallResult], None] | None = None, role: str = "judge") -> list[Judgment]:
    """The judge's decision on every response that needs one; ``role``: the calls' cache scope."""
    to_judge = [r for r in responses if needs_judge(items[r.item_id], r)]
    specs = [
        CallSpec(model=judge, messages=judge_messages(items[r.item_id], r),
                 schema=JudgeMultiOutput if items[r.item_id].variant == "multi" else JudgeSingleOutput,
                 tag=f"{r.model}|{r.item_id}", role=role)
        for r in to_judge
    ]
    results = dict(zip((id(r) for r in to_judge), gateway.complete_many(specs, on_result=on_result)))
    out = []
    for response in responses:
        item = items[response.item_id]
        if id(response) in results:
            out.append(judgment_from_result(item, response, judge, results[id(response)]))
        else:
            out.append(judgment_without_model(item, response))
    return out
