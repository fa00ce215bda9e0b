"""The calibration pass (paper App. F.2): ``evaluation.confidence`` asks for confidences in calls of
their own and leaves the main responses on the plain prompt.

An evaluation with ``confidence: true`` sends the main requests with the plain prompt (the
messages of a run without it) and the calibration requests apart. ECE comes from the calibration
pass's judgments, the headline metrics from the main ones (the scripted target answers right on
the plain prompt and wrong on the confidence prompt, so the two sources cannot be confused).
"""

from __future__ import annotations

import hashlib
import json
import math

import pandas as pd
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from refusalbench.tasks.refusalbench.stages.respond import target_messages
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, judge_by_reference, run_config


def asks_confidence(request: dict) -> bool:
    """Whether a request is the calibration pass's (its prompt asks for a CONFIDENCE line)."""
    return any("CONFIDENCE: <LEVEL>" in (m.get("content") or "") for m in request.get("messages") or [])


def sure(request: dict) -> str:
    """Right on the plain prompt; on the confidence prompt a wrong answer, VERY_CONFIDENT."""
    return "It is nothing.\nCONFIDENCE: VERY_CONFIDENT" if asks_confidence(request) else oracle(request)


def refuser(request: dict) -> str:
    return "REFUSE_MISSING\nCONFIDENCE: UNCERTAIN" if asks_confidence(request) else "REFUSE_MISSING"


def write_config(tmp_path, url: str, confidence: bool):
    return run_config(
        tmp_path,
        url,
        ("sure", "refuser", "judge"),
        f"""
        evaluation:
          targets: [sure, refuser]
          judge: judge
          confidence: {str(confidence).lower()}
          bootstrap: 20
          shard_size: 5
        """,
    )


def request_hash(request: dict) -> str:
    return hashlib.sha256(json.dumps([request["model"], request["messages"]], sort_keys=True).encode()).hexdigest()


def test_main_prompt_never_asks_confidence():
    for item in ITEMS[:1] + ITEMS[3:4]:  # one single-document item, one multi-document item
        assert target_messages(item) == target_messages(item, confidence=False)
        assert "CONFIDENCE" not in json.dumps(target_messages(item))
        assert "CONFIDENCE: <LEVEL>" in json.dumps(target_messages(item, confidence=True))


def test_ece_comes_from_the_calibration_rows_and_the_rest_from_the_main_ones():
    """score_frame(main, calibration=rows): ECE, its intervals, breakdown rows and reliability table are
    those of ``rows`` scored alone; every other metric is ``main``'s. Without it, a file's own confidences."""
    from refusalbench.tasks.refusalbench.scoring import score_frame
    from refusalbench.tasks.refusalbench.scoring.specs import calibration_metrics
    from tests.refusalbench.test_report import judged

    main = judged(["alpha", "beta"], with_confidence=False, n_items=24, seed=1)
    rows = judged(["alpha", "beta"], with_confidence=True, n_items=24, seed=2)
    alone, plain = score_frame(rows, n_resamples=10), score_frame(main, n_resamples=10)
    both = score_frame(main, n_resamples=10, calibration=rows)
    assert set(calibration_metrics()) == {"ece", "ece_answer", "ece_refusal"}
    for model in ("alpha", "beta"):
        for name in calibration_metrics():
            assert both.metrics[model][name] == pytest.approx(alone.metrics[model][name], nan_ok=True)
            assert both.intervals[model][name] == pytest.approx(alone.intervals[model][name], nan_ok=True)
        assert both.metrics[model]["n_confidence"] == alone.metrics[model]["n_confidence"] > 0
        rest = [k for k in plain.metrics[model] if k not in calibration_metrics() and k != "n_confidence"]
        assert {k: both.metrics[model][k] for k in rest} == pytest.approx(
            {k: plain.metrics[model][k] for k in rest}, nan_ok=True
        )
        assert math.isnan(plain.metrics[model]["ece"])
    pd.testing.assert_frame_equal(both.calibration, alone.calibration)
    by_class = both.breakdown[(both.breakdown["group"] == "perturbation_class") & (both.breakdown["metric"] == "ece")]
    expected = alone.breakdown[
        (alone.breakdown["group"] == "perturbation_class") & (alone.breakdown["metric"] == "ece")
    ]
    assert by_class["estimate"].tolist() == pytest.approx(expected["estimate"].tolist(), nan_ok=True)
    assert both.calibration_source == "calibration pass" and alone.calibration_source == "responses"
    assert both.max_confidence == alone.max_confidence and alone.max_confidence["alpha"]["n"] == 24


