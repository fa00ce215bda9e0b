"""The base-set pre-test (issue 14, part 2) and the per-generator balance (part 3).

Flow tests run on a real Prefect API against scripted models over HTTP: the pre-test keeps
exactly the items every scripted pre-test model answers correctly, and nothing else reaches
the benchmark.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, PretestRow
from refusalbench.tasks.refusalbench.stages.pretest import kept_items, summary_by_model, unperturbed_item
from refusalbench.tasks.refusalbench.stages.select import stratified_sample
from tests.scripted import (
    by_model,
    fenced,
    generator_reply,
    judge_by_reference,
    last_user_text,
    run_config,
    verifier_reply,
)

BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
    },
    {"id": "s2", "question": "Who founded the firm?", "answers": ["Ada Lee"], "context": "Ada Lee founded the firm."},
    {"id": "s3", "question": "Where is the mill?", "answers": ["Tarn"], "context": "The mill stands in Tarn."},
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
]
BY_QUESTION = {row["question"]: row for row in BASE}
MODELS = ["pre-a", "pre-b", "judge", "gen-a", "gen-b", "ver-a"]
# The pre-test models and the judge are priced, so their rows say what each call cost.
PRICED = {name: {"price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}} for name in ("pre-a", "pre-b", "judge")}


def write_config(tmp_path, url, *, pretest="{models: [pre-a, pre-b], judge: judge}", extra=""):
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in BASE))
    return run_config(
        tmp_path,
        url,
        MODELS,
        f"""
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [ver-a]
  seed: 3
  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]
  shard_size: 3
  pretest: {pretest}
{extra}
""",
        per_model=PRICED,
        max_attempts=2,
    )


def target(*, wrong=(), refuse=(), broken=()):
    """A scripted pre-test model: the reference answer, except wrong / refused / failing items."""

    def reply(request):
        (question,) = fenced(last_user_text(request), "question")
        item = BY_QUESTION[question]["id"]
        if item in broken:
            raise RuntimeError("scripted outage")  # the server answers 500: a call error after retries
        if item in refuse:
            return "REFUSE_INFO_MISSING_IN_CONTEXT"
        return "I am not sure, maybe 1900." if item in wrong else BY_QUESTION[question]["answers"][0]

    return reply


def script(fake_llm, **pre_b):
    fake_llm.responder = by_model(
        {
            "pre-a": target(refuse={"s3"} if pre_b.pop("a_refuses_s3", False) else ()),
            "pre-b": target(**pre_b),
            "judge": judge_by_reference,
            "gen-a": lambda req: generator_reply(req, "a"),
            "gen-b": lambda req: generator_reply(req, "b"),
            "ver-a": lambda req: verifier_reply("PASS"),
        }
    )


def run_generation(config, out):
    from refusalbench.flows.launch import run_generation

    return run_generation(str(config), str(out))


# ---------------------------------------------------------------- pure logic


def test_kept_needs_every_model_correct_and_a_missing_row_is_not_correct():
    rows = [
        PretestRow(item_id=i, model=m, variant="single", correct=ok)
        for i, m, ok in [("a", "x", True), ("a", "y", True), ("b", "x", True), ("b", "y", False), ("c", "x", True)]
    ]
    assert kept_items(["a", "b", "c"], rows, ["x", "y"]) == {"a"}
    failed = PretestRow(item_id="a", model="y", variant="single", correct=False, error="response failed: 500")
    assert summary_by_model([*rows, failed], ["x", "y"]) == {
        "x": {"correct": 3, "wrong": 0, "failed": 0},
        "y": {"correct": 1, "wrong": 1, "failed": 1},
    }


def test_unperturbed_item_is_the_base_item_as_an_answerable_item():
    item = unperturbed_item(BaseItem.model_validate(BASE[3]))
    assert item.item_id == "m1" and item.variant == "multi" and item.expected == "ANSWER_CORRECTLY"
    assert item.question == BASE[3]["question"] and item.passages == item.original_passages


# ---------------------------------------------------------------- pre-test in the generation flow


@pytest.mark.usefixtures("prefect_harness")
def test_generation_keeps_only_items_every_pretest_model_answers(tmp_path, fake_llm):
    script(fake_llm, wrong={"s2"}, a_refuses_s3=True)
    out = tmp_path / "run"
    result = run_generation(write_config(tmp_path, fake_llm.url), out)

    rows = pd.read_parquet(out / "pretest.parquet")
    assert len(rows) == len(BASE) * 2  # items x pre-test models
    assert set(rows.columns) >= {"item_id", "model", "answer", "decision", "score", "correct", "kept", "error"}
    # Every row says what it came to and what its calls cost: the answer's always, the judge's where it judged.
    assert set(rows.outcome) == {"ok"} and (rows.cost_usd > 0).all()
    tokens = {m: fake_llm.billed(m) for m in ("pre-a", "pre-b")}
    for model, billed in tokens.items():
        expected = (billed["prompt_tokens"] * 1.0 + billed["completion_tokens"] * 2.0) / 1e6
        assert rows[rows.model == model].cost_usd.sum() == pytest.approx(expected)
    kept = set(rows.loc[rows.kept, "item_id"])
    assert kept == {"s1", "m1"}  # pre-b gets s2 wrong, pre-a refuses s3
    wrong = rows[(rows.item_id == "s2") & (rows.model == "pre-b")].iloc[0]
    assert not wrong.correct and wrong.score == 1 and wrong.decision == "ANSWER"
    multi = rows[rows.item_id == "m1"]
    assert multi.correct.all() and set(multi.score) == {1}  # RAF = 1
    refused = rows[(rows.item_id == "s3") & (rows.model == "pre-a")].iloc[0]
    assert refused.decision == "REFUSE_INFO_MISSING_IN_CONTEXT" and not refused.correct and pd.isna(refused.score)
    assert pd.isna(refused.judge_cost_usd)  # no judge call
    assert (rows.drop(refused.name).judge_cost_usd > 0).all()
    # Every answer goes to the judge except the refusal, which needs no call.
    assert len(fake_llm.calls_for("pre-a")) == len(fake_llm.calls_for("pre-b")) == 4
    # Identical judge requests (two models, same answer) are sent once: 5 distinct answers of 7.
    assert len(fake_llm.calls_for("judge")) == 5

    # Nothing of a dropped item reaches generation, let alone the benchmark.
    assert set(pd.read_parquet(out / "base_items.parquet").id) == {"s1", "m1"}
    assert set(pd.read_parquet(out / "candidates.parquet").base_id) == {"s1", "m1"}
    bench = pd.read_parquet(out / "benchmark.parquet")
    assert result.sampled == len(bench) > 0 and set(bench.base_id) <= {"s1", "m1"}

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["counts"]["base_set_funnel"] == {"imported": 4, "pretested": 4, "kept": 2, "sampled": 2}
    assert manifest["counts"]["pretest_by_model"]["pre-b"] == {"correct": 3, "wrong": 1, "failed": 0}
    assert "pretest" in manifest["timings_s"] and "pretest.parquet" in manifest["artifacts"]

    # Same config again, new folder: every call comes from the call cache.
    sent = len(fake_llm.calls)
    run_generation(write_config(tmp_path, fake_llm.url), tmp_path / "run2")
    assert len(fake_llm.calls) == sent
    again = json.loads((tmp_path / "run2" / "manifest.json").read_text())
    assert again["counts"]["base_set_funnel"] == manifest["counts"]["base_set_funnel"]


@pytest.mark.usefixtures("prefect_harness")
def test_base_sample_is_drawn_from_the_kept_items(tmp_path, fake_llm):
    script(fake_llm, wrong={"s1"})
    out = tmp_path / "run"
    run_generation(write_config(tmp_path, fake_llm.url, extra="  base_sample: 2"), out)
    funnel = json.loads((out / "manifest.json").read_text())["counts"]["base_set_funnel"]
    assert funnel == {"imported": 4, "pretested": 4, "kept": 3, "sampled": 2}
    drawn = set(pd.read_parquet(out / "base_items.parquet").id)
    assert len(drawn) == 2 and drawn <= {"s2", "s3", "m1"}


@pytest.mark.usefixtures("prefect_harness")
def test_a_failed_pretest_call_drops_the_item_and_says_why(tmp_path, fake_llm):
    script(fake_llm, broken={"s3"})
    out = tmp_path / "run"
    run_generation(write_config(tmp_path, fake_llm.url), out)
    rows = pd.read_parquet(out / "pretest.parquet")
    failed = rows[rows.error.notna()]
    assert list(zip(failed.item_id, failed.model)) == [("s3", "pre-b")]
    assert failed.error.iloc[0].startswith("response failed") and not failed.kept.iloc[0]
    assert failed.outcome.iloc[0] == "call_error" and pd.isna(failed.cost_usd.iloc[0])  # a failed call bills nothing
    assert set(rows.drop(failed.index).outcome) == {"ok"}
    assert set(rows.loc[rows.kept, "item_id"]) == {"s1", "s2", "m1"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["pretest_by_model"]["pre-b"]["failed"] == 1
    assert any("pre-test answer(s) failed" in note for note in manifest["notes"])


# ---------------------------------------------------------------- the standalone pre-test


@pytest.mark.usefixtures("prefect_harness")
def test_standalone_pretest_then_generation_pays_nothing_twice(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_pretest

    script(fake_llm, wrong={"m1"})
    config = write_config(tmp_path, fake_llm.url, extra="  base_sample: 2")
    result = run_pretest(str(config), str(tmp_path / "pre"))
    assert sorted(result.kept) == ["s1", "s2", "s3"]
    assert result.funnel == {"imported": 4, "pretested": 4, "kept": 3, "sampled": 2}
    manifest = json.loads((tmp_path / "pre" / "manifest.json").read_text())
    assert manifest["kind"] == "pretest" and manifest["status"] == "completed"
    assert len(pd.read_parquet(tmp_path / "pre" / "pretest.parquet")) == 8
    assert not (tmp_path / "pre" / "candidates.parquet").exists()

    pretest_calls = sum(len(fake_llm.calls_for(m)) for m in ("pre-a", "pre-b", "judge"))
    run_generation(config, tmp_path / "gen")
    assert sum(len(fake_llm.calls_for(m)) for m in ("pre-a", "pre-b", "judge")) == pretest_calls
    assert set(pd.read_parquet(tmp_path / "gen" / "base_items.parquet").id) <= set(result.kept)


def test_standalone_pretest_needs_a_pretest_section(tmp_path):
    from refusalbench.flows.launch import run_pretest
    from refusalbench.tasks.core.errors import InputError

    config = write_config(tmp_path, "http://127.0.0.1:9/v1", pretest="null")
    with pytest.raises(InputError, match="generation.pretest"):
        run_pretest(str(config), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- balance: generator


def candidates(counts: dict[tuple[str, str, str], int]) -> list[Candidate]:
    """``counts[(class, intensity, generator)]`` accepted candidates."""
    out = []
    for (cls, intensity, generator), n in counts.items():
        for k in range(n):
            out.append(
                Candidate(
                    candidate_id=f"{cls}-{intensity}-{generator}-{k}",
                    assignment_id="a",
                    base_id=f"b{k}",
                    lever_id="l",
                    perturbation_class=cls,
                    intensity=intensity,
                    variant="single",
                    generator=generator,
                    status="ok",
                    expected="x",
                    prompt_hash="h",
                )
            )
    return out


AMB, MISS = ("P-Ambiguity", "LOW"), ("P-MissingInfo", "HIGH")


def per_stratum_generator(sample: list[Candidate]) -> Counter:
    return Counter((c.perturbation_class, c.intensity, c.generator) for c in sample)


def test_generator_balance_takes_equal_counts_per_generator_in_every_stratum():
    pool = candidates(
        {(*AMB, "g1"): 9, (*AMB, "g2"): 5, (*AMB, "g3"): 7, (*MISS, "g1"): 6, (*MISS, "g2"): 8, (*MISS, "g3"): 6}
    )
    sample, shortfalls = stratified_sample(
        pool, 24, seed=1, strata=[AMB, MISS], balance="generator", generators=["g1", "g2", "g3"]
    )
    # 24 = 3 generators x 8, spread over 2 strata: 4 per generator per stratum.
    assert set(per_stratum_generator(sample).values()) == {4} and len(per_stratum_generator(sample)) == 6
    assert shortfalls == {}
    # The natural sample of the same pool fills each stratum round robin: not equal per generator here.
    natural, _ = stratified_sample(pool, 36, seed=1, strata=[AMB, MISS])
    assert len(set(per_stratum_generator(natural).values())) > 1
    # Deterministic by seed.
    again, _ = stratified_sample(
        pool, 24, seed=1, strata=[AMB, MISS], balance="generator", generators=["g1", "g2", "g3"]
    )
    assert [c.candidate_id for c in again] == [c.candidate_id for c in sample]


def test_generator_balance_reports_the_short_generator_and_keeps_counts_equal():
    pool = candidates({(*AMB, "g1"): 9, (*AMB, "g2"): 2, (*MISS, "g1"): 6, (*MISS, "g2"): 6})
    # g3 is one of the run's generators but had nothing accepted in either stratum.
    sample, shortfalls = stratified_sample(
        pool, 16, seed=0, strata=[AMB, MISS], balance="generator", generators=["g1", "g2"]
    )
    counts = per_stratum_generator(sample)
    assert counts[(*AMB, "g1")] == counts[(*AMB, "g2")] == 2  # share 4, g2 has 2: both give 2
    assert counts[(*MISS, "g1")] == counts[(*MISS, "g2")] == 4
    assert shortfalls == {
        "P-Ambiguity/LOW": {"wanted": 8, "got": 4, "generators": {"g2": {"wanted": 4, "accepted": 2}}}
    }
    _, missing = stratified_sample(
        pool, 18, seed=0, strata=[AMB, MISS], balance="generator", generators=["g1", "g2", "g3"]
    )
    assert missing["P-MissingInfo/HIGH"]["got"] == 0
    assert missing["P-MissingInfo/HIGH"]["generators"] == {"g3": {"wanted": 3, "accepted": 0}}


def test_generator_balance_without_a_target_takes_the_poorest_generators_count():
    pool = candidates({(*AMB, "g1"): 5, (*AMB, "g2"): 3, (*MISS, "g1"): 2, (*MISS, "g2"): 4})
    sample, shortfalls = stratified_sample(
        pool, None, seed=0, strata=[AMB, MISS], balance="generator", generators=["g1", "g2"]
    )
    counts = per_stratum_generator(sample)
    assert counts == Counter({(*AMB, "g1"): 3, (*AMB, "g2"): 3, (*MISS, "g1"): 2, (*MISS, "g2"): 2})
    assert shortfalls == {}


def test_report_shows_the_base_set_funnel_and_the_pretest_per_model():
    from refusalbench.tasks.refusalbench.report import ReportInputs, build_report

    counts = {
        "base_set_funnel": {"imported": 4, "pretested": 4, "kept": 2, "sampled": 2},
        "pretest_by_model": {"pre-<b>": {"correct": 3, "wrong": 1, "failed": 0}},
    }
    html = build_report(ReportInputs(metrics={}, manifest={"counts": counts}))
    assert "<h2>Base set</h2>" in html and "pretested" in html and "pre-&lt;b&gt;" in html
    # An evaluation's own manifest has no funnel: the generation's counts are given beside it.
    html = build_report(ReportInputs(metrics={}, manifest={"counts": {}}, generation_counts=counts))
    assert "<h2>Base set</h2>" in html
    assert "<h2>Base set</h2>" not in build_report(ReportInputs(metrics={}, manifest={"counts": {}}))
