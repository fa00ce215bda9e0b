"""``plan``'s prompts: each stage's real templates rendered on stand-in items, sized and checked against the window.

No model is called and no tokenizer fetched: a prompt's size is its characters plus the JSON schema
the model's provider profile sends with it, and whether it fits is the gateway's own check before a
call (both in ``llm/plan_pricing.py``). The items a later stage will see do not exist before the run, so base items stand in for them.
"""

from __future__ import annotations

from refusalbench.tasks.llm.plan_pricing import Prompt
from refusalbench.tasks.llm.plan_pricing import prompt as _prompt
from refusalbench.tasks.llm.structured_outputs import GeneratorMultiOutput, GeneratorSingleOutput, VerifierOutput
from refusalbench.tasks.refusalbench.schema.records import (
    Assignment,
    BaseItem,
    BenchmarkItem,
    Candidate,
    Lever,
    Response,
)
from refusalbench.tasks.refusalbench.stages.generate import generation_messages
from refusalbench.tasks.refusalbench.stages.judge import Protocol, judge_prompt, judge_schema
from refusalbench.tasks.refusalbench.stages.respond import target_messages
from refusalbench.tasks.refusalbench.stages.verify import verification_prompt
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY


def stand_in_item(item: BaseItem) -> BenchmarkItem:
    """A base item dressed as an answerable benchmark item, for rendering target and judge prompts."""
    return BenchmarkItem(
        item_id=item.id,
        base_id=item.id,
        variant=item.variant,
        perturbation_class="-",
        intensity="LOW",
        lever_id="-",
        generator="-",
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


def target_prompts_for(items: list[BenchmarkItem], confidence: bool = False, protocol: str = "default") -> list[Prompt]:
    return [_prompt(target_messages(item, confidence, protocol), None) for item in items]


def judge_prompts_for(items: list[BenchmarkItem], protocol: Protocol = "default") -> list[Prompt]:
    prompts: list[Prompt] = []
    for item in items:
        stand_in = Response(item_id=item.item_id, model="-", raw=item.answers[0] if item.answers else "")
        rendered = judge_prompt(item, stand_in, protocol)
        prompts.append(_prompt(rendered.messages, judge_schema(item, protocol), rendered.shared_chars))
    return prompts


def generation_prompts_for(
    assignments: list[Assignment], items: dict[str, BaseItem], levers: dict[str, Lever]
) -> list[Prompt]:
    return [
        _prompt(
            generation_messages(items[a.base_id], levers[a.lever_id]),
            GeneratorMultiOutput if a.variant == "multi" else GeneratorSingleOutput,
        )
        for a in assignments
    ]


def verification_prompts_for(
    assignments: list[Assignment], items: dict[str, BaseItem], levers: dict[str, Lever]
) -> list[Prompt]:
    prompts: list[Prompt] = []
    for a in assignments:
        item, lever = items[a.base_id], levers[a.lever_id]
        # The candidate's perturbed text is not known yet: the original stands in for it.
        stand_in = Candidate(
            candidate_id="-",
            assignment_id=a.assignment_id,
            base_id=a.base_id,
            lever_id=a.lever_id,
            perturbation_class=a.perturbation_class,
            intensity=a.intensity,
            variant=a.variant,
            generator="-",
            status="ok",
            question=item.question,
            context=item.context,
            passages=item.passages,
            expected=lever.expected,
            prompt_hash="-",
        )
        rendered = verification_prompt(stand_in, item, lever)
        prompts.append(_prompt(rendered.messages, VerifierOutput, rendered.shared_chars))
    return prompts
