"""Intervals that respect the design (base items resampled) and pairwise model comparisons (issue 26)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from refusalbench.tasks.core.stats import cluster_resample_counts, ratio_design_effects, resampled_cluster_sums
from refusalbench.tasks.refusalbench.report import ReportInputs, build_report, leaderboard_markdown, leaderboard_rows
from refusalbench.tasks.refusalbench.report.leaderboard import significance
from refusalbench.tasks.refusalbench.report.run_outputs import judged_frame
from refusalbench.tasks.refusalbench.schema.json_files import MetricsDocument
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment
from refusalbench.tasks.refusalbench.scoring import (
    bootstrap_summary,
    breakdown,
    load_score_outputs,
    prepare,
    render_score_outputs,
    score_frame,
)
from refusalbench.tasks.refusalbench.scoring.pairwise import pairwise_comparisons
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, expected_behaviour

A = "ANSWER_CORRECTLY"
STRATA = [(c, i) for c in PERTURBATION_CLASSES for i in INTENSITIES]  # 18 per base item
DOMAINS = ("law", "health", "science", "finance")


def benchmark(n_base: int = 40, seed: int = 0) -> pd.DataFrame:
    """18 items per base item (one per class × intensity): item_id, base_id, stratum, expected, domain."""
    records = []
    for b in range(n_base):
        for k, (cls, intensity) in enumerate(STRATA):
            records.append(
                {
                    "item_id": f"b{b}-{k}",
                    "base_id": f"b{b}",
                    "perturbation_class": cls,
                    "intensity": intensity,
                    "lever_id": f"lever-{k}",
                    "expected": expected_behaviour(cls, intensity),
                    "domain": DOMAINS[b % len(DOMAINS)],
                }
            )
    return pd.DataFrame(records)


def scripted(items: pd.DataFrame, model: str, skill: float, seed: int, correlated: bool = True) -> pd.DataFrame:
    """One model's judged rows: right (correct answer or right code) with probability ``skill``; with
    ``correlated``, a base item is easy or hard for it as a whole (the items share its context)."""
    rng = np.random.default_rng(seed)
    bases = items["base_id"].to_numpy()
    if correlated:
        names = np.unique(bases)
        easy = dict(zip(names, rng.random(len(names)) < skill))
        right = np.array([easy[b] for b in bases]) ^ (rng.random(len(items)) < 0.05)
    else:
        right = rng.random(len(items)) < skill
    answerable = items["expected"].to_numpy() == A
    decision = np.where(answerable, "ANSWER", np.where(right, items["expected"], "ANSWER"))
    return items.assign(model=model, decision=decision, answer_correct=answerable & right)


@pytest.fixture(scope="module")
def correlated() -> pd.DataFrame:
    """Two models on 40 base items × 18 items whose items succeed or fail together per base item."""
    items = benchmark()
    return prepare(pd.concat([scripted(items, "m1", 0.6, 1), scripted(items, "m2", 0.5, 2)], ignore_index=True))


@pytest.fixture(scope="module")
def correlated_score(correlated):
    return score_frame(correlated, n_resamples=400, seed=0)


def width(interval) -> float:
    low, high = (float(v) for v in list(interval))
    return high - low


# ----------------------------------------------------------------- the helpers in core/stats


def test_cluster_resample_counts_draw_every_cluster_count_per_resample():
    counts = cluster_resample_counts(np.random.default_rng(0), 7, 50)
    assert counts.shape == (50, 7) and (counts.sum(axis=1) == 7).all()
    again = cluster_resample_counts(np.random.default_rng(0), 7, 50)
    assert (counts == again).all()


def test_resampled_cluster_sums_keep_the_total_count_and_the_mean():
    per_cluster = np.array([[1.0, 2.0], [0.0, 2.0], [1.0, 2.0], [3.0, 2.0]] * 10)  # few types: multinomial path
    sums = resampled_cluster_sums(per_cluster, np.random.default_rng(1), 2000)
    assert (sums[:, 1] == 80).all()  # every resample draws 40 clusters of n = 2
    assert sums[:, 0].mean() == pytest.approx(per_cluster[:, 0].sum(), rel=0.02)
    distinct = np.arange(40, dtype=float)[:, None]  # every cluster its own type: index draws
    assert resampled_cluster_sums(distinct, np.random.default_rng(1), 500).mean() == pytest.approx(780, rel=0.02)


def test_design_effect_is_one_for_single_rows_and_the_cluster_size_for_identical_rows():
    rows = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    assert ratio_design_effects(rows, np.ones(5), np.zeros(5, dtype=int), 1)[0] == pytest.approx(1.0)
    # 5 base items of 18 rows each, all right or all wrong: worth 5 rows, not 90
    assert ratio_design_effects(rows * 18, np.full(5, 18.0), np.zeros(5, dtype=int), 1)[0] == pytest.approx(18.0)
    assert ratio_design_effects(np.ones(3), np.ones(3), np.zeros(3, dtype=int), 1)[0] == 1.0  # rate 1: no variance


# ----------------------------------------------------------------- intervals


def test_cluster_intervals_are_wider_than_iid_ones_when_items_of_a_base_item_are_correlated(correlated):
    cluster_intervals, cluster_errors = bootstrap_summary(correlated, n_resamples=400)
    iid_intervals, iid_errors = bootstrap_summary(correlated, n_resamples=400, unit="iid")
    for model in ("m1", "m2"):
        for name in ("answer_accuracy", "refusal_accuracy", "calibrated_refusal_score"):
            assert width(cluster_intervals[model][name]) > 1.5 * width(iid_intervals[model][name]), (model, name)
            assert cluster_errors[model][name] > 1.5 * iid_errors[model][name], (model, name)


def test_without_base_ids_each_item_is_its_own_cluster_and_the_figures_agree(correlated):
    plain = prepare(correlated.drop(columns=["base_id"]))
    assert bootstrap_summary(plain, n_resamples=200) == bootstrap_summary(plain, n_resamples=200, unit="iid")


def test_domain_breakdown_intervals_widen_with_base_items_and_levers_stay_as_they_were(correlated):
    clustered = breakdown(correlated, "domain", n_resamples=300).set_index(["model", "value", "metric"])
    plain = breakdown(prepare(correlated.drop(columns=["base_id"])), "domain", n_resamples=300)
    plain = plain.set_index(["model", "value", "metric"])
    for metric in ("answer_accuracy", "refusal_accuracy", "calibrated_refusal_score"):  # Wilson, Wilson, bootstrap
        row = ("m1", "law", metric)
        assert clustered.loc[row, "estimate"] == plain.loc[row, "estimate"]
        assert width(clustered.loc[row, ["ci_low", "ci_high"]]) > 1.5 * width(plain.loc[row, ["ci_low", "ci_high"]])
    # a lever holds one item per base item: the two designs are the same, and so are the intervals
    levers = breakdown(correlated, "lever_id", n_resamples=200)
    plain_levers = breakdown(prepare(correlated.drop(columns=["base_id"])), "lever_id", n_resamples=200)
    pd.testing.assert_frame_equal(levers, plain_levers)


def test_metrics_json_has_both_figures_and_the_pairwise_block(correlated_score):
    files = render_score_outputs(correlated_score)
    document = json.loads(files["metrics.json"])
    MetricsDocument.model_validate(document)
    for model in ("m1", "m2"):
        crs = "calibrated_refusal_score"
        assert width(document["intervals"][model][crs]) > width(document["intervals_iid"][model][crs])
        assert document["standard_errors"][model][crs] > document["standard_errors_iid"][model][crs]
    assert document["bootstrap"]["unit"].startswith("base item")
    assert document["pairwise"]["correction"] == "holm"
    (pair,) = document["pairwise"]["comparisons"]
    assert (pair["model_a"], pair["model_b"], pair["n_items"], pair["same_items"]) == ("m1", "m2", 720, True)
    back = load_score_outputs(files)
    assert back.intervals_iid["m1"]["answer_accuracy"] == pytest.approx(
        correlated_score.intervals_iid["m1"]["answer_accuracy"]
    )
    assert back.pairwise["comparisons"][0]["metrics"]["answer_accuracy"]["p_adjusted"] == pytest.approx(
        pair["metrics"]["answer_accuracy"]["p_adjusted"]
    )


def test_judged_frame_carries_each_items_base_id():
    items = [
        BenchmarkItem(
            item_id=f"i{k}",
            base_id=f"b{k // 2}",
            variant="single",
            perturbation_class="P-Ambiguity",
            intensity="HIGH",
            lever_id="l",
            generator="g",
            question="q",
            original_question="q",
            answers=["a"],
            expected="REFUSE_AMBIGUOUS",
        )
        for k in range(4)
    ]
    judgments = [
        Judgment(item_id=f"i{k}", model="m", expected="REFUSE_AMBIGUOUS", decision="REFUSE_AMBIGUOUS") for k in range(4)
    ]
    frame, _ = judged_frame(judgments, items)
    assert frame["base_id"].tolist() == ["b0", "b0", "b1", "b1"]
    assert "base_id" in prepare(frame).columns


# ----------------------------------------------------------------- pairwise comparisons


@pytest.fixture(scope="module")
def three_models() -> pd.DataFrame:
    """ "strong" and its exact copy "twin", and "weak" 20 points below them, on 60 base items × 18 items."""
    items = benchmark(n_base=60)
    strong = scripted(items, "strong", 0.7, 7, correlated=False)
    rng = np.random.default_rng(8)
    right = (strong["decision"] != "ANSWER") | strong["answer_correct"]
    # weak: right where strong is right, but wrong on 2 of 7 of those items: 70% -> 50%
    lose = right.to_numpy() & (rng.random(len(items)) < 2 / 7)
    answerable = items["expected"].to_numpy() == A
    weak = strong.assign(
        model="weak",
        decision=np.where(lose & ~answerable, "ANSWER", strong["decision"]),
        answer_correct=strong["answer_correct"] & ~lose,
    )
    return prepare(pd.concat([strong, strong.assign(model="twin"), weak], ignore_index=True))


@pytest.fixture(scope="module")
def three_pairwise(three_models):
    return pairwise_comparisons(three_models, n_resamples=1000, seed=0)


def test_a_clear_twenty_point_difference_is_significant_and_identical_models_are_not(three_pairwise):
    pairs = {(c["model_a"], c["model_b"]): c["metrics"] for c in three_pairwise["comparisons"]}
    assert set(pairs) == {("strong", "twin"), ("strong", "weak"), ("twin", "weak")}
    for pair in (("strong", "weak"), ("twin", "weak")):
        crs = pairs[pair]["calibrated_refusal_score"]
        assert crs["difference"] == pytest.approx(0.2, abs=0.03)
        assert crs["ci"][0] > 0 and crs["significant"] and crs["p_adjusted"] < 0.01
        assert pairs[pair]["answer_accuracy"]["significant"] and pairs[pair]["refusal_accuracy"]["significant"]
    for name, same in pairs[("strong", "twin")].items():
        assert (same["difference"], same["p_value"], same["significant"]) == (0.0, 1.0, False), name


def test_holm_correction_over_the_pairs_of_each_metric(three_pairwise):
    raw = [c["metrics"]["answer_accuracy"]["p_value"] for c in three_pairwise["comparisons"]]
    adjusted = [c["metrics"]["answer_accuracy"]["p_adjusted"] for c in three_pairwise["comparisons"]]
    smallest = int(np.argmin(raw))
    assert adjusted[smallest] == pytest.approx(min(1.0, 3 * raw[smallest]))  # Holm: m x the smallest p
    assert all(a >= r for a, r in zip(adjusted, raw))


def test_models_on_different_items_are_compared_on_the_items_they_share(three_models):
    fewer = three_models[~((three_models["model"] == "weak") & three_models["item_id"].str.startswith("b1-"))]
    comparisons = pairwise_comparisons(fewer, n_resamples=200)["comparisons"]
    by_pair = {(c["model_a"], c["model_b"]): c for c in comparisons}
    assert (by_pair[("strong", "weak")]["n_items"], by_pair[("strong", "weak")]["same_items"]) == (1062, False)
    assert by_pair[("strong", "twin")]["same_items"]


def test_leaderboard_shows_the_leaders_group_and_rank_ranges(three_models):
    result = score_frame(three_models, n_resamples=200, seed=0)
    groups = significance(result.metrics, result.pairwise)
    assert {m: (g["rank_low"], g["rank_high"], g["tied_with_leader"]) for m, g in groups.items()} == {
        "strong": (1, 2, True),
        "twin": (1, 2, True),
        "weak": (3, 3, False),
    }
    rows = {row["model"]: row for row in leaderboard_rows(result.metrics, result.intervals, pairwise=result.pairwise)}
    leader = [m for m, row in rows.items() if row["rank"] == 1][0]
    assert rows[leader]["group"] == "#1"
    assert (rows["weak"]["rank_range"], rows["weak"]["group"]) == ("3", "")
    assert rows["weak"]["p_vs_leader"] < 0.05
    other = "twin" if leader == "strong" else "strong"
    assert (rows[other]["rank_range"], rows[other]["group"]) == ("1–2", "tied with #1")
    markdown = leaderboard_markdown(result.metrics, result.intervals, pairwise=result.pairwise)
    assert "| Rank range | Group |" in markdown and "tied with #1" in markdown and "Holm" in markdown
    # only the tables this needs: the figures of a whole report take seconds
    page = build_report(
        ReportInputs(
            metrics=result.metrics,
            intervals=result.intervals,
            pairwise=result.pairwise,
            standard_errors=result.standard_errors,
            standard_errors_iid=result.standard_errors_iid,
        )
    )
    board = page.split("<h2>Leaderboard</h2>")[1].split("</table>")[0]
    assert "<th>Rank range</th><th>Group</th>" in board and "<td>tied with #1</td>" in board
    assert "cluster bootstrap" in page.split("<h2>Leaderboard</h2>")[1].split("<table>")[0]
    pairwise = page.split("<h2>Pairwise comparisons</h2>")[1].split("</table>")[0]
    assert "Holm" in pairwise and "<b>*</b>" in pairwise
    # the better-ranked model first: its differences read positive
    assert f"<td class='name'>{leader}</td><td class='name'>weak</td>" in pairwise
    errors = page.split("<h2>Standard errors</h2>")[1].split("</table>")[0]
    assert "base items resampled" in errors and "i.i.d." in errors


def test_no_resamples_no_pairwise_and_no_significance_columns(three_models):
    result = score_frame(three_models, n_resamples=0)
    assert result.pairwise == {} and result.intervals_iid == {}
    assert "group" not in leaderboard_rows(result.metrics)[0]
    assert json.loads(render_score_outputs(result)["metrics.json"])["pairwise"] is None
    assert not math.isnan(result.metrics["weak"]["calibrated_refusal_score"])
