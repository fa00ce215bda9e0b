"""``plan``'s prompts: each stage's real templates rendered on stand-in items, sized and checked against the window.

No model is called and no tokenizer fetched: a prompt's size is its characters plus the JSON schema
the model's provider profile sends with it, and whether it fits is the gateway's own check before a
call. The items a later stage will see do not exist before the run, so base items stand in for them.
"""

from __future__ import annotations

import json

from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.context_limits import overflow
from refusalbench.tasks.llm.gateway import json_schema
from refusalbench.tasks.llm.providers import SCHEMA_MODES, profile_for, structured_mode
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
from refusalbench.tasks.refusalbench.stages.judge import judge_messages, judge_schema
from refusalbench.tasks.refusalbench.stages.respond import target_messages
from refusalbench.tasks.refusalbench.stages.verify import verification_messages
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

# (characters of the messages, response schema, the messages)
Prompt = tuple[int, type[BaseModel] | None, list[dict[str, str]]]


def _message_chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def _prompt(messages: list[dict[str, str]], schema: type[BaseModel] | None) -> Prompt:
    return _message_chars(messages), schema, messages


def max_tokens(cfg: ModelConfig) -> int | None:
    """The output ceiling of one call of ``cfg`` (None: unbounded)."""
    return profile_for(cfg.model, cfg.api_base).max_output_tokens(cfg.params)


def exceeds_window(cfg: ModelConfig, messages: list[dict[str, str]], schema: type[BaseModel] | None) -> bool:
    """Whether the gateway would record this prompt too_long for ``cfg`` instead of sending it."""
    sent = json_schema(schema) if schema is not None and schema_chars(cfg, schema) else None
    return overflow(cfg, messages, max_tokens(cfg), sent) is not None


def schema_chars(cfg: ModelConfig, schema: type[BaseModel] | None) -> int:
    """The characters of ``schema`` that travel with a request of ``cfg``."""
    # In the json_schema and tool modes the whole schema travels with the request; in json_object
    # mode only {"type": "json_object"}, in none nothing (the model's provider profile decides).
    if schema is None or structured_mode(cfg, profile_for(cfg.model, cfg.api_base)) not in SCHEMA_MODES:
        return 0
    return len(json.dumps(json_schema(schema)))


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


def target_prompts_for(items: list[BenchmarkItem], confidence: bool = False) -> list[Prompt]:
    return [_prompt(target_messages(item, confidence), None) for item in items]


def judge_prompts_for(items: list[BenchmarkItem]) -> list[Prompt]:
    prompts: list[Prompt] = []
    for item in items:
        stand_in = Response(item_id=item.item_id, model="-", raw=item.answers[0] if item.answers else "")
        prompts.append(_prompt(judge_messages(item, stand_in), judge_schema(item)))
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
        prompts.append(_prompt(verification_messages(stand_in, item, lever), VerifierOutput))
    return prompts
