"""End-to-end evaluation flow against scripted targets and a scripted judge; exact metrics."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Passage
from tests.scripted import by_model, fenced, judge_by_reference, last_user_text

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _item(i: int, intensity: str, expected: str, cls: str = "P-MissingInfo", multi: bool = False) -> BenchmarkItem:
    answer = f"ref{i}"
    return BenchmarkItem(
        item_id=f"item{i}",
        base_id=f"b{i}",
        variant="multi" if multi else "single",
        perturbation_class=cls,
        intensity=intensity,
        lever_id=f"lever-{intensity.lower()}",
        generator="gen-a",
        question=f"What is item {i}?",
        context=None if multi else f"The answer is {answer}.",
        passages=[Passage(text=f"The answer is {answer}.", relevant=True), Passage(text="Noise.", relevant=False)]
        if multi
        else None,
        original_question="q",
        answers=[answer],
        expected=expected,
        domain="science" if i % 2 else "health",
    )


ITEMS = (
    [_item(i, "LOW", "ANSWER_CORRECTLY") for i in range(3)]
    + [_item(3, "LOW", "ANSWER_CORRECTLY", multi=True)]
    + [_item(i, "MEDIUM", "REFUSE_INFO_MISSING_IN_CONTEXT") for i in range(4, 7)]
    + [_item(i, "HIGH", "REFUSE_AMBIGUOUS_QUERY", cls="P-Ambiguity") for i in range(7, 10)]
)  # 4 answerable, 6 unanswerable (3 missing-info, 3 ambiguous)


def oracle(request):
    text = last_user_text(request)
    blocks = fenced(text, "context") + fenced(text, "passage")
    match = re.search(r"The answer is (\w+)", " ".join(blocks))
    return f"It is {match.group(1)}." if match else "unknown"


def write_config(tmp_path, url, targets):
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {url}\n    max_attempts: 2"
        for n in ["refuser", "answerer", "oracle", "late", "judge"]
    )
    config = tmp_path / "eval.yaml"
    config.write_text(f"""
models:
{models}
cache:
  path: {tmp_path / "calls.sqlite"}
evaluation:
  targets: [{", ".join(targets)}]
  judge: judge
  bootstrap: 200
  shard_size: 4
