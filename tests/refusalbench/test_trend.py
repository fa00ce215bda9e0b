"""The trend across refresh rounds flags change, not noise (issue 26, part 6): two-sample comparisons,
Benjamini-Hochberg across models x metrics, incomplete rounds listed; the per-model plot."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from refusalbench.tasks.core.charts import specs_in
from refusalbench.tasks.core.stats import MIN_CLUSTERS
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.report.trend_section import round_label, trend_plot, trend_section
from refusalbench.tasks.refusalbench.rounds.trend import (
    HEADLINE_METRIC,
    MIN_SUPPORT,
    changes_markdown,
    collect_trend,
    compare_rounds,
    flags,
    readable_trend,
    round_error,
    round_rows,
    save_trend,
)
from refusalbench.tasks.refusalbench.schema.json_files import TrendDocument

FDR = 0.05
PER_CLASS = 150  # answerable and unanswerable items per round: a 300-item weekly round


def simulated_metrics(rng: np.random.Generator, truths: dict[str, tuple[float, float]]) -> dict:
    """metrics.json of one round: per model, binomial samples of its true answer and refusal accuracy.

    Answerable items: answered correctly (rate a), refused (0.15), answered wrong; unanswerable items:
    refused with the right code (rate r), answered (0.2), wrong code. Standard errors and 95% intervals
    are the binomial ones, as the bootstrap of metrics.json gives them.
    """
    models, intervals, errors, counts = {}, {}, {}, {}
    for model, (answer, refusal) in truths.items():
        answerable = rng.multinomial(PER_CLASS, [answer, 0.15, 0.85 - answer])
        unanswerable = rng.multinomial(PER_CLASS, [refusal, 0.2, 0.8 - refusal])
        values = {
            "answer_accuracy": answerable[0] / PER_CLASS,
            "false_refusal_rate": answerable[1] / PER_CLASS,
            "refusal_accuracy": unanswerable[0] / PER_CLASS,
            "missed_refusal_rate": unanswerable[1] / PER_CLASS,
        }
        se = {name: math.sqrt(v * (1 - v) / PER_CLASS) for name, v in values.items()}
        values[HEADLINE_METRIC] = (values["answer_accuracy"] + values["refusal_accuracy"]) / 2
        se[HEADLINE_METRIC] = 0.5 * math.hypot(se["answer_accuracy"], se["refusal_accuracy"])
        models[model], errors[model] = values, se
        intervals[model] = {name: [v - 1.96 * se[name], v + 1.96 * se[name]] for name, v in values.items()}
        counts[model] = {"n": 2 * PER_CLASS}
    return {"models": models, "intervals": intervals, "standard_errors": errors, "counts": counts}


def simulate(
    seed: int, rounds: int = 20, models: int = 30, improver: str | None = None, improve_at: int = 10
) -> list[pd.DataFrame]:
    """The comparisons each refresh round makes (rounds 2..``rounds``), with ``models`` models whose true
    rates never change; ``improver`` (one more model) gains 20 points in both accuracies at round
    ``improve_at``."""
    rng = np.random.default_rng(seed)
    truths = {f"model-{i:02d}": (rng.uniform(0.3, 0.6), rng.uniform(0.3, 0.6)) for i in range(models)}
    rows: list[dict] = []
    made = []
    for t in range(rounds):
        if improver is not None:
            truths[improver] = (0.3, 0.4) if t < improve_at else (0.5, 0.6)
        rows += round_rows(f"round-{t:03d}", simulated_metrics(rng, truths))
        if t:
            made.append(compare_rounds(pd.DataFrame(rows), FDR))
    return made


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def test_thirty_steady_models_over_twenty_rounds_flag_within_the_fdr():
    made = simulate(seed=2026)
    assert len(made) == 19 and all(len(c) == 30 * 6 for c in made)
    # Every flag here is a false discovery, so a round's false-discovery proportion is 1 when it flags
    # anything and 0 otherwise, and the share of rounds that flag anything estimates the FDR, which
    # Benjamini-Hochberg keeps at FDR. 19 rounds estimate it up to binomial noise: allow the counts that
    # a rate of FDR produces with probability 95% (0 to 3 rounds of 19).
    rounds_flagging = sum(bool(c["significant"].any()) for c in made)
    allowed = next(k for k in range(20) if binomial_tail(k + 1, len(made), FDR) < 0.05)
    assert allowed == 3 and rounds_flagging <= allowed
    defined = sum(c["p_value"].notna().sum() for c in made)
    assert sum(c["significant"].sum() for c in made) / defined <= FDR / 10  # per model x metric: rarer still
    # The old rule (the new estimate outside the previous round's 95% interval) flags noise in nearly every
    # round: about 17% of comparisons, dozens of the 150 defined ones per round.
    outside = [
        ((c["latest"] < c["previous_interval"].str[0]) | (c["latest"] > c["previous_interval"].str[1])).sum()
        for c in made
    ]
    assert min(outside) >= 5
    # Uncorrected two-sample tests would still flag a few per round; BH keeps it to none.
    assert sum((c["p_value"] < 0.05).sum() for c in made) > 19


def test_a_model_that_improves_by_twenty_points_is_flagged():
    made = simulate(seed=7, improver="improver", improve_at=10)
    at_change = made[9]  # round 10 against round 9
    flagged = at_change[at_change["significant"]]
    assert set(flagged["model"]) == {"improver"}
    crs = flagged.set_index("metric").loc[HEADLINE_METRIC]
    assert crs["direction"] == "up" and crs["better"] is True and crs["difference_low"] > 0
    assert 0.1 < crs["difference"] < 0.3 and crs["adjusted_p_value"] <= FDR
    # Before and after the step it is as steady as the others.
    assert not any(c[c["model"] == "improver"]["significant"].any() for i, c in enumerate(made) if i != 9)


def test_comparison_of_two_rounds_by_hand():
    rows = pd.DataFrame(
        [
            {"round": "r1", "model": "a", HEADLINE_METRIC: 0.50, f"{HEADLINE_METRIC}_se": 0.02},
            {"round": "r2", "model": "a", HEADLINE_METRIC: 0.60, f"{HEADLINE_METRIC}_se": 0.02},
            {
                "round": "r1",
                "model": "b",
                HEADLINE_METRIC: 0.50,
                f"{HEADLINE_METRIC}_ci_low": 0.40,
                f"{HEADLINE_METRIC}_ci_high": 0.60,
            },  # no standard error: the interval's half-width / 1.96
            {"round": "r2", "model": "b", HEADLINE_METRIC: 0.55, f"{HEADLINE_METRIC}_se": 0.05},
            {"round": "r2", "model": "new", HEADLINE_METRIC: 0.9, f"{HEADLINE_METRIC}_se": 0.01},  # no previous round
        ]
    )
    table = compare_rounds(rows, FDR, metrics=(HEADLINE_METRIC,)).set_index("model")
    assert list(table.index) == ["a", "b"]
    a, b = table.loc["a"], table.loc["b"]
    assert a["difference"] == pytest.approx(0.1)
    half = 1.959964 * math.sqrt(2) * 0.02
    assert (a["difference_low"], a["difference_high"]) == (
        pytest.approx(0.1 - half, abs=1e-5),
        pytest.approx(0.1 + half, abs=1e-5),
    )
    assert a["p_value"] == pytest.approx(0.000407, rel=0.01) and a["significant"]
    z = 0.05 / math.hypot(0.10 / 1.959964, 0.05)  # the interval's half-width / z stands in for its se
    assert b["p_value"] == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-4) and not b["significant"]
    (flag,) = flags(table.reset_index())
    assert flag["model"] == "a" and flag["direction"] == "up" and flag["better"] is True


def write_round(root: ArtifactStore, round_id: str, metrics: dict | None, status: str | None) -> None:
    store = root.child(round_id)
    if metrics is not None:
        store.write_json("metrics.json", metrics)
    if status is not None:
        store.write_text("round.json", json.dumps({"round_id": round_id, "status": status}))


def test_incomplete_rounds_are_listed_not_left_out(tmp_path):
    rng = np.random.default_rng(1)
    truths = {"m": (0.5, 0.5)}
    root = ArtifactStore(tmp_path / "rounds")
    write_round(root, "round-20260101T000000Z-s1", simulated_metrics(rng, truths), None)  # before round.json
    write_round(root, "round-20260108T000000Z-s2", simulated_metrics(rng, truths), "complete")
    write_round(root, "round-20260115T000000Z-s3", None, "failed")
    write_round(root, "round-20260122T000000Z-s4", simulated_metrics(rng, truths), "running")  # crashed late
    write_round(root, "round-20260129T000000Z-s5", None, "complete")
    write_round(root, "round-20260205T000000Z-s6", simulated_metrics(rng, truths), "running")  # this one
    trend = collect_trend(root, limit=10, current="round-20260205T000000Z-s6")
    assert trend.rounds == ["round-20260101T000000Z-s1", "round-20260108T000000Z-s2", "round-20260205T000000Z-s6"]
    assert [(r.round[-2:], r.status) for r in trend.incomplete] == [
        ("s3", "failed"),
        ("s4", "running"),
        ("s5", "complete"),
    ]
    assert "no metrics.json" in trend.incomplete[2].reason
    comparisons = compare_rounds(trend.rows, FDR)
    assert set(comparisons["previous_round"]) == {"round-20260108T000000Z-s2"}  # the previous *complete* round
    error = round_error(trend.rows, "round-20260205T000000Z-s6", rounds=52, delta=0.05)
    assert error.items == 300 and error.epsilon == pytest.approx(math.sqrt(math.log(2 * 52 / 0.05) / 600))
    document = save_trend(root.child("round-20260205T000000Z-s6"), trend, comparisons, FDR, error)
    again = TrendDocument.model_validate_json(root.child("round-20260205T000000Z-s6").read_text("trend.json"))
    assert again == document and len(again.incomplete_rounds) == 3 and again.fdr == FDR
    # Only the last rounds count: a limit of two keeps s5 (incomplete) and s6.
    assert collect_trend(root, limit=2, current="round-20260205T000000Z-s6").rounds == ["round-20260205T000000Z-s6"]


def test_trend_section_shows_plot_changes_and_incomplete_rounds():
    rng = np.random.default_rng(0)
    steady = {"a": (0.4, 0.5), "b": (0.5, 0.5)}
    truths = [steady, steady, {"a": (0.7, 0.8), "b": (0.5, 0.5)}]  # a improves by 30 points in round 3
    rows = pd.DataFrame(
        [
            r
            for t, truth in enumerate(truths)
            for r in round_rows(f"round-2026010{t + 1}T040000Z-s{t}", simulated_metrics(rng, truth))
        ]
    )
    comparisons = compare_rounds(rows, FDR)
    assert set(comparisons[comparisons["significant"]]["model"]) == {"a"}
    document = TrendDocument(
        rounds=sorted(rows["round"].unique()),
        flags=flags(comparisons),
        metric=HEADLINE_METRIC,
        fdr=FDR,
        comparisons=len(comparisons),
        incomplete_rounds=[{"round": "round-x", "status": "failed", "reason": "round.json says failed"}],
    )
    html = trend_section(rows, document.model_dump(mode="json"))
    assert html.count('class="vl-chart"') == 1 and "significant change(s)</b> since the previous round" in html
    assert "<li>a: CRS 0." in html and "round-x: round.json says failed" in html
    quiet = TrendDocument(rounds=document.rounds, flags=[], metric=HEADLINE_METRIC, fdr=FDR, comparisons=12)
    assert "No model moved: none of 12 comparisons" in trend_section(rows, quiet.model_dump(mode="json"))
    (spec,) = specs_in(trend_plot(rows, {"a": [HEADLINE_METRIC]}))
    points = spec["data"]["values"]
    assert len(points) == len(rows) and {p["panel"] for p in points} >= {"a (changed: CRS)"}
    # only a's latest round is marked as a significant change
    assert [(p["panel"], p["round"]) for p in points if p["changed"]] == [("a (changed: CRS)", max(rows["round"]))]
    # The guardrail: rounds with n below the minimum are lone points, without their interval or a line.
    assert [p["joined"] for p in points] == [n >= MIN_CLUSTERS for n in rows["n"]]
    few = rows.assign(n=3)
    (spec_few,) = specs_in(trend_plot(few))
    assert not any(p["joined"] for p in spec_few["data"]["values"])
    layers = spec_few["spec"]["layer"] if "spec" in spec_few else spec_few["layer"]
    assert [layer.get("transform") for layer in layers[:2]] == [[{"filter": "datum.joined"}]] * 2
    assert round_label("round-20261125T153925Z-s11") == "11-25 15:39"
    readable = readable_trend(rows)
    assert len(readable) == 6
    assert set(readable[0]) == {"round", "model", "n", "coverage", "CRS", "Answer acc.", "Refusal acc."}
    assert readable[0]["CRS"].count("[") == 1 and len(readable[0]["CRS"].split(" ")[0]) == 5  # 0.xyz


def test_a_trend_json_of_the_older_version_still_renders():
    """Rounds written before the two-sample test: flags without a difference or p-value."""
    old = {
        "rounds": ["r1", "r2"],
        "metric": HEADLINE_METRIC,
        "flags": [
            {
                "model": "a",
                "metric": HEADLINE_METRIC,
                "previous_round": "r1",
                "round": "r2",
                "previous": 0.5,
                "previous_interval": [0.4, 0.6],
                "latest": 0.75,
                "direction": "up",
            }
        ],
    }
    rows = pd.DataFrame(
        [{"round": "r1", "model": "a", HEADLINE_METRIC: 0.5}, {"round": "r2", "model": "a", HEADLINE_METRIC: 0.75}]
    )
    assert "a: CRS 0.500 -&gt; 0.750 (up)" in trend_section(rows, old)  # HTML-escaped


# ---------------------------------------------------------------- rounds scored by the real scoring code

MISSING = "REFUSE_INFO_MISSING_IN_CONTEXT"


def judged_round(rng: np.random.Generator, models: dict[str, dict], n_base: int = 40) -> pd.DataFrame:
    """A judged table as ``evaluate`` writes it: per model, ``n_base`` base items, each with one answerable
    and one unanswerable item. A model's spec: ``right`` (the chance of a right answer or refusal),
    ``hard_fail`` (the chance that the call of an item it would get wrong failed: outcome call_error)."""
    records = []
    for model, spec in models.items():
        for b in range(n_base):
            for k, expected in enumerate(("ANSWER_CORRECTLY", MISSING)):
                right = bool(rng.random() < spec["right"])
                record = {"model": model, "item_id": f"b{b}-{k}", "base_id": f"b{b}", "expected": expected}
                if not right and rng.random() < spec.get("hard_fail", 0.0):
                    records.append(record | {"outcome": "call_error", "decision": None, "answer_correct": None})
                    continue
                decision = ("ANSWER" if right else MISSING) if k == 0 else (MISSING if right else "ANSWER")
                correct = right if decision == "ANSWER" else None
                records.append(record | {"outcome": "ok", "decision": decision, "answer_correct": correct})
    return pd.DataFrame(records)


def write_scored_round(root: ArtifactStore, round_id: str, judged: pd.DataFrame) -> dict:
    """The round's metrics.json as the pipeline writes it: score_frame's bootstrap, render_score_outputs."""
    from refusalbench.tasks.refusalbench.scoring import render_score_outputs, score_frame

    result = score_frame(judged, n_resamples=400, seed=3, min_coverage=0.95)
    content = render_score_outputs(result)["metrics.json"]
    store = root.child(round_id)
    store.write_bytes("metrics.json", content)
    store.write_text("round.json", json.dumps({"round_id": round_id, "status": "complete"}))
    return json.loads(content)


def test_a_model_scored_on_part_of_its_items_is_listed_not_compared(tmp_path):
    """lossy's calls failed on 70% of the items it would get wrong: the rows that got through look like a
    30-point gain. Its coverage is below min_coverage, so it is not compared; improver's real gain is."""
    rng = np.random.default_rng(5)
    root = ArtifactStore(tmp_path / "rounds")
    before = {"steady": {"right": 0.6}, "lossy": {"right": 0.55}, "improver": {"right": 0.35}}
    after = {"steady": {"right": 0.6}, "lossy": {"right": 0.55, "hard_fail": 0.7}, "improver": {"right": 0.8}}
    write_scored_round(root, "round-20260101T000000Z-s1", judged_round(rng, before))
    latest = write_scored_round(root, "round-20260108T000000Z-s2", judged_round(rng, after))
    assert latest["coverage"]["incomplete"].keys() == {"lossy"}  # the evaluation itself says so
    assert latest["standard_errors"]["lossy"][HEADLINE_METRIC] > 0

    trend = collect_trend(root, limit=5, min_coverage=0.95)
    by_round = trend.rows.set_index(["round", "model"])
    assert not by_round.loc[("round-20260108T000000Z-s2", "lossy"), "complete"]
    assert by_round.loc[("round-20260101T000000Z-s1", "lossy"), "complete"]
    comparisons = compare_rounds(trend.rows, FDR)
    assert set(comparisons["model"]) == {"steady", "improver"}
    assert set(comparisons[comparisons["significant"]]["model"]) == {"improver"}
    # Compared as if complete, lossy's partial rows would be flagged as a change: the rule is what stops it.
    as_if_complete = compare_rounds(trend.rows.drop(columns="complete"), FDR)
    lossy = as_if_complete[(as_if_complete["model"] == "lossy") & as_if_complete["significant"]]
    assert HEADLINE_METRIC in set(lossy["metric"])

    document = save_trend(root.child("round-20260108T000000Z-s2"), trend, comparisons, FDR, None)
    (entry,) = document.not_compared
    assert entry.model == "lossy" and entry.coverage == pytest.approx(latest["models"]["lossy"]["coverage"])
    assert "not compared" in entry.reason
    assert "lossy" not in {flag.model for flag in document.flags}
    assert "Incomplete in this round, not compared: lossy (incomplete: " in changes_markdown(document)
    shown = {(r["model"], r["round"][-2:]): r["coverage"] for r in readable_trend(trend.rows)}
    assert shown[("lossy", "s2")].endswith(": incomplete, not compared") and shown[("lossy", "s1")] == "100.0%"
    html = trend_section(trend.rows, document.model_dump(mode="json"))
    assert "incomplete, not compared" in html
    saved = pd.read_parquet(tmp_path / "rounds" / "round-20260108T000000Z-s2" / "round_trend.parquet")
    assert {"coverage", "complete", "n_answerable"} <= set(saved.columns)


