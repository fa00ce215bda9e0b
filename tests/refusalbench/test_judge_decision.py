"""The judge decides answer vs refusal (issue 27.1, paper App. D); the code parser is the first pass.

A target that refuses in prose (no code) is a refusal through the judge, one that quotes a code
inside its answer an answer; a reply that is only a code skips the judge call. ``decision: codes``
keeps the parser's decisions (today's numbers) and asks the judge only to grade answers. The
parser's agreement with the judge is in the manifest and the report.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.gateway import CallResult, gateway_for
from refusalbench.tasks.llm.scripted_replies import scripted_classification
from refusalbench.tasks.llm.structured_outputs import JUDGE_CLASSIFICATIONS, JudgeDecisionOutput, JudgeSingleOutput
from refusalbench.tasks.refusalbench.decisions import bare_code
from refusalbench.tasks.refusalbench.report.decision_section import decision_section
from refusalbench.tasks.refusalbench.report.run_outputs import judged_frame
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Response
from refusalbench.tasks.refusalbench.scoring import score_frame
from refusalbench.tasks.refusalbench.stages.judge import judge_responses, judgment_from_result, parser_agreement
from refusalbench.tasks.refusalbench.taxonomy import REFUSAL_CODES
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, judge_by_reference

# Two answerable items (one multi-document), two missing-info items, one ambiguous item.
SMALL = [ITEMS[0], ITEMS[3], ITEMS[4], ITEMS[5], ITEMS[7]]
PROSE = "The context does not say, so I cannot answer."
RESPONDERS = {
    "prose": lambda req: PROSE,
    "quoter": lambda req: f"{oracle(req)} (No need for REFUSE_MISSING here.)",
    "bare": lambda req: "**REFUSE_MISSING**\nCONFIDENCE: CONFIDENT",
    "judge": judge_by_reference,
}


def test_judge_classifications_are_the_taxonomy_codes():
    assert JUDGE_CLASSIFICATIONS == ("ANSWER_ATTEMPT", *REFUSAL_CODES)


def test_bare_code_and_scripted_classification():
    assert bare_code("`REFUSE_AMBIGUOUS`.\n\nConfidence: 0.8") == "REFUSE_AMBIGUOUS_QUERY"
    assert bare_code("The context does not say. REFUSE_MISSING") is None
    assert bare_code("CONFIDENCE: CONFIDENT") is None
    assert scripted_classification(PROSE)[0] == "REFUSE_INFO_MISSING_IN_CONTEXT"
    assert scripted_classification("It is ref0. (No need for REFUSE_MISSING here.)")[0] == "ANSWER_ATTEMPT"
    assert scripted_classification("I cannot answer: **REFUSE_AMBIGUOUS**")[0] == "REFUSE_AMBIGUOUS_QUERY"


def _judged(raw: str, reply: str, schema=JudgeSingleOutput, item: BenchmarkItem = ITEMS[0]):
    response = Response(item_id=item.item_id, model="m", raw=raw, decision="REFUSE_INFO_MISSING_IN_CONTEXT")
    parsed = schema.model_validate_json(reply)
    return judgment_from_result(item, response, "judge", CallResult(model="judge", key="k", text=reply, parsed=parsed))


def test_old_judge_reply_keeps_the_parser_decision_and_unknown_classification_fails():
    old = _judged("REFUSE_MISSING, sorry", '{"quality": 5}')  # written before the judge classified
    assert (old.decision, old.decision_source, old.answer_correct, old.quality) == (
        "REFUSE_INFO_MISSING_IN_CONTEXT",
        "parser",
        False,
        None,
    )
    odd = _judged("x", '{"classification": "maybe", "quality": 1}')
    assert odd.outcome == "judge_error" and "unknown classification" in odd.error
    answer = _judged("ref0, not REFUSE_MISSING", '{"classification": "answer attempt", "quality": 5}')
    assert (answer.decision, answer.decision_source, answer.answer_correct, answer.quality) == (
        "ANSWER",
        "judge",
        True,
        5,
    )
    refusal = _judged(
        "unclear",
        '{"classification": "REFUSE_AMBIGUOUS", "refusal_reasons": "two readings"}',
        JudgeDecisionOutput,
        ITEMS[7],
    )
    assert (refusal.decision, refusal.refusal_correct, refusal.refusal_reasons) == (
        "REFUSE_AMBIGUOUS_QUERY",
        True,
        "two readings",
    )
    assert parser_agreement([old, odd, answer, refusal])["m"] == {
        "judge_decided": 2,
        "agreement": 0.0,
        "prose_refusals_missed": 0,
        "quoted_codes_as_refusals": 1,
        "other_code": 1,
        "parser_decided": 1,
    }


@pytest.fixture(scope="module")
def small_benchmark(tmp_path_factory) -> str:
    return ArtifactStore(tmp_path_factory.mktemp("bench")).write_records("benchmark.parquet", SMALL, BenchmarkItem)


def _evaluate(tmp_path, url: str, benchmark: str, decision: str):
    """Run the evaluate flow with ``decision``; (run folder, metrics per model, manifest counts)."""
    from refusalbench.flows.launch import run_evaluation

    models = "\n".join(f"  {n}:\n    model: openai/{n}\n    api_base: {url}" for n in RESPONDERS)
    config = tmp_path / f"{decision}.yaml"
    config.write_text(
        f"models:\n{models}\ncache:\n  path: {tmp_path / 'calls.sqlite'}\nevaluation:\n"
        f"  targets: [prose, quoter, bare]\n  judge: judge\n  decision: {decision}\n  bootstrap: 0\n"
    )
    out = tmp_path / decision
    run_evaluation(str(config), benchmark, str(out))
    metrics = json.loads((out / "metrics.json").read_text())["models"]
    manifest = json.loads((out / "manifest.json").read_text())
    return out, metrics, manifest["counts"]


@pytest.mark.usefixtures("prefect_harness")
def test_judge_decides_and_codes_keep_the_parser(tmp_path, fake_llm, small_benchmark):
    fake_llm.responder = by_model(RESPONDERS)
    out, metrics, counts = _evaluate(tmp_path, fake_llm.url, small_benchmark, "judge")
    # The prose refusal is a refusal (missing information: right on the two missing-info items).
    assert metrics["prose"]["refusal_rate"] == 1.0 and metrics["prose"]["missed_refusal_rate"] == 0.0
    assert metrics["prose"]["refusal_accuracy"] == pytest.approx(2 / 3)
    # The quoted code is an answer: the reference, so both answerable items are right; every refusal missed.
    assert metrics["quoter"]["refusal_rate"] == 0.0 and metrics["quoter"]["answer_accuracy"] == 1.0
    assert metrics["quoter"]["missed_refusal_rate"] == 1.0
    # A bare code needs no judge call: the judge saw only prose's and quoter's 5 + 5 replies.
    assert len(fake_llm.calls_for("judge")) == 10
    judgments = pd.read_parquet(out / "judgments.parquet").set_index("model")
    assert set(judgments.loc["bare", "decision_source"]) == {"parser"}
    assert set(judgments.loc["prose", "parser_decision"]) == {"ANSWER"}
    assert counts["decision"] == "judge"
    assert counts["parser_agreement"]["prose"] == {
        "judge_decided": 5,
        "agreement": 0.0,
        "prose_refusals_missed": 5,
        "quoted_codes_as_refusals": 0,
        "other_code": 0,
        "parser_decided": 0,
    }
    assert counts["parser_agreement"]["quoter"]["quoted_codes_as_refusals"] == 5
    assert counts["parser_agreement"]["bare"] == {
        "judge_decided": 0,
        "agreement": None,
        "prose_refusals_missed": 0,
        "quoted_codes_as_refusals": 0,
        "other_code": 0,
        "parser_decided": 5,
    }
    report = (out / "report.html").read_text()
    assert "Answer vs refusal decision" in report and "prose refusals missed" in report

    # decision: codes — the parser's decisions, as before the judge classified: the same responses judged
    # again by the stage's own function (the flow passes config.evaluation.decision to it).
    before = len(fake_llm.calls_for("judge"))
    config = load_config(str(tmp_path / "judge.yaml"))
    responses = ArtifactStore(out).read_records("responses.parquet", Response)
    judgments = judge_responses(
        gateway_for(config), {i.item_id: i for i in SMALL}, responses, "judge", decision="codes"
    )
    metrics = score_frame(judged_frame(judgments, SMALL)[0], n_resamples=0).metrics
    assert metrics["prose"]["refusal_rate"] == 0.0 and metrics["prose"]["missed_refusal_rate"] == 1.0
    assert metrics["prose"]["answer_accuracy"] == 0.0
    assert metrics["quoter"]["refusal_rate"] == 1.0 and metrics["quoter"]["false_refusal_rate"] == 1.0
    assert metrics["quoter"]["refusal_accuracy"] == pytest.approx(2 / 3)
    assert metrics["bare"]["refusal_accuracy"] == pytest.approx(2 / 3)
    assert {j.decision_source for j in judgments} == {"parser"}
    # Only the prose answers to the two answerable items are judged; their requests are the judge run's (cached).
    assert len(fake_llm.calls_for("judge")) == before
    assert "decision: codes" in decision_section({"counts": {"decision": "codes"}}, [])
