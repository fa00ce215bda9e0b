"""End-to-end generation flow on a real Prefect API against scripted models over HTTP."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.scripted import by_model, generator_reply, intensity_of, run_config, verifier_reply

pytestmark = pytest.mark.usefixtures("prefect_harness")

BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
        "domain": "history",
    },
    {
        "id": "s2",
        "question": "Who founded the firm?",
        "answers": ["Ada Lee"],
        "context": "Ada Lee founded the firm.",
        "domain": "business",
    },
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "domain": "health",
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
]


def write_config(tmp_path, url, *, verifiers, filter_rule="unanimous", extra=""):
    base = tmp_path / "base.jsonl"
    base.write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    return run_config(
        tmp_path,
        url,
        ["gen-a", "gen-b", "ver-a", "ver-b", "ver-c"],
        f"""
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [{", ".join(verifiers)}]
  filter: {filter_rule}
  seed: 7
  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]
  shard_size: 4
{extra}
""",
        max_concurrency=4,
        max_attempts=2,
    )


def scripted(fake_llm, *, ver_b_fails_high_of_gen_a=True, ver_b_always_fails=False):
    def gen_b(req):
        # gen-b garbles every multi-document item: a parse failure that must be counted.
        return "sorry, cannot do JSON" if "<passage" in json.dumps(req["messages"]) else generator_reply(req, "b")

    def ver_b(req):
        if ver_b_always_fails:
            return verifier_reply("FAIL")
        text = json.dumps(req["messages"])
        if ver_b_fails_high_of_gen_a and intensity_of(req) == "HIGH" and " question a?" in text:
            return verifier_reply("FAIL")
        return verifier_reply("PASS")

    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "gen-b": gen_b,
            "ver-a": lambda req: verifier_reply("PASS"),
            "ver-b": ver_b,
            "ver-c": lambda req: verifier_reply("PASS"),
        }
    )


def run(config, out):
    from refusalbench.flows.launch import run_generation

    return run_generation(str(config), str(out))


def test_unanimous_counts(tmp_path, fake_llm):
    scripted(fake_llm)
    out = tmp_path / "run"
    result = run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b"]), out)
    # 3 items x 2 strata = 6 assignments; x 2 generators = 12 candidates.
    candidates = pd.read_parquet(out / "candidates.parquet")
    assert len(candidates) == 12
    # gen-b fails on the one multi item in both strata: 2 parse errors, counted not dropped.
    assert candidates["status"].value_counts().to_dict() == {"ok": 10, "parse_error": 2}
    assert candidates.loc[candidates.status == "parse_error", "raw"].eq("sorry, cannot do JSON").all()
    verifications = pd.read_parquet(out / "verifications.parquet")
    assert len(verifications) == 10 * 2  # every verifier x every parsed candidate
    # ver-b fails gen-a's HIGH candidates: 3 items (2 single + 1 multi) in the HIGH stratum.
    assert (verifications.verdict == "FAIL").sum() == 3
    assert result.accepted == 7
    bench = pd.read_parquet(out / "benchmark.parquet")
    assert len(bench) == 7
    assert set(bench.expected) == {"ANSWER_CORRECTLY", "REFUSE_INFO_MISSING_IN_CONTEXT"}
    assert {
        "item_id",
        "base_id",
        "variant",
        "perturbation_class",
        "intensity",
        "lever_id",
        "generator",
        "question",
        "context",
        "passages",
        "original_question",
        "original_context",
        "original_passages",
        "answers",
        "expected",
        "domain",
    } <= set(bench.columns)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["counts"]["candidates_by_status"] == {"ok": 10, "parse_error": 2, "call_error": 0}
    assert manifest["catalogue_hash"] and "generator_single.j2" in manifest["prompt_hashes"]
    gv = json.loads((out / "gv_analysis.json").read_text())
    assert gv["funnel"] == {
        "attempted": 12,
        "parsed": 10,
        "prechecked": 10,
        "verified": 10,
        "accepted": 7,
        "sampled": 7,
    }
    # gen-a: 6 parsed candidates; ver-b passes 3 of them (fails the 3 HIGH ones); ver-a passes all.
    assert gv["pass_rate_matrix"]["gen-a"]["ver-b"] == pytest.approx(3 / 6)
    assert gv["pass_rate_matrix"]["gen-a"]["ver-a"] == 1.0
    assert gv["pass_rate_matrix"]["gen-b"]["ver-b"] == 1.0
    # The matched set (paper §4.2 RQ1): all 6 assignments, and gen-b's 2 parse errors count as FAIL there.
    matched = gv["matched_set"]
    assert (matched["assignments"], matched["matched_assignments"]) == (6, 6)
    assert matched["by_generator"]["gen-b"] == {"candidates": 6, "unparsed": 2, "precheck_rejects": 0}
    assert matched["pass_rate_matrix"]["gen-b"] == {"ver-a": pytest.approx(4 / 6), "ver-b": pytest.approx(4 / 6)}
    # ver-a always passes: no variance, kappa undefined with a reason.
    (kappa,) = gv["verifier_kappa"]
    assert kappa["kappa"] is None and "no variance" in kappa["reason"]

    # A second run with the same config sends no request at all.
    sent = len(fake_llm.calls)
    run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b"]), tmp_path / "run2")
    assert len(fake_llm.calls) == sent
    assert len(pd.read_parquet(tmp_path / "run2" / "benchmark.parquet")) == 7


def test_majority_accepts_two_of_three(tmp_path, fake_llm):
    scripted(fake_llm)
    out = tmp_path / "run"
    result = run(
        write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b", "ver-c"], filter_rule="majority"), out
    )
    assert result.accepted == 10  # the 3 gen-a HIGH candidates pass 2 of 3
    assert len(pd.read_parquet(out / "verifications.parquet")) == 30


def test_verifier_that_always_fails_gives_an_empty_benchmark(tmp_path, fake_llm):
    scripted(fake_llm, ver_b_always_fails=True)
    out = tmp_path / "run"
    result = run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b"]), out)
    assert result.accepted == 0 and result.sampled == 0
    assert len(pd.read_parquet(out / "benchmark.parquet")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert set(manifest["counts"]["shortfalls"]) == {"P-Ambiguity/LOW", "P-MissingInfo/HIGH"}


def test_filter_none_keeps_every_prechecked_candidate_and_says_so(tmp_path, fake_llm):
    scripted(fake_llm, ver_b_always_fails=True)
    out = tmp_path / "run"
    result = run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b"], filter_rule="none"), out)
    # Every parsed candidate is kept (gen-b's garbled multi-document replies are not), though ver-b failed them all.
    candidates = pd.read_parquet(out / "candidates.parquet")
    assert result.accepted == (candidates.status == "ok").sum() == 10
    assert (pd.read_parquet(out / "verifications.parquet").query("verifier == 'ver-b'").verdict == "FAIL").all()
    decisions = json.loads((out / "filter_decisions.json").read_text())
    reasons = {
        d["reason"] for d in (decisions["decisions"] if isinstance(decisions, dict) else decisions) if d["accepted"]
    }
    assert reasons == {"no filter (verdicts recorded only: 1 PASS, 1 FAIL)"}
    assert "Not a verified benchmark" in (out / "report.html").read_text()


def test_short_circuit_skips_later_verifiers(tmp_path, fake_llm):
    scripted(fake_llm, ver_b_always_fails=True)
    out = tmp_path / "run"
    run(write_config(tmp_path, fake_llm.url, verifiers=["ver-b", "ver-a"], extra="  verification: short_circuit"), out)
    verifications = pd.read_parquet(out / "verifications.parquet")
    assert (verifications.verdict == "SKIPPED").sum() == 10
    assert len(fake_llm.calls_for("ver-a")) == 0


def test_generator_balance_gives_every_generator_the_same_count_per_stratum(tmp_path, fake_llm):
    scripted(fake_llm)
    out = tmp_path / "run"
    extra = "  balance: generator\n  target_size: 12"
    run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a"], extra=extra), out)
    bench = pd.read_parquet(out / "benchmark.parquet")
    # 12 = 2 generators x 6, i.e. 3 per generator per stratum; gen-b garbles the multi item,
    # so it has only 2 in each stratum, and gen-a gives 2 there as well.
    counts = bench.groupby(["perturbation_class", "intensity", "generator"]).size()
    assert len(counts) == 4 and set(counts) == {2}
    manifest = json.loads((out / "manifest.json").read_text())
    short = manifest["counts"]["shortfalls"]
    assert set(short) == {"P-Ambiguity/LOW", "P-MissingInfo/HIGH"}
    assert all(
        s == {"wanted": 6, "got": 4, "generators": {"gen-b": {"wanted": 3, "accepted": 2}}} for s in short.values()
    )
    assert any("per generator" in note for note in manifest["notes"])


def test_the_generation_report_shows_the_runs_calls(tmp_path, fake_llm):
    """The generation-only report is written after the manifest has the run's call counts."""
    scripted(fake_llm)
    out = tmp_path / "run"
    run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a"]), out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {model: stats["http_calls"] for model, stats in manifest["calls"].items()} == {
        model: len(fake_llm.calls_for(model)) for model in ("gen-a", "gen-b", "ver-a")
    }
    report = (out / "report.html").read_text()
    metadata = report[report.index("<h3>Model calls</h3>") :]  # the manifest's "calls", headed in words
    assert "http_calls" in metadata.split("<h3>")[1], "the report's run metadata has no call counts"
