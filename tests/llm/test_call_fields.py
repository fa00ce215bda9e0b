"""The call metadata (tokens, cost, latency, finish reason, reasoning, who served it) is declared once.

``tasks/llm/call_fields.py`` declares it in three nested groups; ``CallResult`` and every record keeping
a reply inherit the smallest group that fits, and their Parquet tables keep the columns, types,
nullability and order they had when each record declared its own copy.
"""

from __future__ import annotations

import inspect
import io
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel, ValidationError

from refusalbench.tasks.core.tables import FieldGroup, Record, arrow_schema, column_names, from_table, to_table
from refusalbench.tasks.knowornot.schema import records as kon
from refusalbench.tasks.llm.call_fields import (
    REPLY_BILLING,
    REPLY_METADATA,
    CallFields,
    ReplyFields,
    TimedCallFields,
)
from refusalbench.tasks.llm.calls import CallResult
from refusalbench.tasks.refusalbench.schema import records as rb

GROUPS = (ReplyFields, CallFields, TimedCallFields)
CALL_FIELDS = set(TimedCallFields.model_fields)
RECORDS = [
    obj
    for module in (rb, kon)
    for obj in vars(module).values()
    if inspect.isclass(obj) and issubclass(obj, Record) and obj.__module__ == module.__name__
]

# Each table holding a reply as it was before the records shared these fields: "name: type", "not null"
# where the column never holds null, in column order.
BEFORE = {
    rb.Candidate: (
        "candidate_id: string not null",
        "assignment_id: string not null",
        "base_id: string not null",
        "lever_id: string not null",
        "perturbation_class: string not null",
        "intensity: string not null",
        "variant: string not null",
        "generator: string not null",
        "status: string not null",
        "error: string",
        "outcome: string",
        "raw: string",
        "question: string",
        "context: string",
        "passages: list<item: struct<text: string not null, relevant: bool not null> not null>",
        "rationale: string",
        "answer_constraint_holds: bool",
        "precheck_failures: list<item: string not null>",
        "expected: string not null",
        "prompt_hash: string not null",
        "cached: bool not null",
        "latency_s: double",
        "prompt_tokens: int64",
        "completion_tokens: int64",
        "cost_usd: double",
        "finish_reason: string",
        "reasoning: string",
        "reasoning_tokens: int64",
        "served_model: string",
        "system_fingerprint: string",
    ),
    rb.Verification: (
        "candidate_id: string not null",
        "generator: string not null",
        "verifier: string not null",
        "verdict: string not null",
        "stated_verdict: string",
        "consistent: bool",
        "lever_fidelity: bool",
        "intensity_achieved: bool",
        "target_compliance: bool",
        "uncertainty_induced: bool",
        "implementation_quality: bool",
        "answer_constraint: bool",
        "predicted_behaviour: bool",
        "refusal_class_alignment: bool",
        "strategy_compliance: bool",
        "error: string",
        "outcome: string",
        "raw: string",
        "cached: bool not null",
        "prompt_tokens: int64",
        "completion_tokens: int64",
        "cost_usd: double",
        "finish_reason: string",
        "reasoning: string",
        "reasoning_tokens: int64",
        "served_model: string",
        "system_fingerprint: string",
    ),
    rb.Response: (
        "item_id: string not null",
        "model: string not null",
        "raw: string",
        "decision: string",
        "confidence: string",
        "latency_s: double",
        "prompt_tokens: int64",
        "completion_tokens: int64",
        "cost_usd: double",
        "error: string",
        "outcome: string",
        "cached: bool not null",
        "finish_reason: string",
        "reasoning: string",
        "reasoning_tokens: int64",
        "served_model: string",
        "system_fingerprint: string",
    ),
    kon.ExperimentOutput: (
        "experiment_id: string not null",
        "question_id: string not null",
        "target: string not null",
        "retrieval: string not null",
        "prompt: string not null",
        "ookb: bool not null",
        "response: string",
        "error: string",
        "cached: bool not null",
        "latency_s: double",
        "prompt_tokens: int64",
        "completion_tokens: int64",
        "cost_usd: double",
        "finish_reason: string",
        "reasoning: string",
        "reasoning_tokens: int64",
        "served_model: string",
        "system_fingerprint: string",
    ),
    kon.EvalOutcome: (
        "experiment_id: string not null",
        "spec: string not null",
        "evaluator: string not null",
        "outcome: string",
        "error: string",
        "raw: string",
        "cached: bool not null",
        "finish_reason: string",
        "reasoning: string",
        "reasoning_tokens: int64",
        "served_model: string",
        "system_fingerprint: string",
    ),
}

# The fields each of those records needs besides its call fields.
REQUIRED: dict[type[Record], dict[str, Any]] = {
    rb.Candidate: {
        "candidate_id": "c1",
        "assignment_id": "a1",
        "base_id": "b1",
        "lever_id": "x",
        "perturbation_class": "P-Ambiguity",
        "intensity": "LOW",
        "variant": "single",
        "generator": "g",
        "status": "ok",
        "expected": "ANSWER_CORRECTLY",
        "prompt_hash": "h",
    },
    rb.Verification: {"candidate_id": "c1", "generator": "g", "verifier": "v", "verdict": "PASS"},
    rb.Response: {"item_id": "i", "model": "m", "raw": "an answer", "error": "e", "outcome": "ok"},
    kon.ExperimentOutput: {
        "experiment_id": "e1",
        "question_id": "q1",
        "target": "t",
        "retrieval": "direct",
        "prompt": "p",
        "ookb": False,
        "response": "r",
    },
    kon.EvalOutcome: {"experiment_id": "e1", "spec": "abstention", "evaluator": "j", "outcome": "Yes"},
}


