"""Records of RefusalBench: the lever catalogue, base sets, generation and evaluation rows.

Every RefusalBench table is a list of one of these; they share ``tasks.core.tables.Record``,
which maps them to Parquet. The rows keeping a model's reply inherit its metadata from
``tasks.llm.call_fields``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr

from refusalbench.tasks.core.tables import Record
from refusalbench.tasks.llm.call_fields import REPLY_METADATA, CallFields, TimedCallFields
from refusalbench.tasks.refusalbench.taxonomy import Intensity, LeverTarget, PerturbationClass, expected_behaviour

# ----------------------------------------------------------------- catalogue


class LeverExample(Record):
    question: str
    context: str
    expected: str = Field(description="ANSWER_CORRECTLY or the class's refusal code")
    answer: str | None = Field(default=None, description="the answer that stays derivable (LOW only)")


class Lever(Record):
    id: str
    name: str
    perturbation_class: PerturbationClass
    intensity: Intensity
    target: LeverTarget
    target_exception: str | None = Field(
        default=None,
        description="why the target departs from the class's rule (paper App. I.3); None when it follows it",
    )
    instruction: str
    example: LeverExample
    multi_document: str = Field(description="how the lever applies across signal and noise passages")
    # (file, index in the file's 'levers' list, 1-based line of each key), set by the catalogue
    # loader so problems can name FILE:LINE. Private: not data, so dumps and the hash ignore it.
    _source: tuple[str, int, dict[str, int]] | None = PrivateAttr(default=None)

    @property
    def source(self) -> tuple[str, int, dict[str, int]] | None:
        """Where the loader read this lever (see ``_source``); None for levers built in code."""
        return self._source

    @property
    def expected(self) -> str:
        return expected_behaviour(self.perturbation_class, self.intensity)


# ----------------------------------------------------------------- base sets


class Passage(Record):
    text: str
    relevant: bool


class BaseItem(Record):
    id: str
    question: str
    answers: list[str]
    context: str | None = None
    passages: list[Passage] | None = None
    domain: str | None = None

    @property
    def variant(self) -> Literal["single", "multi"]:
        return "multi" if self.passages is not None else "single"


class PretestRow(Record):
    """One pre-test model's unperturbed answer to one base item, as the judge scored it."""

    item_id: str
    model: str
    variant: Literal["single", "multi"]
    answer: str | None = Field(default=None, description="the model's raw reply")
    decision: str | None = Field(default=None, description="ANSWER or a canonical refusal code")
    score: int | None = Field(default=None, description="the judge's quality 1-5 (single) or RAF 0/1 (multi)")
    correct: bool = Field(description="quality >= 4 (single) or RAF = 1 (multi); False on any refusal or error")
    kept: bool = Field(default=False, description="every pre-test model answered this item correctly")
    judge: str | None = None
    error: str | None = Field(default=None, description="why the answer or its judging failed")
    cached: bool = False
    outcome: str | None = Field(
        default=None,
        description="what the row came to (tasks/llm/reply_outcomes.py): ok, the answer's outcome when it was "
        "no usable reply (truncated, provider_blocked, too_long, call_error, ...), or judge_error",
    )
    cost_usd: float | None = Field(default=None, description="what the answer's call billed; None: unpriced")
    judge_cost_usd: float | None = Field(
        default=None, description="what the judge's call billed; None: unpriced, or the judge did not see the row"
    )


# ----------------------------------------------------------------- generation


class Assignment(Record):
    """One (base item, lever) pair a generator is asked to realise."""

    assignment_id: str
    base_id: str
    lever_id: str
    perturbation_class: str
    intensity: str
    variant: Literal["single", "multi"]


class Candidate(Record, TimedCallFields):
    """One generator's attempt at an assignment; the call's metadata, billing and latency come last."""

    candidate_id: str
    assignment_id: str
    base_id: str
    lever_id: str
    perturbation_class: str
    intensity: str
    variant: Literal["single", "multi"]
    generator: str
    status: Literal["ok", "parse_error", "call_error"]
    error: str | None = None
    outcome: str | None = Field(
        default=None,
        description="what the call came to (tasks/llm/reply_outcomes.py): ok, truncated, "
        "provider_blocked, empty, too_long, call_error, parse_error",
    )
    raw: str | None = None
    question: str | None = None
    context: str | None = None
    passages: list[Passage] | None = None
    rationale: str | None = None
    answer_constraint_holds: bool | None = None
    precheck_failures: list[str] | None = Field(
        default=None,
        description="failed pre-checks as 'rule: detail' ([] passed; None: not pre-checked, e.g. not parsed)",
    )
    expected: str
    prompt_hash: str


