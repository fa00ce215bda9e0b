"""The rule generator's building blocks: the registry, a rule's output, and the item's text as
passages (a single-context item is one signal passage), which every rule edits."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.refusalbench.rule_generator.text import answer_pattern
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage


class NotApplicable(Exception):
    """The rule cannot realise its lever honestly on this item; the message says why."""


@dataclass(frozen=True)
class RuleOutput:
    """What a rule made of an item: the perturbed question, context or passages, and what it did."""

    question: str
    context: str | None
    passages: list[Passage] | None
    rationale: str


Rule = Callable[[BaseItem, str], RuleOutput]  # (base item, key for deterministic choices)

RULES: Registry[Rule] = Registry("rule for lever")


def register_rule(*lever_ids: str, replace: bool = False) -> Callable[[Rule], Rule]:
    """Register a rule for the catalogue levers it realises (keyed by lever id; one rule per lever)."""

    def add(rule: Rule) -> Rule:
        for lever_id in lever_ids:
            RULES.add(lever_id, rule, replace=replace)
        return rule

    return add


def item_texts(item: BaseItem) -> list[Passage]:
    """The item's text as passages: a single-context item is one signal passage."""
    if item.passages is not None:
        return [p.model_copy() for p in item.passages]
    return [Passage(text=item.context or "", relevant=True)]


def rule_output(item: BaseItem, passages: list[Passage], rationale: str) -> RuleOutput:
    """Rules change the context only: the question stays as it is."""
    if item.passages is None:
        return RuleOutput(question=item.question, context=passages[0].text, passages=None, rationale=rationale)
    return RuleOutput(question=item.question, context=None, passages=passages, rationale=rationale)


def answers_pattern(answers: Sequence[str]) -> re.Pattern[str]:
    pattern = answer_pattern(answers)
    if pattern is None:
        raise NotApplicable("the item has no reference answer")
    return pattern


def answer_in_context(item: BaseItem) -> re.Pattern[str]:
    """The answer pattern, provided the context states the answer and the question does not."""
    pattern = answers_pattern(item.answers)
    if pattern.search(item.question):
        raise NotApplicable("the question itself states the answer")
    if not any(pattern.search(p.text) for p in item_texts(item)):
        raise NotApplicable("the answer is not written verbatim in the context")
    return pattern
