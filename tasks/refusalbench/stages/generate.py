"""Stage: generation. Each generator realises each assigned lever on its base item.

Pure functions build the calls and turn replies into ``Candidate`` rows; every attempt
becomes a row (ok / parse_error / call_error) with the raw text, so nothing is dropped.
A rule-based generator (``model: rules/...``, ``tasks.rule_generator``) makes no call: it
attempts the assignments its rules can realise honestly, and each becomes an ``ok`` row
built the same way.

Edit style (``generation.edit_style``, per generator template): the generator is asked for
find-and-replace edits instead of the whole rewritten item (``generator_*_edit.j2``);
``edits.rewrite_of`` applies them to the base item in code, and the candidate is built from the
result exactly as from a full rewrite. An edit that does not apply makes the attempt a
``parse_error`` row whose error starts with ``edits.EDIT_FAILURE`` and says why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from typing import Any

from pydantic import BaseModel

from refusalbench.tasks.llm.gateway import CallResult, CallSpec, Gateway
from refusalbench.tasks.llm.prompting import render_messages, template_hash
from refusalbench.tasks.llm.reply_outcomes import OK, PARSE_ERROR
from refusalbench.tasks.llm.structured_outputs import (
    GeneratorMultiEdit,
    GeneratorMultiOutput,
    GeneratorSingleEdit,
    GeneratorSingleOutput,
)
from refusalbench.tasks.refusalbench.prompt_vocabulary import answer_constraint_text
from refusalbench.tasks.refusalbench.rule_generator import NotApplicable, RuleOutput, apply_rule, ruleset_hash
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, Candidate, Lever, Passage
from refusalbench.tasks.refusalbench.stages.edits import EDIT_FAILURE, EditFailure, rewrite_of


def generator_template(variant: str, edit: bool = False) -> str:
    """The generator template for an item variant (single | multi), in edit style or as a full rewrite."""
    name = "generator_multi" if variant == "multi" else "generator_single"
    return f"{name}_edit.j2" if edit else f"{name}.j2"


def uses_edit_style(variant: str, edit_templates: Collection[str]) -> bool:
    """Whether ``variant``'s generator template is in ``edit_templates`` (``GenerationConfig.edit_templates``)."""
    return generator_template(variant).removesuffix(".j2") in edit_templates


def candidate_id(assignment_id: str, generator: str) -> str:
    return hashlib.sha256(f"{assignment_id}|{generator}".encode()).hexdigest()[:16]


def generation_messages(item: BaseItem, lever: Lever, edit: bool = False) -> list[dict[str, str]]:
    expected = lever.expected
    common = dict(
        lever=lever,
        question=item.question,
        answers=item.answers,
        expected=expected,
        answer_constraint=answer_constraint_text(expected),
    )
    if item.variant == "multi":
        return render_messages(
            generator_template("multi", edit),
            passages=item.passages,
            strategy=lever.multi_document,
            context=None,
            **common,
        )
    return render_messages(generator_template("single", edit), context=item.context, **common)


def edit_generation_messages(item: BaseItem, lever: Lever) -> list[dict[str, str]]:
    """The edit-style generator prompt: the same item and lever, the reply asked for as edits."""
    return generation_messages(item, lever, edit=True)


def generation_prompt(
    item: BaseItem, lever: Lever, edit_templates: Collection[str] = ()
) -> tuple[list[dict[str, str]], type[BaseModel]]:
    """The messages and output schema of one generator call (what ``plan`` prices too)."""
    multi = item.variant == "multi"
    if uses_edit_style(item.variant, edit_templates):
        return edit_generation_messages(item, lever), GeneratorMultiEdit if multi else GeneratorSingleEdit
    # The full rewrite: the same prompt and call (and call-cache key) as before edit style existed.
    return generation_messages(item, lever), GeneratorMultiOutput if multi else GeneratorSingleOutput


def generation_calls(
    assignments: list[Assignment],
    items: dict[str, BaseItem],
    levers: dict[str, Lever],
    generator: str,
    edit_templates: Collection[str] = (),
) -> list[CallSpec]:
    specs = []
    for assignment in assignments:
        messages, schema = generation_prompt(items[assignment.base_id], levers[assignment.lever_id], edit_templates)
        specs.append(
            CallSpec(model=generator, messages=messages, schema=schema, tag=assignment.assignment_id, role="generation")
        )
    return specs


def _passages_from(output: GeneratorMultiOutput) -> list[Passage]:
    ordered = sorted(output.passages, key=lambda edit: edit.index)
    return [Passage(text=edit.text, relevant=edit.relevant) for edit in ordered]