def test_a_previous_incomplete_round_is_skipped_for_the_last_complete_one(tmp_path):
    rng = np.random.default_rng(9)
    root = ArtifactStore(tmp_path / "rounds")
    steady = {"m": {"right": 0.5}}
    write_scored_round(root, "round-20260101T000000Z-s1", judged_round(rng, steady))
    write_scored_round(root, "round-20260108T000000Z-s2", judged_round(rng, {"m": {"right": 0.5, "hard_fail": 0.5}}))
    write_scored_round(root, "round-20260115T000000Z-s3", judged_round(rng, steady))
    comparisons = compare_rounds(collect_trend(root, limit=5, min_coverage=0.95).rows, FDR)
    assert set(comparisons["previous_round"]) == {"round-20260101T000000Z-s1"}


def test_a_change_whose_standard_error_is_zero_is_not_flagged(tmp_path):
    """constant gets every item wrong in one round and right in the next: every bootstrap resample gives the
    same value, so both standard errors are 0 and the normal test would call any difference certain."""
    rng = np.random.default_rng(2)
    root = ArtifactStore(tmp_path / "rounds")
    first = write_scored_round(root, "round-20260101T000000Z-s1", judged_round(rng, {"constant": {"right": 0.0}}))
    second = write_scored_round(root, "round-20260108T000000Z-s2", judged_round(rng, {"constant": {"right": 1.0}}))
    assert first["standard_errors"]["constant"]["answer_accuracy"] == 0.0
    assert second["standard_errors"]["constant"]["answer_accuracy"] == 0.0
    from refusalbench.tasks.core.stats import independent_difference

    _, _, _, p = independent_difference(np.array([0.0]), np.array([0.0]), np.array([1.0]), np.array([0.0]))
    assert p[0] == 0.0  # what the test alone would say
    trend = collect_trend(root, limit=5, min_coverage=0.95)
    comparisons = compare_rounds(trend.rows, FDR).set_index("metric")
    accuracy = comparisons.loc["answer_accuracy"]
    assert accuracy["difference"] == 1.0 and not accuracy["tested"] and not accuracy["significant"]
    assert math.isnan(accuracy["p_value"]) and accuracy["untested"].startswith("standard error 0")
    assert not comparisons["significant"].any()
    document = save_trend(root.child("round-20260108T000000Z-s2"), trend, compare_rounds(trend.rows, FDR), FDR, None)
    assert document.flags == [] and document.untested >= 1 and document.comparisons == 6 - document.untested
    assert "not tested: standard error 0" in changes_markdown(document)


def test_a_change_on_too_few_rows_is_not_tested(tmp_path):
    rng = np.random.default_rng(4)
    root = ArtifactStore(tmp_path / "rounds")
    write_scored_round(root, "round-20260101T000000Z-s1", judged_round(rng, {"m": {"right": 0.2}}, n_base=8))
    write_scored_round(root, "round-20260108T000000Z-s2", judged_round(rng, {"m": {"right": 0.9}}, n_base=8))
    comparisons = compare_rounds(collect_trend(root, limit=5).rows, FDR)
    assert not comparisons["tested"].any() and not comparisons["significant"].any()
    assert set(comparisons["untested"]) == {f"fewer than {MIN_SUPPORT} rows scored for it in a round"}
    # The same gain on 40 base items is tested and flagged.
    write_scored_round(root, "round-20260115T000000Z-s3", judged_round(rng, {"m": {"right": 0.2}}, n_base=40))
    write_scored_round(root, "round-20260122T000000Z-s4", judged_round(rng, {"m": {"right": 0.9}}, n_base=40))
    comparisons = compare_rounds(collect_trend(root, limit=5).rows, FDR)
    assert comparisons.set_index("metric").loc[HEADLINE_METRIC, "significant"]
