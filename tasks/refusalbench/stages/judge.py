"""Stage: judge. Decide what each response is and whether it is correct (seed paper §4.1, App. D).

The decision (``evaluation.decision``):
- ``judge`` (default, the paper's protocol): the judge model classifies each reply as an answer
  attempt or a refusal with its category (and the reasons the reply gives). One call per reply:
  for an answerable item the same call grades the answer (single-document quality 1-5, correct =
  4 or 5; multi-document eligibility, factuality and RAF, correct = RAF 1); for an unanswerable
  item it only classifies (``judge_decision.j2``), since any answer there is a missed refusal.
  A reply that is nothing but one refusal code (``decisions.bare_code``: markup and a final
  CONFIDENCE line allowed) is unambiguous and skips the call: the code parser decides it
  (``decision_source: parser``). A judge reply without a classification (written before the
  judge classified) also keeps the parser's decision, so old replies read as they did.
- ``codes`` (judge-free decision): the code parser's decision (``Response.decision``) stands; the
  judge is asked only to grade answers to answerable items.

The protocol (``evaluation.protocol``): ``default`` is the above; ``paper`` is the released
benchmarks' authors' protocol: every reply goes to the judge (a bare code too), one call with
``judge_paper.j2`` that returns the classification and a quality score (and RAF for a
multi-document item); an answer is correct at quality 4 or 5 (multi-document: RAF 1), a refusal
when its code is the expected one exactly. Scoring is the same rule under both protocols.

Either way each judgment keeps the parser's decision (``parser_decision``), so the parser's
agreement with the judge can be reported (``decision_agreement``). A refusal is correct when its
code equals the expected code; an answer to an unanswerable item is a missed refusal; a refusal of
an answerable item a false refusal. A multi-document reply with RAF 1 but eligibility 0 is
impossible and counts as a failed judgment.
A response whose call failed, or whose judging failed, keeps its error in the row and
is left out of the metrics (counted separately), rather than silently scored as wrong.
Each judgment says its ``outcome``: ``ok`` (scored), the response's when it had no usable
reply (truncated, provider_blocked, empty, too_long, call_error), or ``judge_error``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import BaseModel

from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.prompting import RenderedPrompt, render_prompt
from refusalbench.tasks.llm.reply_outcomes import CALL_ERROR, JUDGE_ERROR, OK
from refusalbench.tasks.llm.structured_outputs import (
    RAF_WITHOUT_ELIGIBILITY,
    JudgeDecisionOutput,
    JudgeMultiOutput,
    JudgePaperMultiOutput,
    JudgePaperOutput,
    JudgeSingleOutput,
)
from refusalbench.tasks.refusalbench.decisions import ANSWER, bare_code, normalise_decision
from refusalbench.tasks.refusalbench.prompt_vocabulary import JUDGE_VOCABULARY, PAPER_JUDGE_VOCABULARY
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.stages.respond import response_from_result
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

CORRECT_QUALITY = 4
DecisionMode = Literal["judge", "codes"]
Protocol = Literal["default", "paper"]


def needs_judge(
    item: BenchmarkItem, response: Response, decision: DecisionMode = "judge", protocol: Protocol = "default"
) -> bool:
    """Whether the judge model is asked about this response (see the module docstring)."""
    if response.error is not None:
        return False
    if protocol == "paper":
        return True
    if decision == "codes":
        return response.decision == ANSWER and item.expected == ANSWER_CORRECTLY
    return bare_code(response.raw) is None


def judge_schema(item: BenchmarkItem, protocol: Protocol = "default") -> type[BaseModel]:
    """What the judge returns for a response to ``item``: classification, plus the grade when answerable."""
    if protocol == "paper":
        return JudgePaperMultiOutput if item.variant == "multi" else JudgePaperOutput
    if item.expected != ANSWER_CORRECTLY:
        return JudgeDecisionOutput
    return JudgeMultiOutput if item.variant == "multi" else JudgeSingleOutput


def judge_messages(item: BenchmarkItem, response: Response, protocol: Protocol = "default") -> list[dict[str, str]]:
    return judge_prompt(item, response, protocol).messages


def judge_prompt(item: BenchmarkItem, response: Response, protocol: Protocol = "default") -> RenderedPrompt:
    """The judge's messages about ``response``, and where the part every reply to ``item`` shares ends
    (the instructions, the item's context, question and references: before the reply)."""
    if protocol == "paper":
        return render_prompt(
            "judge_paper.j2",
            question=item.question,
            context=item.context,
            passages=item.passages,
            answers=item.answers,
            response=response.raw or "",
            **PAPER_JUDGE_VOCABULARY,
        )
    if item.expected != ANSWER_CORRECTLY:
        return render_prompt(
            "judge_decision.j2", question=item.question, response=response.raw or "", **JUDGE_VOCABULARY
        )
    if item.variant == "multi":
        return render_prompt(
            "judge_multi.j2",
            question=item.question,
            passages=item.passages,
            answers=item.answers,
            response=response.raw or "",
            **JUDGE_VOCABULARY,
        )
    return render_prompt(
        "judge_single.j2",
        question=item.question,
        context=item.context,
        answers=item.answers,
        response=response.raw or "",
        **JUDGE_VOCABULARY,
    )


def _base(item: BenchmarkItem, response: Response) -> dict[str, Any]:
    return dict(
        item_id=item.item_id,
        model=response.model,
        expected=item.expected,
        parser_decision=response.decision,
        confidence=response.confidence,
        perturbation_class=item.perturbation_class,
        intensity=item.intensity,
        lever_id=item.lever_id,
        domain=item.domain,
        generator=item.generator,
    )


def _scored(item: BenchmarkItem, decision: str | None, answer_correct: bool | None, **fields: Any) -> Judgment:
    """A scored judgment of ``decision``; ``answer_correct``: the grade of an answer to an answerable item."""
    refused = decision != ANSWER
    if item.expected == ANSWER_CORRECTLY:
        # Answerable item: refused = a false refusal; answered = the judge's grade.
        return Judgment(
            decision=decision,
            answer_correct=False if refused else answer_correct,
            refusal_correct=None,
            outcome=OK,
            **fields,
        )
    # Unanswerable item: right code = correct refusal; an answer = missed refusal.
    return Judgment(
        decision=decision,
        refusal_correct=refused and decision == item.expected,
        answer_correct=False if not refused else None,
        outcome=OK,
        **fields,
    )


def judgment_without_model(item: BenchmarkItem, response: Response) -> Judgment:
    base = _base(item, response)
    if response.error is not None:
        # The row keeps why there is no usable response (truncated, blocked, ...); rows written
        # before outcomes were recorded say only that the call failed.
        outcome = response.outcome if response.outcome not in (None, OK) else CALL_ERROR
        return Judgment(decision=response.decision, error=f"response failed: {response.error}", outcome=outcome, **base)
    return _scored(item, response.decision, None, decision_source="parser", **base)


def _grade(output: BaseModel) -> dict[str, Any]:
    """The judge's grade of an answer and whether it counts as correct."""
    if isinstance(output, JudgeMultiOutput):
        quality = dict(quality=output.quality_score) if isinstance(output, JudgePaperMultiOutput) else {}
        return dict(
            eligibility=output.eligibility,
            factuality=output.factuality,
            raf=output.raf,
            answer_correct=output.raf == 1,
            **quality,
        )
    if isinstance(output, JudgePaperOutput):
        return dict(quality=output.quality_score, answer_correct=output.quality_score >= CORRECT_QUALITY)
    if isinstance(output, JudgeSingleOutput):
        return dict(quality=output.quality, answer_correct=output.quality >= CORRECT_QUALITY)
    return dict(answer_correct=None)


def judgment_from_result(
    item: BenchmarkItem, response: Response, judge: str, result: CallResult, decision: DecisionMode = "judge"
) -> Judgment:
    base = {
        **_base(item, response),
        **result.metadata("judge_"),
        **result.billing("judge_"),
        "judge": judge,
        "judge_raw": result.text,
    }
    output = result.parsed
    if not result.ok or output is None:
        return Judgment(decision=response.decision, error=f"judge failed: {result.error}", outcome=JUDGE_ERROR, **base)
    if isinstance(output, JudgeMultiOutput) and output.raf == 1 and output.eligibility == 0:
        # The schema refuses this reply; a parsed object built around it (a cache, a test) must not pass either.
        return Judgment(
            decision=response.decision, error=f"judge failed: {RAF_WITHOUT_ELIGIBILITY}", outcome=JUDGE_ERROR, **base
        )
    classification = getattr(output, "classification", "")
    if decision == "codes" or not classification:
        decided, source = response.decision, "parser"
    else:
        decided, source = normalise_decision(classification), "judge"
        if decided is None:
            return Judgment(
                decision=response.decision,
                outcome=JUDGE_ERROR,
                error=f"judge failed: unknown classification {classification!r}",
                **base,
            )
    reasons = getattr(output, "refusal_reasons", "") or None
    grade = _grade(output) if decided == ANSWER else {"answer_correct": None}
    answer_correct = grade.pop("answer_correct")
    return _scored(
        item,
        decided,
        answer_correct,
        decision_source=source,
        refusal_reasons=reasons if decided != ANSWER else None,
        **grade,
        **base,
    )


def judge_responses(
    gateway: Gateway,
    items: dict[str, BenchmarkItem],
    responses: list[Response],
    judge: str,
    on_result: Callable[[CallResult], None] | None = None,
    role: str = "judge",
    decision: DecisionMode = "judge",
    protocol: Protocol = "default",
    shared_by: int = 1,
) -> list[Judgment]:
    """The judgment of every response (one judge call for each that needs one); ``role``: the calls'
    cache scope; ``decision``: who decides answer vs refusal (``evaluation.decision``); ``protocol``:
    ``evaluation.protocol``; ``shared_by``: how many judge calls of the run share an item's prompt
    prefix (one per target), at least as many as these responses to one item."""
    to_judge = [r for r in responses if needs_judge(items[r.item_id], r, decision, protocol)]
    per_item = Counter(r.item_id for r in to_judge)
    specs = [
        judge_call(items[r.item_id], r, judge, role, protocol=protocol, shared_by=max(shared_by, per_item[r.item_id]))
        for r in to_judge
    ]
    results = dict(zip((id(r) for r in to_judge), gateway.complete_many(specs, on_result=on_result)))
    out = []
    for response in responses:
        item = items[response.item_id]
        if id(response) in results:
            out.append(judgment_from_result(item, response, judge, results[id(response)], decision))
        else:
            out.append(judgment_without_model(item, response))
    return out


def judge_call(
    item: BenchmarkItem,
    response: Response,
    judge: str,
    role: str = "judge",
    stage: str | None = None,
    protocol: Protocol = "default",
    shared_by: int = 1,
) -> CallSpec:
    """The judge's call about ``response``: one spec for the judge stage and for the call started ahead of it;
    ``shared_by``: how many judge calls share the item's prompt prefix (``prompt_cache``)."""
    prompt = judge_prompt(item, response, protocol)
    return CallSpec(
        model=judge,
        messages=prompt.messages,
        schema=judge_schema(item, protocol),
        tag=f"{response.model}|{response.item_id}",
        role=role,
        stage=stage,
        shared_chars=prompt.shared_chars,
        shared_by=shared_by,
    )


def judging_ahead(
    gateway: Gateway,
    items: dict[str, BenchmarkItem],
    target: str,
    judge: str,
    decision: DecisionMode = "judge",
    protocol: Protocol = "default",
    shared_by: int = 1,
) -> Callable[[CallResult], None]:
    """A respond batch's ``on_result``: for each reply of ``target`` the judge will be asked about, the
    judge's call is started at once (``Gateway.start_ahead``), for the judge task that asks for it after
    the shard (see ``tasks/llm/calls_ahead.py``)."""

    def reply_in(result: CallResult) -> None:
        assert result.tag is not None, "a respond call is tagged with its item's id"
        item = items[result.tag]
        response = response_from_result(item, target, result, confidence=False)
        if needs_judge(item, response, decision, protocol):
            call = judge_call(item, response, judge, stage="judge", protocol=protocol, shared_by=shared_by)
            gateway.start_ahead([call])

    return reply_in


def parser_agreement(judgments: Iterable[Judgment]) -> dict[str, dict[str, Any]]:
    """Per model, how the code parser's decisions compare with the judge's, on the rows the judge decided.

    ``judge_decided``: scored rows the judge classified; ``agreement``: the share of them where the
    parser's decision (ANSWER or the code) is the judge's (None when there are none);
    ``prose_refusals_missed``: the judge saw a refusal, the parser an answer (no code in the reply);
    ``quoted_codes_as_refusals``: the judge saw an answer, the parser a refusal (a code quoted in it);
    ``other_code``: both saw a refusal, with different codes; ``parser_decided``: scored rows the parser
    decided alone (a reply that is only a code, a judge reply without classification, ``decision: codes``).
    """
    out: dict[str, dict[str, Any]] = {}
    for j in judgments:
        row = out.setdefault(
            j.model,
            {
                "judge_decided": 0,
                "agreement": None,
                "prose_refusals_missed": 0,
                "quoted_codes_as_refusals": 0,
                "other_code": 0,
                "parser_decided": 0,
            },
        )
        if j.error is not None:
            continue
        if j.decision_source != "judge":
            row["parser_decided"] += 1
            continue
        row["judge_decided"] += 1
        judge_answered, parser_answered = j.decision == ANSWER, j.parser_decision == ANSWER
        row["prose_refusals_missed"] += not judge_answered and parser_answered
        row["quoted_codes_as_refusals"] += judge_answered and not parser_answered
        row["other_code"] += not judge_answered and not parser_answered and j.decision != j.parser_decision
    for row in out.values():
        disagree = row["prose_refusals_missed"] + row["quoted_codes_as_refusals"] + row["other_code"]
        if row["judge_decided"]:
            row["agreement"] = round(1 - disagree / row["judge_decided"], 4)
    return out
