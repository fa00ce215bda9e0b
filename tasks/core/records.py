"""Typed records of the domain and the one place that maps them to Parquet schemas.

Every artifact table is a list of one of these records. ``arrow_schema(Record)`` derives
the pyarrow schema from the pydantic fields, so a record and its Parquet file cannot
drift apart; ``to_table`` / ``from_table`` convert both ways.
"""

from __future__ import annotations

import datetime as dt
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from refusalbench.tasks.refusalbench.taxonomy import Intensity, LeverTarget, PerturbationClass


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
        default=None, description="why the target departs from the class's rule (paper App. I.3); None when it follows it")
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
        from refusalbench.tasks.refusalbench.taxonomy import expected_behaviour

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


# ----------------------------------------------------------------- generation

class Assignment(Record):
    """One (base item, lever) pair a generator is asked to realise."""

    assignment_id: str
    base_id: str
    lever_id: str
    perturbation_class: str
    intensity: str
    variant: Literal["single", "multi"]


class Candidate(Record):
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
    raw: str | None = None
    question: str | None = None
    context: str | None = None
    passages: list[Passage] | None = None
    rationale: str | None = None
    answer_constraint_holds: bool | None = None
    precheck_failures: list[str] | None = Field(
        default=None, description="failed pre-checks as 'rule: detail' ([] passed; None: not pre-checked, e.g. not parsed)")
    expected: str
    prompt_hash: str
    cached: bool = False
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None


class Verification(Record):
    candidate_id: str
    generator: str
    verifier: str
    verdict: Literal["PASS", "FAIL", "ERROR", "SKIPPED"] = Field(
        description="the verdict that counts: a PASS the verifier's own criteria contradict counts as FAIL")
    stated_verdict: Literal["PASS", "FAIL"] | None = Field(default=None, description="the verdict as the verifier stated it")
    consistent: bool | None = Field(
        default=None, description="whether the stated verdict agrees with the criteria (None: no verdict)")
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
    raw: str | None = None
    cached: bool = False


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

class Response(Record):
    item_id: str
    model: str
    raw: str | None = None
    decision: str | None = Field(default=None, description="ANSWER or a canonical refusal code")
    confidence: str | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    error: str | None = None
    cached: bool = False


class Judgment(Record):
    item_id: str
    model: str
    expected: str
    decision: str | None
    answer_correct: bool | None = None
    refusal_correct: bool | None = None
    quality: int | None = None
    eligibility: int | None = None
    factuality: int | None = None
    raf: int | None = None
    judge: str | None = None
    judge_raw: str | None = None
    error: str | None = None
    confidence: str | None = None
    perturbation_class: str | None = None
    intensity: str | None = None
    lever_id: str | None = None
    domain: str | None = None
    generator: str | None = None


class MetricsRow(Record):
    model: str
    group: str = Field(description="'overall' or the breakdown dimension, e.g. 'perturbation_class'")
    value: str = Field(description="the group's value ('all' for overall)")
    metric: str
    estimate: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int


# ----------------------------------------------------------------- provenance

class RunManifest(Record):
    schema_version: str = Field(default="", description="version of the run-folder contract (runfolder.SCHEMA_VERSION)")
    run_id: str
    kind: str = Field(description="generate | evaluate | knowornot | run | refresh")
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    package_version: str
    config_hash: str
    config: dict[str, Any] = Field(default_factory=dict)
    catalogue_hash: str | None = None
    prompt_hashes: dict[str, str] = Field(default_factory=dict)
    seed: int | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    counts: dict[str, Any] = Field(default_factory=dict)
    calls: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list)
    status: Literal["running", "completed", "failed"] = "running"


# ----------------------------------------------------------------- Parquet mapping

R = TypeVar("R", bound=BaseModel)


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _arrow_type(annotation: Any) -> pa.DataType:
    annotation, _ = _unwrap_optional(annotation)
    origin = get_origin(annotation)
    if annotation is str or origin is Literal:
        return pa.string()
    if annotation is bool:
        return pa.bool_()
    if annotation is int:
        return pa.int64()
    if annotation is float:
        return pa.float64()
    if annotation is dt.datetime:
        return pa.timestamp("us", tz="UTC")
    if origin in (list, typing.List):  # noqa: UP006
        (inner,) = get_args(annotation)
        return pa.list_(_arrow_type(inner))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct([pa.field(n, _arrow_type(f.annotation)) for n, f in annotation.model_fields.items()])
    if origin is dict or annotation is Any:
        # Free-form mappings are stored as JSON text: Parquet has no schemaless map.
        return pa.string()
    raise TypeError(f"no Parquet mapping for {annotation!r}")


def arrow_schema(record_type: type[BaseModel]) -> pa.Schema:
    fields = []
    for name, field in record_type.model_fields.items():
        _, optional = _unwrap_optional(field.annotation)
        fields.append(pa.field(name, _arrow_type(field.annotation), nullable=optional or field.default is not None or True))
    return pa.schema(fields)


def _json_fields(record_type: type[BaseModel]) -> list[str]:
    out = []
    for name, field in record_type.model_fields.items():
        ann, _ = _unwrap_optional(field.annotation)
        if get_origin(ann) is dict or ann is Any:
            out.append(name)
    return out


def to_table(records: list[BaseModel], record_type: type[BaseModel]) -> pa.Table:
    import json

    json_fields = _json_fields(record_type)
    rows = []
    for rec in records:
        row = rec.model_dump(mode="python")
        for name in json_fields:
            row[name] = json.dumps(row[name], sort_keys=True, default=str)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=arrow_schema(record_type))


def from_table(table: pa.Table, record_type: type[R]) -> list[R]:
    import json

    json_fields = _json_fields(record_type)
    out = []
    for row in table.to_pylist():
        for name in json_fields:
            if isinstance(row.get(name), str):
                row[name] = json.loads(row[name])
        out.append(record_type.model_validate({k: v for k, v in row.items() if k in record_type.model_fields}))
    return out
