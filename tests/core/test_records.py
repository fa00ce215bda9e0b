"""Every record type round-trips through its Parquet schema."""

from __future__ import annotations

import datetime as dt
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core.runfolder import RunManifest
from refusalbench.tasks.core.tables import arrow_schema, from_table, to_table
from refusalbench.tasks.refusalbench.schema import records as r

SAMPLES = [
    r.Lever(
        id="x",
        name="X",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        target="query",
        instruction="do",
        example=r.LeverExample(question="q", context="c", expected="ANSWER_CORRECTLY", answer="a"),
        multi_document="m",
    ),
    r.BaseItem(id="b1", question="q?", answers=["a"], context="c", domain="science"),
    r.BaseItem(id="b2", question="q?", answers=["a", "b"], passages=[r.Passage(text="t", relevant=True)]),
    r.Assignment(
        assignment_id="a1",
        base_id="b1",
        lever_id="x",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        variant="single",
    ),
    r.Candidate(
        candidate_id="c1",
        assignment_id="a1",
        base_id="b1",
        lever_id="x",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        variant="single",
        generator="g",
        status="parse_error",
        raw="oops",
        expected="ANSWER_CORRECTLY",
        prompt_hash="h",
    ),
    r.Verification(
        candidate_id="c1", generator="g", verifier="v", verdict="PASS", lever_fidelity=True, strategy_compliance=None
    ),
    r.BenchmarkItem(
        item_id="i",
        base_id="b",
        variant="single",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        lever_id="x",
        generator="g",
        question="q",
        context="c",
        original_question="oq",
        original_context="oc",
        answers=["a"],
        expected="ANSWER_CORRECTLY",
    ),
    r.Response(item_id="i", model="m", raw="REFUSE_AMBIGUOUS", decision="REFUSE_AMBIGUOUS_QUERY", latency_s=0.5),
    r.Judgment(item_id="i", model="m", expected="ANSWER_CORRECTLY", decision="ANSWER", answer_correct=True, quality=5),
    RunManifest(
        run_id="r",
        kind="generate",
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        package_version="0",
        config_hash="h",
        config={"models": {"a": {"x": 1}}},
        counts={"candidates": 3},
    ),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda rec: type(rec).__name__)
def test_parquet_roundtrip(record):
    kind = type(record)
    table = to_table([record, record], kind)
    assert table.schema == arrow_schema(kind)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    buffer.seek(0)
    back = from_table(pq.read_table(buffer), kind)
    assert back == [record, record]


def test_empty_table_keeps_its_schema():
    table = to_table([], r.Candidate)
    assert table.num_rows == 0 and "candidate_id" in table.schema.names


def test_arrow_columns_are_nullable_exactly_where_the_record_allows_none():
    candidate = arrow_schema(r.Candidate)
    assert not candidate.field("candidate_id").nullable  # str, required
    assert not candidate.field("cached").nullable  # bool with a default: never None
    assert not candidate.field("status").nullable  # a Literal
    assert candidate.field("error").nullable  # str | None
    assert candidate.field("passages").nullable  # list[Passage] | None
    passage = candidate.field("passages").type.value_field
    assert not passage.nullable  # no None inside the list
    assert not passage.type.field("text").nullable and not passage.type.field("relevant").nullable
    judgment = arrow_schema(r.Judgment)
    assert judgment.field("decision").nullable  # required, but may be None
    assert not judgment.field("expected").nullable
    manifest = arrow_schema(RunManifest)
    assert not manifest.field("config").nullable  # a mapping, stored as JSON text
    assert manifest.field("finished_at").nullable


def test_a_record_without_its_optional_values_is_written_and_read_back():
    item = r.BaseItem(id="b", question="q?", answers=[])
    table = to_table([item], r.BaseItem)
    table.validate(full=True)
    # Files written before nullability followed the record had every column nullable.
    written_before = table.cast(pa.schema([field.with_nullable(True) for field in table.schema]))
    for version in (table, written_before):
        buffer = io.BytesIO()
        pq.write_table(version, buffer)
        buffer.seek(0)
        assert from_table(pq.read_table(buffer), r.BaseItem) == [item]