def _identity(assignment: Assignment, lever: Lever, generator: str) -> dict[str, Any]:
    """The fields every candidate of this assignment and generator carries, whatever made it."""
    return dict(
        candidate_id=candidate_id(assignment.assignment_id, generator),
        assignment_id=assignment.assignment_id,
        base_id=assignment.base_id,
        lever_id=assignment.lever_id,
        perturbation_class=assignment.perturbation_class,
        intensity=assignment.intensity,
        variant=assignment.variant,
        generator=generator,
        expected=lever.expected,
    )


def candidate_from_result(
    assignment: Assignment, lever: Lever, generator: str, result: CallResult, edited_item: BaseItem | None = None
) -> Candidate:
    """The candidate one generator reply makes; ``edited_item``: the base item an edit-style reply's
    edits apply to (None: the reply is a full rewrite)."""
    base: dict[str, Any] = dict(
        **_identity(assignment, lever, generator),
        raw=result.text,
        prompt_hash=template_hash(generator_template(assignment.variant, edit=edited_item is not None)),
        cached=result.cached,
        latency_s=result.latency_s,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cost_usd=result.cost_usd,
        **result.metadata(),
    )
    if result.error is not None and result.error_kind != PARSE_ERROR:
        # No usable reply (failed, truncated, blocked, empty): a call error; its outcome says which.
        return Candidate(status="call_error", error=result.error, outcome=result.outcome, **base)
    output = result.parsed
    if result.error_kind == "parse_error" or output is None:
        return Candidate(status="parse_error", outcome=PARSE_ERROR, error=result.error or "no output", **base)
    if isinstance(output, (GeneratorSingleEdit, GeneratorMultiEdit)):
        if edited_item is None:
            raise ValueError("an edit-style reply needs the base item its edits apply to (edited_item)")
        try:
            output = rewrite_of(edited_item, output)
        except EditFailure as failure:
            return Candidate(status="parse_error", outcome=PARSE_ERROR, error=f"{EDIT_FAILURE}: {failure}", **base)
    if not output.perturbed_question.strip():
        return Candidate(status="parse_error", outcome=PARSE_ERROR, error="empty perturbed_question", **base)
    if isinstance(output, GeneratorMultiOutput):
        passages = _passages_from(output)
        if not any(p.text.strip() for p in passages):
            return Candidate(status="parse_error", outcome=PARSE_ERROR, error="no passage text", **base)
        return Candidate(
            status="ok",
            outcome=OK,
            question=output.perturbed_question,
            passages=passages,
            rationale=output.rationale,
            answer_constraint_holds=output.answer_constraint_holds,
            **base,
        )
    if not output.perturbed_context.strip():
        return Candidate(status="parse_error", outcome=PARSE_ERROR, error="empty perturbed_context", **base)
    return Candidate(
        status="ok",
        outcome=OK,
        question=output.perturbed_question,
        context=output.perturbed_context,
        rationale=output.rationale,
        answer_constraint_holds=output.answer_constraint_holds,
        **base,
    )


def generate_candidates(
    gateway: Gateway,
    assignments: list[Assignment],
    items: dict[str, BaseItem],
    levers: dict[str, Lever],
    generator: str,
    on_result: Callable[[CallResult], None] | None = None,
    edit_templates: Collection[str] = (),
) -> list[Candidate]:
    """One candidate per assignment for this generator (failures included); the generator templates
    in ``edit_templates`` are asked for edits (``GenerationConfig.edit_templates``)."""
    calls = generation_calls(assignments, items, levers, generator, edit_templates)
    results = gateway.complete_many(calls, on_result=on_result)
    return [
        candidate_from_result(
            a,
            levers[a.lever_id],
            generator,
            r,
            items[a.base_id] if uses_edit_style(a.variant, edit_templates) else None,
        )
        for a, r in zip(assignments, results)
    ]


def candidate_from_rule(assignment: Assignment, lever: Lever, generator: str, output: RuleOutput) -> Candidate:
    """A rule's output as a parsed candidate; the prompt hash is the rule set's (what produced it)."""
    return Candidate(
        status="ok",
        question=output.question,
        context=output.context,
        passages=output.passages,
        rationale=output.rationale,
        answer_constraint_holds=True,
        prompt_hash=ruleset_hash(),
        latency_s=0.0,
        cost_usd=0.0,
        **_identity(assignment, lever, generator),
    )


def rule_candidates(
    assignments: list[Assignment], items: dict[str, BaseItem], levers: dict[str, Lever], generator: str
) -> list[Candidate]:
    """The rule-based generator's candidates: one per assignment its rules can realise, none for the rest
    (it does not attempt those; ``rule_generator.rule_skips`` counts why)."""
    out = []
    for assignment in assignments:
        lever = levers[assignment.lever_id]
        try:
            output = apply_rule(items[assignment.base_id], lever, assignment.assignment_id)
        except NotApplicable:
            continue
        out.append(candidate_from_rule(assignment, lever, generator, output))
    return out