@pytest.mark.usefixtures("prefect_harness")
def test_calibration_pass_is_its_own_and_feeds_ece(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_evaluation
    from refusalbench.tasks.refusalbench.report.run_outputs import build_report_for

    benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    fake_llm.responder = by_model({"sure": sure, "refuser": refuser, "judge": judge_by_reference})
    calibrated = tmp_path / "calibrated"
    run_evaluation(str(write_config(tmp_path, fake_llm.url, True)), benchmark, str(calibrated))

    targets = [c for c in fake_llm.calls if c["model"] in ("sure", "refuser")]
    calibration_calls = [c for c in targets if asks_confidence(c)]
    main_calls = [c for c in targets if not asks_confidence(c)]
    assert len(calibration_calls) == len(main_calls) == 2 * len(ITEMS)  # every item, both passes

    responses = pd.read_parquet(calibrated / "responses.parquet")
    assert responses["confidence"].isna().all()  # the main replies were never asked for one
    calibration = pd.read_parquet(calibrated / "calibration_responses.parquet")
    assert len(calibration) == 2 * len(ITEMS)
    assert set(calibration["confidence"]) == {"VERY_CONFIDENT", "UNCERTAIN"}
    judged = pd.read_parquet(calibrated / "calibration_judgments.parquet")
    assert len(judged) == 2 * len(ITEMS) and set(judged["confidence"]) == {"VERY_CONFIDENT", "UNCERTAIN"}

    document = json.loads((calibrated / "metrics.json").read_text())
    metrics = document["models"]
    # Headline metrics from the main pass: "sure" answers every answerable item right there.
    assert metrics["sure"]["answer_accuracy"] == 1.0
    # ECE from the calibration pass alone: 10 wrong answers at .95 -> |0 - 9.5| / 10; the refuser:
    # 10 refusals at .4, 3 with the right code (the missing-info items) -> |3 - 4| / 10.
    assert metrics["sure"]["ece"] == pytest.approx(0.95) and metrics["sure"]["ece_answer"] == pytest.approx(0.95)
    assert metrics["sure"]["ece_refusal"] is None
    assert metrics["refuser"]["ece"] == pytest.approx(0.1) and metrics["refuser"]["ece_refusal"] == pytest.approx(0.1)
    assert metrics["sure"]["n_confidence"] == metrics["refuser"]["n_confidence"] == len(ITEMS)
    calibration_block = document["calibration"]
    assert calibration_block["source"] == "calibration pass"
    assert calibration_block["models"]["sure"]["max_confidence_share"] == 1.0
    assert calibration_block["models"]["sure"]["max_confidence_accuracy"] == 0.0
    assert calibration_block["models"]["refuser"]["max_confidence_share"] == 0.0

    manifest = json.loads((calibrated / "manifest.json").read_text())
    assert {"respond", "judge", "calibrate"} <= set(manifest["timings_s"])
    assert manifest["counts"]["calibration_responses"] == 2 * len(ITEMS)
    # Its calls are charged to stage calibrate (targets and judge), the main ones to respond.
    by_stage = manifest["costs"]["by_stage"]
    assert {m: c["http_calls"] for m, c in by_stage["calibrate"]["by_model"].items() if m != "judge"} == {
        "sure": len(ITEMS),
        "refuser": len(ITEMS),
    }
    assert {m: c["http_calls"] for m, c in by_stage["respond"]["by_model"].items()} == {
        "sure": len(ITEMS),
        "refuser": len(ITEMS),
    }
    assert by_stage["calibrate"]["by_model"]["judge"]["http_calls"] > 0
    report = (calibrated / "report.html").read_text()
    assert "At maximum confidence" in report and "ECE for answers vs refusals" in report
    # `refusalbench report` rebuilds the page from the folder with the same calibration pass.
    (calibrated / "report.html").unlink()
    build_report_for(str(calibrated))
    assert "At maximum confidence" in (calibrated / "report.html").read_text()

    # The main requests are the plain prompt's, message for message: a run without confidence sends
    # the same (test_evaluation_flow's runs have no calibration call or file).
    by_question = {item.question: item for item in ITEMS}
    for call in main_calls:
        (item,) = [i for q, i in by_question.items() if q in call["messages"][-1]["content"]]
        assert call["messages"] == target_messages(item)
    assert len({request_hash(c) for c in main_calls}) == len(main_calls)
