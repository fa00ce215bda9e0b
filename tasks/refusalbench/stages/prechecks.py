"""Deterministic pre-checks: rules that reject a parsed candidate before any verifier sees it.

A rule needs no model: it compares the candidate with its base item (and its lever) and
returns why the candidate is certainly unusable, or ``None``. Rules are registered by name
with ``@register_precheck("name")``; every registered rule runs on every parsed candidate.
A candidate that fails any rule keeps its row in ``candidates.parquet`` with the failures in
``precheck_failures`` (``"rule: detail"``) and costs no verifier call.

Only what is certain belongs here. Whether the lever was applied well, at the right
intensity, in the right part of the item, is the verifiers' call: a rule that had to guess
would reject good candidates without anyone seeing them. The built-in rules:

- ``unchanged``: question and context (or passages, with their relevance flags) equal the
  base item after whitespace normalisation: the perturbation changed nothing.
- ``required_fields``: blank question, blank context, a multi-document candidate with no
  passage or a blank one.
- ``passages_dropped``: fewer passages than the base item. The generator prompt asks for
  every passage back and no lever removes one (levers edit passages or append new ones).
- ``passages_duplicated``: more verbatim-repeated passages than the base item has; no lever
  asks for a copy of a passage.
- ``template_leftover``: a field that is the output shape's placeholder (``...``,
  ``<true|false>``) or holds template syntax (``{{``, ``{%``) the base item does not.
- ``prompt_markup``: the prompt's fence tags (``<question>``, ``<passage ...>``...) copied
  into the text, where the base item has none.
- ``refusal_code``: a refusal code (``REFUSE_...``, ``ANSWER_CORRECTLY``) written into the
  question or context, which the generator prompt forbids.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, Lever

PrecheckRule = Callable[[Candidate, BaseItem, Lever], str | None]
Rule = TypeVar("Rule", bound=PrecheckRule)

PRECHECKS: Registry[PrecheckRule] = Registry("pre-check")


def register_precheck(name: str, *, replace: bool = False) -> Callable[[Rule], Rule]:
    """Decorator: run ``rule(candidate, item, lever) -> reason | None`` on every parsed candidate."""
    if ":" in name:
        raise ValueError(f"pre-check name {name!r} may not contain ':' (it separates name and detail)")
    return PRECHECKS.register(name, replace=replace)


def precheck_names() -> list[str]:
    """The registered pre-checks, in the order they run."""
    return list(PRECHECKS)


def rule_name(failure: str) -> str:
    """The rule of one ``"rule: detail"`` entry of ``Candidate.precheck_failures``."""
    return failure.split(":", 1)[0]


def run_prechecks(candidate: Candidate, item: BaseItem, lever: Lever) -> list[str]:
    """Every failed rule as ``"rule: detail"`` (empty: the candidate goes on to the verifiers)."""
    failures = []
    for name, rule in PRECHECKS.items():
        reason = rule(candidate, item, lever)
        if reason:
            failures.append(f"{name}: {reason}")
    return failures


def apply_prechecks(
    candidates: list[Candidate], items: dict[str, BaseItem], levers: dict[str, Lever]
) -> list[Candidate]:
    """The candidates with ``precheck_failures`` filled in for the parsed ones (others unchanged)."""
    return [
        c.model_copy(update={"precheck_failures": run_prechecks(c, items[c.base_id], levers[c.lever_id])})
        if c.status == "ok"
        else c
        for c in candidates
    ]


def awaits_verification(candidate: Candidate) -> bool:
    """Parsed and not rejected by a pre-check (a candidate never pre-checked counts as passed)."""
    return candidate.status == "ok" and not candidate.precheck_failures


# ---------------------------------------------------------------- helpers


def normalise(text: str | None) -> str:
    """Whitespace runs collapsed to one space, ends stripped (None reads as empty)."""
    return " ".join((text or "").split())


def _texts(candidate: Candidate | BaseItem) -> list[str]:
    """Question, context and passage texts: everything a target model would read."""
    return [candidate.question or "", candidate.context or "", *(p.text for p in candidate.passages or [])]


# ---------------------------------------------------------------- the rules


@register_precheck("unchanged")
def unchanged(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    if normalise(candidate.question) != normalise(item.question):
        return None
    if candidate.variant == "multi":
        mine = [(normalise(p.text), p.relevant) for p in candidate.passages or []]
        base = [(normalise(p.text), p.relevant) for p in item.passages or []]
        return "question and passages equal the base item" if mine == base else None
    return (
        "question and context equal the base item" if normalise(candidate.context) == normalise(item.context) else None
    )


@register_precheck("required_fields")
def required_fields(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    blank = []
    if not normalise(candidate.question):
        blank.append("question")
    if candidate.variant == "multi":
        if not candidate.passages:
            blank.append("passages (none)")
        blank += [f"passage {i}" for i, p in enumerate(candidate.passages or [], start=1) if not normalise(p.text)]
    elif not normalise(candidate.context):
        blank.append("context")
    return f"blank {', '.join(blank)}" if blank else None


@register_precheck("passages_dropped")
def passages_dropped(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    if candidate.variant != "multi" or item.passages is None:
        return None
    got, wanted = len(candidate.passages or []), len(item.passages)
    return f"{got} of the base item's {wanted} passages returned" if got < wanted else None


def _repeats(texts: Iterable[str]) -> int:
    """How many texts are verbatim repeats of an earlier one (blank texts aside)."""
    counts = Counter(normalise(t) for t in texts if normalise(t))
    return sum(n - 1 for n in counts.values())


@register_precheck("passages_duplicated")
def passages_duplicated(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    if candidate.variant != "multi" or item.passages is None:
        return None
    extra = _repeats(p.text for p in candidate.passages or []) - _repeats(p.text for p in item.passages)
    return f"{extra} passage(s) repeat another passage verbatim" if extra > 0 else None


# The generator prompts' output shape shows these as values (generator_*.j2: "Shape (values are placeholders)").
_PLACEHOLDER_VALUES = {"...", "…", "<true|false>"}
_TEMPLATE_SYNTAX = re.compile(r"\{\{|\}\}|\{%|%\}")


@register_precheck("template_leftover")
def template_leftover(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    texts = _texts(candidate)
    placeholders = sorted({normalise(t) for t in texts if normalise(t) in _PLACEHOLDER_VALUES})
    if placeholders:
        return f"placeholder value {', '.join(repr(p) for p in placeholders)}"
    base_syntax = any(_TEMPLATE_SYNTAX.search(t) for t in _texts(item))
    leftover = next((m.group(0) for t in texts if (m := _TEMPLATE_SYNTAX.search(t))), None)
    return f"template syntax {leftover!r} in the text" if leftover and not base_syntax else None


# The tags the generator prompts fence their material with (prompting.fence).
_FENCE_TAG = re.compile(r"<\s*/?\s*(question|context|passage|reference_answer)\b", re.IGNORECASE)


@register_precheck("prompt_markup")
def prompt_markup(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    base_tags = {m.group(1).lower() for t in _texts(item) for m in _FENCE_TAG.finditer(t)}
    tags = sorted({m.group(1).lower() for t in _texts(candidate) for m in _FENCE_TAG.finditer(t)} - base_tags)
    return f"prompt tag(s) {', '.join(f'<{t}>' for t in tags)} copied into the text" if tags else None


_REFUSAL_CODE = re.compile(r"\b(?:REFUSE_[A-Z]+(?:_[A-Z]+)*|ANSWER_CORRECTLY)\b")


@register_precheck("refusal_code")
def refusal_code(candidate: Candidate, item: BaseItem, lever: Lever) -> str | None:
    base_codes = {m.group(0) for t in _texts(item) for m in _REFUSAL_CODE.finditer(t)}
    codes = sorted({m.group(0) for t in _texts(candidate) for m in _REFUSAL_CODE.finditer(t)} - base_codes)
    return f"refusal code(s) {', '.join(codes)} in the text" if codes else None