class Verification(Record, CallFields):
    """One verifier's verdict on a candidate; the call's metadata and billing (CallResult.billing) come last."""

    candidate_id: str
    generator: str
    verifier: str
    verdict: Literal["PASS", "FAIL", "ERROR", "SKIPPED"] = Field(
        description="the verdict that counts: a PASS the verifier's own criteria contradict counts as FAIL"
    )
    stated_verdict: Literal["PASS", "FAIL"] | None = Field(
        default=None, description="the verdict as the verifier stated it"
    )
    consistent: bool | None = Field(
        default=None, description="whether the stated verdict agrees with the criteria (None: no verdict)"
    )
    lever_fidelity: bool | None = None
    intensity_achieved: bool | None = None
    target_compliance: bool | None = None
    uncertainty_induced: bool | None = None
    implementation_quality: bool | None = None
    answer_constraint: bool | None = None
    predicted_behaviour: bool | None = None
    refusal_class_alignment: bool | None = None
    strategy_compliance: bool | None = None
    error: str | None = None
    outcome: str | None = Field(
        default=None,
        description="what the call came to (tasks/llm/reply_outcomes.py): ok, truncated, "
        "provider_blocked, empty, too_long, call_error, parse_error",
    )
    raw: str | None = None


class BenchmarkItem(Record):
    item_id: str
    base_id: str
    variant: Literal["single", "multi"]
    perturbation_class: str
    intensity: str
    lever_id: str
    generator: str
    question: str
    context: str | None = None
    passages: list[Passage] | None = None
    original_question: str
    original_context: str | None = None
    original_passages: list[Passage] | None = None
    answers: list[str]
    expected: str
    domain: str | None = None


# ----------------------------------------------------------------- evaluation


class Response(Record, TimedCallFields):
    """A target's reply to one benchmark item, with the call's metadata, billing and latency."""

    # responses.parquet has always had the call's latency and billing ahead of the error and outcome.
    TRAILING_COLUMNS: ClassVar[tuple[str, ...]] = (
        "latency_s",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "error",
        "outcome",
        "cached",
        *REPLY_METADATA,
    )

    item_id: str
    model: str
    raw: str | None = None
    decision: str | None = Field(default=None, description="ANSWER or a canonical refusal code")
    confidence: str | None = None
    error: str | None = None
    outcome: str | None = Field(
        default=None,
        description="what the call came to (tasks/llm/reply_outcomes.py): ok (scored), or no usable "
        "response: truncated, provider_blocked, empty, too_long, call_error",
    )


class Judgment(Record):
    item_id: str
    model: str
    expected: str
    decision: str | None = Field(
        description="ANSWER or a canonical refusal code: what scoring reads (the judge's "
        "classification, or the code parser's; see decision_source)"
    )
    parser_decision: str | None = Field(
        default=None, description="the code parser's decision on the same reply (Response.decision)"
    )
    decision_source: Literal["judge", "parser"] | None = Field(
        default=None,
        description="who decided: the judge's classification, or the code parser (evaluation.decision: "
        "codes, a reply that is nothing but a code, or a judge reply without a classification)",
    )
    refusal_reasons: str | None = Field(default=None, description="the judge's short account of a refusal's reasons")
    answer_correct: bool | None = None
    refusal_correct: bool | None = None
    quality: int | None = None
    eligibility: int | None = None
    factuality: int | None = None
    raf: int | None = None
    judge: str | None = None
    judge_raw: str | None = None
    error: str | None = None
    outcome: str | None = Field(
        default=None,
        description="the row's outcome (tasks/llm/reply_outcomes.py): ok (scored), the response's "
        "when it was not usable, or judge_error",
    )
    confidence: str | None = None
    perturbation_class: str | None = None
    intensity: str | None = None
    lever_id: str | None = None
    domain: str | None = None
    generator: str | None = None
    # The reply's metadata (CallResult.metadata): why it stopped, its reasoning (split off ``judge_raw``), who served it.
    judge_finish_reason: str | None = Field(
        default=None, description="the judge's finish reason (stop, length, content_filter, ...)"
    )
    judge_reasoning: str | None = Field(default=None, description="the judge's reasoning, kept apart from its answer")
    judge_reasoning_tokens: int | None = Field(
        default=None, description="completion tokens spent on reasoning, as the provider reports"
    )
    judge_served_model: str | None = Field(default=None, description="the model name the provider says answered")
    judge_system_fingerprint: str | None = None
    # What the judge's call billed (CallResult.billing("judge_")); a row the judge did not see has none.
    judge_cached: bool = False
    judge_prompt_tokens: int | None = None
    judge_completion_tokens: int | None = None
    judge_cost_usd: float | None = None
