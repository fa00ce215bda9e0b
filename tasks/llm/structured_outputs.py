"""Structured outputs the prompt templates ask for, and tolerant parsing of model replies.

Each model below mirrors the JSON fields one template describes. They ignore extra keys and
coerce loose values (``"true"``, ``"4"``, ``"pass"``) because small local models drift from the
requested shape; a reply that still does not fit is reported as an error, never raised.

``json_schema_for`` gives the schema for constrained decoding (sent as the ``response_format``
that ``providers.response_format_for`` builds; llama.cpp's server honours it). ``parse_output`` extracts one JSON
object from a reply that may be wrapped in markdown fences or prose: the last one that fits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal, TypeVar, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class LLMOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ----------------------------------------------------------------- generation


class GeneratorSingleOutput(LLMOutput):
    perturbed_question: str
    perturbed_context: str
    lever_applied: str = ""
    rationale: str = ""
    answer_constraint_holds: bool
    expected_behaviour: str = ""


class PassageEdit(LLMOutput):
    # index counts from 1 in the order the passages were shown; an added passage takes the next number.
    index: int
    text: str
    relevant: bool


class GeneratorMultiOutput(LLMOutput):
    perturbed_question: str
    passages: list[PassageEdit] = Field(min_length=1, description="the full perturbed passage list, in order")
    lever_applied: str = ""
    rationale: str = ""
    answer_constraint_holds: bool
    expected_behaviour: str = ""


# Edit-style generation (``generation.edit_style``): the generator writes only what changes, as
# find-and-replace edits on the original text; ``refusalbench/edits.py`` applies them in code.


class TextEdit(LLMOutput):
    find: str = Field(description="a piece of the original text, copied exactly; it must occur there once")
    replace: str = Field(description="what takes its place ('' deletes it)")


class PassageTextEdit(LLMOutput):
    # Fields in this order: constrained decoding names the passage before copying from it.
    passage: int = Field(description="the passage's number as shown, from 1")
    find: str
    replace: str


class NewPassage(LLMOutput):
    text: str
    relevant: bool


class GeneratorSingleEdit(LLMOutput):
    question_edits: list[TextEdit]
    context_edits: list[TextEdit]
    lever_applied: str = ""
    rationale: str = ""
    answer_constraint_holds: bool
    expected_behaviour: str = ""


class GeneratorMultiEdit(LLMOutput):
    question_edits: list[TextEdit]
    passage_edits: list[PassageTextEdit]
    new_passages: list[NewPassage] = Field(description="passages to append after the last one ([] for none)")
    lever_applied: str = ""
    rationale: str = ""
    answer_constraint_holds: bool
    expected_behaviour: str = ""


# ----------------------------------------------------------------- verification

VERIFIER_CRITERIA: tuple[str, ...] = (
    "lever_fidelity",
    "intensity_achieved",
    "target_compliance",
    "uncertainty_induced",
    "implementation_quality",
    "answer_constraint",
    "predicted_behaviour",
    "refusal_class_alignment",
)


class VerifierOutput(LLMOutput):
    # Notes come first: constrained decoding writes fields in order, so the model states
    # its reasoning before committing to the booleans and the verdict.
    notes: str = ""
    lever_fidelity: bool
    intensity_achieved: bool
    target_compliance: bool
    uncertainty_induced: bool
    implementation_quality: bool
    answer_constraint: bool
    predicted_behaviour: bool
    refusal_class_alignment: bool
    strategy_compliance: bool | None = None
    verdict: Literal["PASS", "FAIL"]

    @field_validator("verdict", mode="before")
    @classmethod
    def _upper_verdict(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @property
    def all_criteria_met(self) -> bool:
        """Every criterion true (strategy_compliance counts only when given)."""
        flags = [getattr(self, name) for name in VERIFIER_CRITERIA]
        if self.strategy_compliance is not None:
            flags.append(self.strategy_compliance)
        return all(flags)


# ----------------------------------------------------------------- judging

# The judge's classification of a reply (paper App. D): an answer attempt, or a refusal with its
# category. The codes repeat ``refusalbench.taxonomy.REFUSAL_CODES`` because this layer may not import
# the method (tests/refusalbench/test_judge_decision.py keeps the two equal); the judge stage reads any code alias.
ANSWER_ATTEMPT = "ANSWER_ATTEMPT"
JUDGE_CLASSIFICATIONS: tuple[str, ...] = (
    ANSWER_ATTEMPT,
    "REFUSE_AMBIGUOUS_QUERY",
    "REFUSE_CONTRADICTORY_CONTEXT",
    "REFUSE_INFO_MISSING_IN_CONTEXT",
    "REFUSE_FALSE_PREMISE_IN_QUERY",
    "REFUSE_GRANULARITY_MISMATCH",
    "REFUSE_NONFACTUAL_QUERY",
    "REFUSE_OTHER",
)


class JudgeDecisionOutput(LLMOutput):
    """The judge's classification of a reply: answer attempt or refusal (with its category and reasons).

    ``classification`` is "" in a reply written before the judge classified (old cached or scripted
    replies): the judge stage then keeps the code parser's decision.
    """

    rationale: str = ""  # first, so the judge reasons before classifying
    classification: str = Field(default="", json_schema_extra={"enum": list(JUDGE_CLASSIFICATIONS)})
    refusal_reasons: str = ""

    @field_validator("classification", mode="before")
    @classmethod
    def _code_like(cls, value: Any) -> Any:
        # "answer attempt", "refuse_missing": the judge stage maps spellings to canonical codes.
        return re.sub(r"[\s-]+", "_", value.strip()).upper() if isinstance(value, str) else value


class JudgeSingleOutput(JudgeDecisionOutput):
    quality: int = Field(ge=1, le=5)


RAF_WITHOUT_ELIGIBILITY = "raf = 1 with eligibility = 0 is impossible (RAF requires eligibility)"


class JudgeMultiOutput(JudgeDecisionOutput):
    eligibility: int = Field(ge=0, le=1)
    factuality: int = Field(ge=0, le=1)
    raf: int = Field(ge=0, le=1)

    @field_validator("eligibility", "factuality", "raf", mode="before")
    @classmethod
    def _bool_to_int(cls, value: Any) -> Any:
        # Models often answer true/false for a 0/1 score.
        return int(value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _raf_needs_eligibility(self) -> JudgeMultiOutput:
        # RAF = 1 means eligible AND supported by the relevant passages (GaRAGe; paper App. D),
        # so RAF 1 with eligibility 0 is a self-contradicting verdict: not a usable reply.
        if self.raf == 1 and self.eligibility == 0:
            raise ValueError(RAF_WITHOUT_ELIGIBILITY)
        return self


class JudgePaperOutput(LLMOutput):
    """The judge's reply under ``evaluation.protocol: paper``: one call per reply returns its
    classification and a quality score (1-5, the grade of an answer; 1 for a refusal)."""

    classification: str = Field(json_schema_extra={"enum": list(JUDGE_CLASSIFICATIONS)})
    quality_score: int = Field(ge=1, le=5)

    @field_validator("classification", mode="before")
    @classmethod
    def _code_like(cls, value: Any) -> Any:
        return re.sub(r"[\s-]+", "_", value.strip()).upper() if isinstance(value, str) else value


class JudgePaperMultiOutput(JudgeMultiOutput):
    """The paper protocol's judge reply for a multi-document item: the classification and quality score,
    with the relevance-aware factuality (RAF) that grades an answer there."""

    quality_score: int = Field(ge=1, le=5)


# ----------------------------------------------------------------- KnowOrNot


class AtomicFacts(LLMOutput):
    facts: list[str]


class QAPairOutput(LLMOutput):
    question: str
    answer: str


class HydeOutput(LLMOutput):
    answers: list[str]


class OOKBQuestionsOutput(LLMOutput):
    questions: list[str]


# ----------------------------------------------------------------- schemas for constrained decoding

M = TypeVar("M", bound=BaseModel)


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = node["$ref"].rsplit("/", 1)[-1]
            return _inline_refs(defs[target], defs)
        return {key: _inline_refs(value, defs) for key, value in node.items() if key != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    return node


def _drop_titles(node: Any) -> Any:
    # "title" is noise for a decoder; only drop it where it is a schema keyword, not a property name.
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _drop_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _drop_titles(value)
        return out
    if isinstance(node, list):
        return [_drop_titles(item) for item in node]
    return node


def _accepts_null(property_schema: dict[str, Any]) -> bool:
    return any(option.get("type") == "null" for option in property_schema.get("anyOf", []))


def _require_non_nullable(node: Any) -> Any:
    # Parsing stays lenient (text fields default to ""), but constrained decoding should still
    # produce every field the prompt lists, so the schema requires all non-nullable properties.
    if isinstance(node, dict):
        out = {key: _require_non_nullable(value) for key, value in node.items()}
        properties = out.get("properties")
        if out.get("type") == "object" and isinstance(properties, dict):
            out["required"] = [name for name, sub in properties.items() if not _accepts_null(sub)]
        return out
    if isinstance(node, list):
        return [_require_non_nullable(item) for item in node]
    return node


def json_schema_for(model: type[BaseModel]) -> dict[str, Any]:
    """Self-contained JSON schema of ``model``: references inlined, titles dropped, every
    non-nullable field required."""
    schema = model.model_json_schema()
    inlined = _inline_refs(schema, schema.get("$defs", {}))
    required: dict[str, Any] = _require_non_nullable(_drop_titles(inlined))  # a schema object stays an object
    return required


# ----------------------------------------------------------------- tolerant parsing

_FENCED_BLOCK = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


_MAX_SPAN_STARTS = 64  # per end of the reply: bounds the quadratic scan on long replies full of brackets


def _span_starts(text: str, opener: str) -> list[int]:
    """Where ``opener`` occurs: the first and the last ``_MAX_SPAN_STARTS`` places (the answer
    usually sits at the end, after any prose or drafts)."""
    starts = [pos for pos, char in enumerate(text) if char == opener]
    if len(starts) <= 2 * _MAX_SPAN_STARTS:
        return starts
    return starts[:_MAX_SPAN_STARTS] + starts[-_MAX_SPAN_STARTS:]


def _balanced_spans(text: str, opener: str, closer: str) -> Iterator[tuple[int, int]]:
    """(begin, end) of balanced ``opener...closer`` spans, skipping brackets inside strings."""
    for begin in _span_starts(text, opener):
        depth = 0
        in_string = False
        escaped = False
        for pos in range(begin, len(text)):
            char = text[pos]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
                continue
            if char == '"':
                in_string = True
            elif char == opener:
                depth += 1
            elif char == closer:
                depth -= 1
                if depth == 0:
                    yield begin, pos + 1
                    break


def _loads_lenient(candidate: str) -> Any:
    try:
        return json.loads(candidate)
    except json.JSONDecodeError:
        # The most common slip of small models: a comma before a closing bracket.
        return json.loads(_TRAILING_COMMA.sub(r"\1", candidate))


def _candidate_texts(text: str) -> Iterator[str]:
    """The pieces of a reply that may be the JSON answer, the last one first.

    The whole reply, then fenced blocks and balanced spans by where they end, latest first (an
    enclosing object before the objects inside it): a model that drafts an object and corrects
    it, in prose or in reasoning left in the text, means the one it wrote last. Lazily: a reply
    that is bare JSON (most) is never scanned for spans.
    """
    yield text.strip()
    spans = [
        (match.end(), match.end() - match.start(), match.group(1).strip()) for match in _FENCED_BLOCK.finditer(text)
    ]
    for opener, closer in ("{}", "[]"):
        spans += [(end, end - begin, text[begin:end]) for begin, end in _balanced_spans(text, opener, closer)]
    spans.sort(key=lambda span: (span[0], span[1]), reverse=True)
    yield from (candidate for _, _, candidate in spans)


def _single_list_field(model_cls: type[BaseModel]) -> str | None:
    """Name of the only field when a model is just one list (facts, answers), else None."""
    fields = model_cls.model_fields
    if len(fields) != 1:
        return None
    ((name, field),) = fields.items()
    return name if get_origin(field.annotation) is list else None


def _short_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "(root)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def parse_output(model_cls: type[M], text: str | None) -> tuple[M | None, str | None]:
    """Parse one JSON object of ``model_cls`` out of a model reply (its final answer: the gateway
    has split any reasoning off).

    Accepts bare JSON, JSON in a markdown code fence, or JSON surrounded by prose; of several
    objects that fit, the last one written wins (a corrected draft). Returns
    ``(instance, None)`` on success and ``(None, error)`` otherwise; never raises on bad input.
    """
    if text is None or not text.strip():
        return None, "empty reply"
    list_field = _single_list_field(model_cls)
    first_schema_error: str | None = None
    decoded_any = False
    seen: set[str] = set()
    for candidate in _candidate_texts(text):
        if not candidate or candidate in seen:
            continue
        seen.add(candidate)
        try:
            data = _loads_lenient(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(data, list) and list_field is not None:
            data = {list_field: data}
        if not isinstance(data, dict):
            continue
        decoded_any = True
        try:
            return model_cls.model_validate(data), None
        except ValidationError as error:
            if first_schema_error is None:
                first_schema_error = _short_validation_error(error)
    if first_schema_error is not None:
        return None, f"schema mismatch: {first_schema_error}"
    if not decoded_any and ("{" in text):
        return None, "invalid JSON: no parseable JSON object in reply"
    return None, "no JSON object in reply"