def _declared(cls: type[BaseModel]) -> set[str]:
    """The fields declared in ``cls``'s own body (not inherited; class variables left out)."""
    return {name for name in inspect.get_annotations(cls) if name in cls.model_fields}


def _columns(schema: pa.Schema) -> tuple[str, ...]:
    return tuple(f"{field.name}: {field.type}{'' if field.nullable else ' not null'}" for field in schema)


def _group(cls: type[BaseModel]) -> type[ReplyFields]:
    """The largest call-field group ``cls`` inherits."""
    return next(group for group in reversed(GROUPS) if issubclass(cls, group))


def test_each_call_field_is_declared_in_exactly_one_group():
    declared = [_declared(group) for group in GROUPS]
    assert sum(len(names) for names in declared) == len(CALL_FIELDS) == len(set().union(*declared))
    reply, call, timed = declared
    assert reply == {"cached", *REPLY_METADATA}  # what CallResult.metadata() copies, and the cache flag
    assert call | {"cached"} == set(REPLY_BILLING)  # what CallResult.billing() copies
    assert timed == {"latency_s"}


@pytest.mark.parametrize("cls", [*RECORDS, CallResult], ids=lambda cls: cls.__name__)
def test_no_record_declares_a_call_field_again(cls):
    own = _declared(cls)
    if issubclass(cls, ReplyFields):
        assert not own & CALL_FIELDS
    else:
        # A record that keeps no reply has no call metadata; a pre-test row (two calls, an answer and its
        # judging, in one row) notes whether its answer was cached, what the row came to and what it billed.
        noted = {"cached", "outcome", "cost_usd"} if cls is rb.PretestRow else {"cached"}
        assert not own & (CALL_FIELDS - noted)


def test_the_records_keeping_a_reply_inherit_the_smallest_group_that_fits():
    assert {cls.__name__: _group(cls).__name__ for cls in [*RECORDS, CallResult] if issubclass(cls, ReplyFields)} == {
        "Candidate": "TimedCallFields",
        "Verification": "CallFields",
        "Response": "TimedCallFields",
        "ExperimentOutput": "TimedCallFields",
        "EvalOutcome": "ReplyFields",
        "CallResult": "TimedCallFields",
    }
    with pytest.raises(ValidationError, match="latency_s"):  # a verification is not timed: no such column
        rb.Verification(**REQUIRED[rb.Verification], latency_s=1.0)
    with pytest.raises(ValidationError, match="cost_usd"):  # an evaluation row keeps no billing
        kon.EvalOutcome(**REQUIRED[kon.EvalOutcome], cost_usd=0.1)


@pytest.mark.parametrize("cls", list(BEFORE), ids=lambda cls: cls.__name__)
def test_a_reply_table_keeps_its_columns_types_nullability_and_order(cls):
    assert _columns(arrow_schema(cls)) == BEFORE[cls]


@pytest.mark.parametrize(
    "cls", [cls for cls in RECORDS if not issubclass(cls, FieldGroup)], ids=lambda cls: cls.__name__
)
def test_a_record_without_a_field_group_has_its_columns_in_declaration_order(cls):
    assert column_names(cls) == tuple(cls.model_fields) == tuple(arrow_schema(cls).names)


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda cls: cls.__name__)
def test_a_row_made_from_a_call_result_round_trips_through_parquet(cls):
    result = CallResult(
        model="m",
        key="k",
        cached=True,
        latency_s=0.5,
        prompt_tokens=30,
        completion_tokens=40,
        cost_usd=0.01,
        cached_tokens=10,
        finish_reason="stop",
        reasoning="because",
        reasoning_tokens=7,
        served_model="m-2026",
        system_fingerprint="fp_1",
        batch=True,
    )
    call = {name: getattr(result, name) for name in _group(cls).model_fields}
    row = cls(**REQUIRED[cls], **call)
    table = to_table([row], cls)
    assert table.column_names == list(column_names(cls)) and table.schema == arrow_schema(cls)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    buffer.seek(0)
    back = from_table(pq.read_table(buffer), cls)
    assert back == [row]
    assert {name: getattr(back[0], name) for name in call} == call and back[0].reasoning == "because"


# ----------------------------------------------------------------- the rule, on a group of its own


class _Stamp(FieldGroup):
    TRAILING_COLUMNS: ClassVar[tuple[str, ...]] = ("when", "where", "who", "when")  # "where": a record's own

    when: str | None = None
    who: str | None = None


class _Visit(Record, _Stamp):
    place: str
    where: str | None = None
    note: str | None = None


class _Reordered(Record, _Stamp):
    TRAILING_COLUMNS: ClassVar[tuple[str, ...]] = ("who", "note")

    place: str
    note: str | None = None


def test_a_groups_fields_come_after_the_records_own_in_its_order():
    assert list(_Visit.model_fields) == ["when", "who", "place", "where", "note"]  # pydantic: inherited first
    assert column_names(_Visit) == ("place", "note", "when", "where", "who")  # named once, however often listed
    assert arrow_schema(_Visit).names == ["place", "note", "when", "where", "who"]
    assert column_names(_Stamp) == ("when", "who")


def test_a_record_may_name_its_own_trailing_columns():
    assert column_names(_Reordered) == ("when", "place", "who", "note")
    row = _Reordered(place="p", when="w", note="n")
    assert from_table(to_table([row], _Reordered), _Reordered) == [row]
