"""Every record type round-trips through its Parquet schema."""

from __future__ import annotations

import datetime as dt
import io

import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core import records as r


SAMPLES = [
    r.Lever(id="x", name="X", perturbation_class="P-Ambiguity", intensity="LOW", target="query", instruction="do",
            example=r.LeverExample(question="q", context="c", expected="ANSWER_CORRECTLY", answer="a"), multi_document="m"),
    r.BaseItem(id="b1", question="q?", answers=["a"], context="c", domain="science"),
    r.BaseItem(id="b2", question="q?", answers=["a", "b"], passages=[r.Passage(text="t", relevant=True)]),
    r.Assignment(assignment_id="a1", base_id="b1", lever_id="x", perturbation_class="P-Ambiguity", intensity="LOW", variant="single"),
    r.Candidate(candidate_id="c1", assignment_id="a1", base_id="b1", lever_id="x", perturbation_class="P-Ambiguity",
                intensity="LOW", variant="single", generator="g", status="parse_error", raw="oops", expected="ANSWER_CORRECTLY",
                prompt_hash="h"),
    r.Verification(candidate_id="c1", generator="g", verifier="v", verdict="PASS", lever_fidelity=True, strategy_compliance=None),
    r.BenchmarkItem(item_id="i", base_id="b", variant="single", perturbation_class="P-Ambiguity", intensity="LOW", lever_id="x",
                    generator="g", question="q", context="c", original_question="oq", original_context="oc", answers=["a"],
                    expected="ANSWER_CORRECTLY"),
    r.Response(item_id="i", model="m", raw="REFUSE_AMBIGUOUS", decision="REFUSE_AMBIGUOUS_QUERY", latency_s=0.5),
    r.Judgment(item_id="i", model="m", expected="ANSWER_CORRECTLY", decision="ANSWER", answer_correct=True, quality=5),
    r.MetricsRow(model="m", group="overall", value="all", metric="answer_accuracy", estimate=0.5, ci_low=0.4, ci_high=0.6, n=10),
    r.RunManifest(run_id="r", kind="generate", created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), package_version="0",
                  config_hash="h", config={"models": {"a": {"x": 1}}}, counts={"candidates": 3}),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda rec: type(rec).__name__)
def test_parquet_roundtrip(record):
    kind = type(record)
    table = r.to_table([record, record], kind)
    assert table.schema == r.arrow_schema(kind)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    buffer.seek(0)
    back = r.from_table(pq.read_table(buffer), kind)
    assert back == [record, record]


def test_empty_table_keeps_its_schema():
    table = r.to_table([], r.Candidate)
    assert table.num_rows == 0 and "candidate_id" in table.schema.names
