"""A model-free generator: levers realised by deterministic text rules.

Some levers can be applied mechanically and honestly. Missing information: delete the
sentences that state the answer, or put a pointer to absent material where the answer
was. Contradiction: restate the answer-bearing sentence with a conflicting figure or unit
and name a source for each version. A handful of LOW levers (drop an example sentence,
excise a parenthesis, trim a date to its year) are mechanical too. Every rule checks what
makes it honest on the item at hand (the answer is written verbatim in the context, the
answer is a number, a second signal passage exists ...) and otherwise raises
``NotApplicable`` with the reason: the rule generator then does not attempt the assignment.
Levers without a rule (most false-premise, ambiguity, granularity and epistemic levers
need judgement) are never attempted either.

A config names the generator like a model (``model: rules/v1``); ``tasks.generate`` turns
its outputs into ``Candidate`` rows that are verified and filtered like any other. It makes
no call, and the output depends only on the base item, the lever and the assignment id
(the key of every choice it makes), so a run is reproducible byte for byte. A rule is one
function registered with ``@register_rule(lever_id, ...)``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from refusalbench.tasks.refusalbench.rule_generator import contradiction, missing_info  # noqa: F401  (importing them registers their rules)
from refusalbench.tasks.refusalbench.rule_generator.base import RULES, NotApplicable, Rule, RuleOutput, register_rule
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, Lever


def apply_rule(item: BaseItem, lever: Lever, key: str) -> RuleOutput:
    """The lever realised on the item by its rule; NotApplicable when there is none or it does not fit."""
    rule = RULES.get(lever.id)
    if rule is None:
        raise NotApplicable("no rule for this lever")
    return rule(item, key)


def rule_skips(assignments: Sequence[Assignment], items: dict[str, BaseItem], levers: dict[str, Lever]) -> Counter[str]:
    """Why the rule generator leaves assignments out: reason -> count (for the manifest)."""
    reasons: Counter[str] = Counter()
    for assignment in assignments:
        try:
            apply_rule(items[assignment.base_id], levers[assignment.lever_id], assignment.assignment_id)
        except NotApplicable as exc:
            reasons[str(exc)] += 1
    return reasons


@cache
def ruleset_hash() -> str:
    """First 12 hex digits of the SHA-256 of the rules' source (every module of this package):
    a rule candidate's prompt hash, and part of the generate tasks' cache key."""
    digest = hashlib.sha256()
    for module_file in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(module_file.name.encode() + module_file.read_bytes())
    return digest.hexdigest()[:12]


__all__ = ["RULES", "NotApplicable", "Rule", "RuleOutput", "apply_rule", "register_rule", "rule_skips", "ruleset_hash"]