""")
    return config


@pytest.fixture
def benchmark(tmp_path):
    store = ArtifactStore(tmp_path / "bench")
    return store.write_records("benchmark.parquet", ITEMS, BenchmarkItem)


def test_metrics_of_scripted_targets(tmp_path, fake_llm, benchmark):
    from refusalbench.flows.launch import run_evaluation

    fake_llm.responder = by_model(
        {
            "refuser": lambda req: "I cannot answer: **REFUSE_MISSING**",
            "answerer": lambda req: "I believe it is something.",
            "oracle": oracle,
            "judge": judge_by_reference,
        }
    )
    out = tmp_path / "eval"
    result = run_evaluation(
        str(write_config(tmp_path, fake_llm.url, ["refuser", "answerer", "oracle"])), benchmark, str(out)
    )
    metrics = json.loads((out / "metrics.json").read_text())["models"]

    refuser = metrics["refuser"]
    # Refuses all 10: FRR 4/4, refusal accuracy 3/6 (only the missing-info ones have the right code).
    assert refuser["answer_accuracy"] == 0.0
    assert refuser["false_refusal_rate"] == 1.0
    assert refuser["refusal_accuracy"] == pytest.approx(3 / 6)
    assert refuser["missed_refusal_rate"] == 0.0
    assert refuser["refusal_rate"] == 1.0
    assert refuser["detection_precision"] == pytest.approx(6 / 10)
    assert refuser["detection_recall"] == 1.0
    assert refuser["detection_f1"] == pytest.approx(2 * 0.6 / 1.6)
    assert refuser["category_accuracy"] == pytest.approx(3 / 6)
    assert refuser["calibrated_refusal_score"] == pytest.approx(0.25)
    assert refuser["ece"] is None  # no confidences: undefined, written as null

    answerer = metrics["answerer"]
    # Answers everything, wrongly: the judge gives quality 1.
    assert answerer["answer_accuracy"] == 0.0
    assert answerer["refusal_accuracy"] == 0.0
    assert answerer["missed_refusal_rate"] == 1.0
    assert answerer["refusal_rate"] == 0.0
    assert answerer["detection_precision"] is None  # nothing refused
    assert answerer["category_accuracy"] is None

    oracle_m = metrics["oracle"]
    # Answers the reference everywhere: all answerable correct, every unanswerable missed.
    assert oracle_m["answer_accuracy"] == 1.0
    assert oracle_m["false_refusal_rate"] == 0.0
    assert oracle_m["missed_refusal_rate"] == 1.0
    assert oracle_m["calibrated_refusal_score"] == pytest.approx(0.5)

    judgments = pd.read_parquet(out / "judgments.parquet")
    assert len(judgments) == 30
    # The judge classifies every reply that is not only a refusal code (decision: judge): the refuser's
    # codes come with prose, so all 10 replies of each of the three targets.
    assert len(fake_llm.calls_for("judge")) == 30
    assert judgments.loc[(judgments.model == "oracle") & (judgments.item_id == "item3"), "raf"].item() == 1
    report = (out / "report.html").read_text()
    assert all(name in report for name in ("refuser", "answerer", "oracle"))
    assert result.responses == 30

    # Adding a target computes only the new target.
    before = len(fake_llm.calls)
    fake_llm.responder = by_model(
        {
            "refuser": lambda req: "REFUSE_AMBIGUOUS",
            "answerer": lambda req: "x",
            "oracle": oracle,
            "late": oracle,
            "judge": judge_by_reference,
        }
    )
    run_evaluation(
        str(write_config(tmp_path, fake_llm.url, ["refuser", "answerer", "oracle", "late"])), benchmark, str(out)
    )
    new_calls = fake_llm.calls[before:]
    # Only the new target is called: its 4 judge requests are identical to the oracle's (same
    # item, same reply), so the call cache serves them.
    assert {c["model"] for c in new_calls} == {"late"}
    assert len(new_calls) == 10
    assert json.loads((out / "metrics.json").read_text())["models"]["late"]["answer_accuracy"] == 1.0
    assert json.loads((out / "metrics.json").read_text())["models"]["refuser"] == refuser


def test_failed_calls_are_recorded_not_dropped(tmp_path, fake_llm, benchmark):
    from refusalbench.flows.launch import run_evaluation

    def refuser(req):
        if "What is item 0?" in last_user_text(req):
            raise RuntimeError("scripted outage")  # the server answers 500 to every attempt
        return "REFUSE_MISSING"

    fake_llm.responder = by_model({"refuser": refuser, "judge": judge_by_reference})
    out = tmp_path / "eval"
    run_evaluation(str(write_config(tmp_path, fake_llm.url, ["refuser"])), benchmark, str(out))
    responses = pd.read_parquet(out / "responses.parquet")
    assert len(responses) == 10
    assert responses["error"].notna().sum() == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["excluded_from_metrics"] == {"refuser": 1}
    assert manifest["counts"]["response_errors"] == {"refuser": 1}
    # confidence is off: no calibration pass, no call of its own (10 target calls in all)
    assert not (out / "calibration_responses.parquet").exists() and "calibrate" not in manifest["timings_s"]
    assert len(fake_llm.calls_for("refuser")) == 9 + 2  # 9 items once, the outage's item twice (max_attempts 2)


def test_stage_timings_are_the_stages_own(tmp_path, fake_llm, benchmark):
    """Responding takes time: the manifest says so under respond, not under judge."""
    from refusalbench.flows.launch import run_evaluation

    fake_llm.latency_s = 0.5  # every reply of the scripted server takes half a second
    fake_llm.responder = by_model({"refuser": lambda req: "REFUSE_MISSING", "judge": judge_by_reference})
    out = tmp_path / "eval"
    run_evaluation(str(write_config(tmp_path, fake_llm.url, ["refuser"])), benchmark, str(out))
    timings = json.loads((out / "manifest.json").read_text())["timings_s"]
    # The refuser is never judged (no answer to judge), so judging is quick and responding is not.
    assert timings["respond"] >= 0.5
    assert timings["judge"] < timings["respond"]
    assert {"score", "report"} <= set(timings)


def test_the_judge_calls_go_out_as_the_replies_come_in(tmp_path, fake_llm, benchmark):
    """The respond task starts the judge's call for each reply to judge as it arrives; the judge task gets
    those calls' results: each judge call sent once, before the shard's last reply, counted as the judge's
    own (no cache hit, ``judge_cached`` false), and nothing sent again on a re-run."""
    from refusalbench.flows.launch import run_evaluation

    fake_llm.latency_s = 0.3
    fake_llm.responder = by_model({"oracle": oracle, "judge": judge_by_reference})
    config = tmp_path / "ahead.yaml"
    config.write_text(
        write_config(tmp_path, fake_llm.url, ["oracle"])
        .read_text()
        .replace("shard_size: 4", "shard_size: 10")
        .replace("max_attempts: 2", "max_attempts: 2\n    max_concurrency: 2")
    )
    out = tmp_path / "eval"
    run_evaluation(str(config), benchmark, str(out))

    judged = [c for c in fake_llm.calls if c["model"] == "judge"]
    target = [c for c in fake_llm.calls if c["model"] == "oracle"]
    # The oracle answers all 10 items in one shard (5 rounds at 2 at once): the judge is not asked to
    # wait for the shard's end; the oracle's prose replies are all judged, each once.
    assert len(target) == 10 and len(judged) == 10
    assert len({c["fingerprint"] for c in judged}) == 10
    assert min(c["time"] for c in judged) < max(c["time"] for c in target)
    judgments = pd.read_parquet(out / "judgments.parquet")
    assert len(judgments) == 10 and not judgments["judge_cached"].any() and judgments["error"].isna().all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calls"]["judge"]["http_calls"] == 10 and manifest["calls"]["judge"].get("cache_hits", 0) == 0
    assert set(manifest["costs"]["by_stage"]) == {"respond", "judge"}  # the judge's calls counted for its stage

    sent = len(fake_llm.calls)
    run_evaluation(str(config), benchmark, str(tmp_path / "again"))
    assert len(fake_llm.calls) == sent
