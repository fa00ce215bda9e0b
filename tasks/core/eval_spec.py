"""What an evaluation asks of an evaluator model or a human labeller: ``EvalSpec``.

Both methods label with it (KnowOrNot's abstention and factuality, RefusalBench's audit),
and a run config may declare its own (``knowornot.evaluations``), so it lives in the kernel.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from refusalbench.tasks.core.tables import Record

_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


EVAL_INPUT_FIELDS = ("question", "response", "expected_answer", "context")


class EvalSpec(Record):
    """A user-definable evaluation: what the evaluator reads, and which tagged verdicts it may give.

    ``prompt`` is the instruction text; ``prompt_template`` (optional) names a Jinja2 template
    under prompts/ that replaces it. ``input_fields`` are the experiment fields shown to the
    evaluator; a row lacking any of them (e.g. no expected answer) is not evaluated.
    ``applies_to`` says which responses are judged: every one, or only those the abstention
    spec judged as answered (the paper's factuality is defined on those alone).
    """

    name: str
    tag: str
    outcomes: list[str] = Field(
        validation_alias=AliasChoices("outcomes", "values"),
        description="the verdicts allowed inside the tag (config key: outcomes or values)",
    )
    prompt: str
    prompt_template: str | None = None
    input_fields: list[str] = Field(
        default_factory=lambda: ["question", "response"],
        description=f"shown to the evaluator, from: {', '.join(EVAL_INPUT_FIELDS)}",
    )
    applies_to: Literal["all", "answered"] = Field(
        default="all", description="'all' responses, or only those the abstention spec judged answered"
    )
    positive: str | None = Field(
        default=None,
        description="the outcome counted as positive when an evaluator is compared with the human "
        "consensus (true/false positives, precision, recall, F1); default: the first outcome",
    )

    @field_validator("name", "prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("tag")
    @classmethod
    def _tag_is_a_name(cls, value: str) -> str:
        if not _TAG_NAME.fullmatch(value):
            raise ValueError(f"tag {value!r} must be a simple name (letters, digits, _ or -)")
        return value

    @field_validator("outcomes")
    @classmethod
    def _outcomes_distinct(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one outcome")
        seen: set[str] = set()
        for outcome in value:
            key = outcome.strip().lower()
            if not key:
                raise ValueError("outcomes must not be blank")
            if key in seen:
                raise ValueError(f"outcome {outcome!r} is listed twice (outcomes are case-insensitive)")
            seen.add(key)
        return value

    @model_validator(mode="after")
    def _positive_is_an_outcome(self) -> EvalSpec:
        if self.positive is not None and self.positive not in self.outcomes:
            raise ValueError(f"positive {self.positive!r} is not one of the outcomes {self.outcomes}")
        return self

    @property
    def positive_outcome(self) -> str:
        """The outcome an evaluator comparison counts as positive (the paper: abstained; factuality tier_3)."""
        return self.positive or self.outcomes[0]

    @field_validator("input_fields")
    @classmethod
    def _fields_present(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one input field")
        unknown = [f for f in value if f not in EVAL_INPUT_FIELDS]
        if unknown:
            raise ValueError(
                f"unknown input field(s) {', '.join(map(repr, unknown))} (known: {', '.join(EVAL_INPUT_FIELDS)})"
            )
        return value
