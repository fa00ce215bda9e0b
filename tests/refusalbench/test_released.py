"""The authors' released benchmarks read item for item, and what ``evaluation.protocol`` sends and scores."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.calls import CallResult
from refusalbench.tasks.llm.structured_outputs import JudgePaperMultiOutput, JudgePaperOutput
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark
from refusalbench.tasks.refusalbench.schema.records import Response
from refusalbench.tasks.refusalbench.schema.released import (
    RELEASE_METADATA_KEY,
    read_release,
    release_table,
)
from refusalbench.tasks.refusalbench.stages.judge import (
    judge_messages,
    judge_schema,
    judgment_from_result,
    needs_judge,
)
from refusalbench.tasks.refusalbench.stages.respond import target_messages
from refusalbench.tasks.refusalbench.taxonomy import REFUSAL_CODES

# (class, intensity, expected) for six records: two answerable, four refusals with their codes.
STRATA = [
    ("P-Ambiguity", "LOW", "ANSWER_CORRECTLY"),
    ("P-Ambiguity", "HIGH", "REFUSE_AMBIGUOUS_QUERY"),
    ("P-Contradiction", "MEDIUM", "REFUSE_CONTRADICTORY_CONTEXT"),
    ("P-MissingInfo", "HIGH", "REFUSE_INFO_MISSING_IN_CONTEXT"),
    ("P-FalsePremise", "LOW", "ANSWER_CORRECTLY"),
    ("P-EpistemicMismatch", "HIGH", "REFUSE_NONFACTUAL_QUERY"),
]


def released_records(shape: str) -> list[dict[str, Any]]:
    """Six records in the released layout: ``nq`` (one passage) or ``garage`` (a list of passages).
    The first three share one original item; the garage records carry no original query."""
    records = []
    for n, (cls, intensity, expected) in enumerate(STRATA):
        answer = f"Answer{n}"
        passage = f"The answer is {answer}. Some more text about item {n}."
        record: dict[str, Any] = {
            "unique_id": f"{shape}-{n}",
            "perturbed_query": f"What is thing {n}?",
            "perturbed_context": passage if shape == "nq" else [passage, f"An unrelated passage {n}."],
            "expected_rag_behavior": expected,
            "original_answers": [answer],
            "perturbation_class": cls,
            "intensity": intensity,
            "lever_selected": f"lever {n}",
            "generator_model": "gen-x",
            "verifier_votes": {"v1": True, "v2": n % 2 == 0},
        }
        if shape == "nq":
            record["original_query"] = "What is thing?" if n < 3 else f"What is thing {n}?"
            record["original_context"] = "Original passage." if n < 3 else f"Original passage {n}."
        records.append(record)
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_an_nq_release_reads_item_for_item_with_bases_from_the_original(tmp_path):
    source = write_jsonl(tmp_path / "nq.jsonl", released_records("nq"))
    release = read_release(str(source))
    assert [i.item_id for i in release.items] == [f"nq-{n}" for n in range(6)]
    first = release.items[1]
    assert (first.variant, first.context, first.passages) == (
        "single",
        "The answer is Answer1. Some more text about item 1.",
        None,
    )
    assert (first.expected, first.perturbation_class, first.intensity) == (
        "REFUSE_AMBIGUOUS_QUERY",
        "P-Ambiguity",
        "HIGH",
    )
    assert (first.answers, first.lever_id, first.generator) == (["Answer1"], "lever 1", "gen-x")
    assert first.original_question == "What is thing?" and first.original_context == "Original passage."
    # The three perturbations of one original item share a base; the others are bases of their own.
    assert len({i.base_id for i in release.items[:3]}) == 1
    assert len({i.base_id for i in release.items}) == 4
    assert release.license == "Apache-2.0"
    assert release.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    assert release.extras[0]["verifier_votes"] == {"v1": True, "v2": True}


def test_a_garage_release_is_multi_document_without_originals_each_item_its_own_base(tmp_path):
    path = tmp_path / "garage.json"
    path.write_text(json.dumps(released_records("garage")))
    release = read_release(str(path))
    assert {i.variant for i in release.items} == {"multi"}
    assert [p.text for p in release.items[0].passages or []][1] == "An unrelated passage 0."
    assert [i.base_id for i in release.items] == [i.item_id for i in release.items]
    assert release.license == "CC-BY-NC-4.0"
    assert read_release(str(path), "CC-BY-4.0").license == "CC-BY-4.0"


def test_a_parquet_release_is_taken_by_read_benchmark_and_the_imported_file_keeps_extras_and_facts(tmp_path):
    records = released_records("nq")
    for record in records:
        record["verifier_votes"] = json.dumps(record["verifier_votes"])
    released = tmp_path / "nq.parquet"
    pq.write_table(pa.Table.from_pylist(records), released)
    assert [i.item_id for i in read_benchmark(str(released))] == [f"nq-{n}" for n in range(6)]

    table = release_table(read_release(str(released)))
    # original_context is also a benchmark column: the source's own value keeps its name with a prefix.
    assert {"verifier_votes", "original_query", "release_original_context"} <= set(table.column_names)
    facts = json.loads(table.schema.metadata[RELEASE_METADATA_KEY])
    assert facts["license"] == "Apache-2.0" and facts["items"] == 6 and len(facts["sha256"]) == 64
    imported = tmp_path / "benchmark.parquet"
    pq.write_table(table, imported)
    assert [i.item_id for i in read_benchmark(str(imported))] == [f"nq-{n}" for n in range(6)]


@pytest.mark.parametrize("field", ["perturbed_query", "expected_rag_behavior", "original_answers"])
def test_a_record_without_a_field_names_the_file_its_line_and_the_field(tmp_path, field):
    records = released_records("nq")
    del records[3][field]
    source = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(InputError) as caught:
        read_release(str(source))
    assert str(caught.value) == f"{source}:4: {field}: required field is missing"


def test_an_unknown_expected_behaviour_is_refused_with_its_line(tmp_path):
    records = released_records("nq")
    records[1]["expected_rag_behavior"] = "REFUSE_BECAUSE"
    with pytest.raises(InputError, match=r"bad\.jsonl:2: expected_rag_behavior: not ANSWER_CORRECTLY"):
        read_release(str(write_jsonl(tmp_path / "bad.jsonl", records)))


# ----------------------------------------------------------------- what each protocol sends


@pytest.fixture
def items(tmp_path):
    nq = read_release(str(write_jsonl(tmp_path / "nq.jsonl", released_records("nq")))).items
    garage = read_release(str(write_jsonl(tmp_path / "g.jsonl", released_records("garage")))).items
    return nq[1], garage[0]


def test_the_paper_target_prompt_lists_the_seven_codes_and_asks_for_the_code_alone(items):
    single, multi = items
    system, user = (m["content"] for m in target_messages(single, protocol="paper"))
    assert [line for line in system.splitlines() if line.startswith("- ")] == [f"- {c}" for c in REFUSAL_CODES]
    assert "reply with only one of these codes and no other text" in system
    assert "<context>\nThe answer is Answer1." in user and "<question>\nWhat is thing 1?\n</question>" in user
    _, multi_user = (m["content"] for m in target_messages(multi, protocol="paper"))
    assert '<passage index="2">\nAn unrelated passage 0.\n</passage>' in multi_user
    # The default protocol explains each code; the paper's lists them bare.
    default_system = target_messages(single)[0]["content"]
    assert "- REFUSE_AMBIGUOUS_QUERY: the question or the context can be read" in default_system
    assert "- REFUSE_AMBIGUOUS_QUERY:" not in system


def test_the_paper_judge_asks_once_for_classification_and_quality_score(items):
    single, multi = items
    bare = Response(item_id=single.item_id, model="t", raw="REFUSE_AMBIGUOUS_QUERY", decision="REFUSE_AMBIGUOUS_QUERY")
    # A bare code skips the judge by default; the paper's protocol judges every reply.
    assert not needs_judge(single, bare) and needs_judge(single, bare, protocol="paper")
    assert judge_schema(single, "paper") is JudgePaperOutput and judge_schema(multi, "paper") is JudgePaperMultiOutput
    user = judge_messages(single, bare, "paper")[1]["content"]
    assert "# CLASSIFICATION" in user and "# QUALITY_SCORE" in user and "# RAF" not in user
    assert '{"classification": "<ANSWER_ATTEMPT or a code>", "quality_score": <1-5>}' in user
    assert "<reference_answer>\nAnswer1\n</reference_answer>" in user
    multi_user = judge_messages(multi, bare.model_copy(update={"item_id": multi.item_id}), "paper")[1]["content"]
    assert "# RAF" in multi_user and '<passage index="1" relevant="true">' in multi_user
    assert judge_messages(single, bare)[1]["content"] != user  # the default protocol's judge prompt differs


def _judged(item, parsed, raw="reply"):
    response = Response(item_id=item.item_id, model="t", raw=raw, decision="ANSWER")
    result = CallResult(model="judge", key="k", text="{}", parsed=parsed)
    return judgment_from_result(item, response, "judge", result)


@pytest.mark.parametrize(("score", "correct"), [(5, True), (4, True), (3, False), (1, False)])
def test_under_the_paper_protocol_an_answer_is_correct_at_quality_four_or_five(tmp_path, score, correct):
    answerable = read_release(str(write_jsonl(tmp_path / "nq.jsonl", released_records("nq")))).items[0]
    judgment = _judged(answerable, JudgePaperOutput(classification="ANSWER_ATTEMPT", quality_score=score))
    assert (judgment.decision, judgment.quality, judgment.answer_correct) == ("ANSWER", score, correct)


def test_under_the_paper_protocol_a_multi_document_answer_is_correct_at_raf_one(items):
    _, multi = items
    answerable = multi.model_copy(update={"expected": "ANSWER_CORRECTLY"})
    graded = {"classification": "ANSWER_ATTEMPT", "quality_score": 5, "eligibility": 1, "factuality": 1}
    assert _judged(answerable, JudgePaperMultiOutput(**graded, raf=1)).answer_correct is True
    assert _judged(answerable, JudgePaperMultiOutput(**graded, raf=0)).answer_correct is False


@pytest.mark.parametrize(
    ("code", "correct"),
    [("REFUSE_AMBIGUOUS_QUERY", True), ("REFUSE_INFO_MISSING_IN_CONTEXT", False), ("REFUSE_OTHER", False)],
)
def test_under_the_paper_protocol_a_refusal_is_correct_only_with_the_exact_code(items, code, correct):
    single, _ = items  # expects REFUSE_AMBIGUOUS_QUERY
    judgment = _judged(single, JudgePaperOutput(classification=code, quality_score=1), raw=code)
    assert (judgment.decision, judgment.refusal_correct, judgment.decision_source) == (code, correct, "judge")
