"""Stage: cross-verification. Every verifier checks every parsed candidate that passed the pre-checks.

A verifier's reply becomes one ``Verification`` row per (candidate, verifier) with the
per-criterion booleans and an overall verdict; a failed or unparsable reply is an
``ERROR`` row, never a missing one. In short-circuit mode a candidate that already
failed is not sent to later verifiers; those pairs are recorded as ``SKIPPED``.

A verdict must agree with its reasons. The rubric (``verifier_*.j2``) says PASS only if
every criterion is true, so a stated PASS with a required criterion false counts as FAIL,
and a stated FAIL with every criterion true stays FAIL (the verifier may have seen a
defect the rubric does not name); both are recorded as inconsistent. The row keeps the
stated verdict beside the effective one, so nothing the verifier said is lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.prompting import RenderedPrompt, render_prompt
from refusalbench.tasks.llm.reply_outcomes import OK, PARSE_ERROR
from refusalbench.tasks.llm.structured_outputs import VERIFIER_CRITERIA, VerifierOutput
from refusalbench.tasks.refusalbench.prompt_vocabulary import VERIFIER_VOCABULARY
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, Lever, Verification
from refusalbench.tasks.refusalbench.stages.change_summary import change_summary
from refusalbench.tasks.refusalbench.stages.prechecks import awaits_verification


def verifier_template(variant: str) -> str:
    """The verifier template for an item variant (single | multi)."""
    return "verifier_multi.j2" if variant == "multi" else "verifier_single.j2"


def verification_messages(candidate: Candidate, item: BaseItem, lever: Lever) -> list[dict[str, str]]:
    return verification_prompt(candidate, item, lever).messages


def verification_prompt(candidate: Candidate, item: BaseItem, lever: Lever) -> RenderedPrompt:
    """The verifier's messages about ``candidate``, and where the part every candidate of its (item, lever)
    shares ends (the instructions, the lever and the original item: before the perturbed version)."""
    common = dict(
        lever=lever,
        expected=candidate.expected,
        question=item.question,
        answers=item.answers,
        perturbed_question=candidate.question,
        changes=change_summary(item, candidate),
        **VERIFIER_VOCABULARY,
    )
    if candidate.variant == "multi":
        return render_prompt(
            "verifier_multi.j2", passages=item.passages, perturbed_passages=candidate.passages, context=None, **common
        )
    return render_prompt("verifier_single.j2", context=item.context, perturbed_context=candidate.context, **common)


def verification_calls(
    candidates: list[Candidate], items: dict[str, BaseItem], levers: dict[str, Lever], verifier: str
) -> list[CallSpec]:
    # The candidates of one (item, lever), one per generator, share their prompt's prefix.
    sharing = Counter((c.base_id, c.lever_id) for c in candidates)
    specs = []
    for c in candidates:
        prompt = verification_prompt(c, items[c.base_id], levers[c.lever_id])
        specs.append(
            CallSpec(
                model=verifier,
                messages=prompt.messages,
                schema=VerifierOutput,
                tag=c.candidate_id,
                role="generation",
                shared_chars=prompt.shared_chars,
                shared_by=sharing[(c.base_id, c.lever_id)],
            )
        )
    return specs


def required_criteria(variant: str) -> tuple[str, ...]:
    """The criteria a PASS needs: all the rubric lists (multi-document adds strategy compliance)."""
    return (*VERIFIER_CRITERIA, "strategy_compliance") if variant == "multi" else VERIFIER_CRITERIA


def effective_verdict(stated: str, flags: dict[str, bool | None], required: tuple[str, ...]) -> tuple[str, bool]:
    """(the verdict that counts, whether the stated one agrees with the criteria).

    A required criterion left out (``None``) does not support a PASS either.
    """
    criteria_met = all(flags.get(name) is True for name in required)
    if stated == "PASS":
        return ("PASS", True) if criteria_met else ("FAIL", False)
    return "FAIL", not criteria_met


def verification_from_result(candidate: Candidate, verifier: str, result: CallResult) -> Verification:
    base = dict(
        candidate_id=candidate.candidate_id,
        generator=candidate.generator,
        verifier=verifier,
        raw=result.text,
        **result.billing(),
        **result.metadata(),
    )
    output = result.parsed
    if not result.ok or output is None:
        return Verification(
            verdict="ERROR",
            error=result.error or "no output",
            outcome=result.outcome if not result.ok else PARSE_ERROR,
            **base,
        )
    required = required_criteria(candidate.variant)
    flags = {name: getattr(output, name) for name in required}
    verdict, consistent = effective_verdict(output.verdict, flags, required)
    return Verification(
        verdict=verdict, stated_verdict=output.verdict, consistent=consistent, outcome=OK, **flags, **base
    )


def skipped(candidate: Candidate, verifier: str) -> Verification:
    return Verification(
        candidate_id=candidate.candidate_id,
        generator=candidate.generator,
        verifier=verifier,
        verdict="SKIPPED",
        error="short-circuit: an earlier verifier failed it",
    )


def verify_candidates(
    gateway: Gateway,
    candidates: list[Candidate],
    items: dict[str, BaseItem],
    levers: dict[str, Lever],
    verifier: str,
    on_result: Callable[[CallResult], None] | None = None,
) -> list[Verification]:
    pending = [c for c in candidates if awaits_verification(c)]
    results = gateway.complete_many(verification_calls(pending, items, levers, verifier), on_result=on_result)
    return [verification_from_result(c, verifier, r) for c, r in zip(pending, results)]
