"""Issue 16's metrics on hand-computed tables: GaRAGe scores, standard errors, breakdown
intervals, the six-way response distribution, the FRR-MRR correlation, multi-document judging."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.gateway import CallResult
from refusalbench.tasks.llm.structured_outputs import JudgeMultiOutput, parse_output
from refusalbench.tasks.refusalbench.report import ReportInputs, build_report, leaderboard_markdown, leaderboard_rows
from refusalbench.tasks.refusalbench.report.run_outputs import judged_frame
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Passage, Response
from refusalbench.tasks.refusalbench.scoring import (
    all_metrics,
    bootstrap_intervals,
    bootstrap_summary,
    breakdown,
    compute_metrics,
    frr_mrr_correlation,
    load_score_outputs,
    metric_spec,
    multi_document_metrics,
    prepare,
    read_judged,
    read_metrics_json,
    render_score_outputs,
    response_distribution,
    score_frame,
    single_document_metrics,
)
from refusalbench.tasks.refusalbench.stages.judge import judgment_from_result
from tests.refusalbench.test_scoring import M1, A, assert_metrics, frame, synthetic

NAN = math.nan


def garage_rows(model="g", variant="multi"):
    """6 answerable + 4 unanswerable multi-document rows with the judge's three scores.

    (item, expected, decision, raf, eligibility, factuality)
    """
    spec = [
        ("a1", A, "ANSWER", 1, 1, 1),
        ("a2", A, "ANSWER", 0, 1, 1),
        ("a3", A, "ANSWER", 0, 0, 0),
        ("a4", A, "ANSWER", 1, 1, 0),  # RAF 1 with unadjusted factuality 0: allowed
        ("a5", A, "REFUSE_MISSING", None, None, None),  # false refusal: RAF 0
        ("a6", A, "ANSWER", 1, 1, 1),
        ("u1", "REFUSE_AMBIGUOUS", "REFUSE_AMBIGUOUS", None, None, None),  # right code
        ("u2", "REFUSE_OTHER", "REFUSE_OTHER", None, None, None),  # right code
        ("u3", "REFUSE_FALSE_PREMISE", "ANSWER", None, None, None),  # missed refusal
        ("u4", "REFUSE_MISSING", "REFUSE_MISSING", None, None, None),  # right code
    ]
    return [
        {
            "model": model,
            "item_id": item,
            "expected": expected,
            "decision": decision,
            "answer_correct": None if raf is None else raf == 1,
            "raf": raf,
            "eligibility": eligibility,
            "factuality": factuality,
            "variant": variant,
        }
        for item, expected, decision, raf, eligibility, factuality in spec
    ]


GARAGE_EXPECTED = {
    # RAF over the 6 answerable: a1 a4 a6 = 1; a2 a3 = 0; a5 refused = 0
    "answer_quality_score": 3 / 6,
    # (Σ RAF on answerable + right codes on unanswerable) / all: (3 + 3) / 10
    "hybrid_score": (3 + 3) / 10,
    # judged answer attempts a1 a2 a3 a4 a6: eligibility 1 1 0 1 1, factuality 1 1 0 0 1, RAF 1 0 0 1 1
    "eligibility_rate": 4 / 5,
    "factuality_rate": 3 / 5,
    "raf_rate": 3 / 5,
    "answer_accuracy": 3 / 6,
    "refusal_accuracy": 3 / 4,
    "calibrated_refusal_score": (3 / 6 + 3 / 4) / 2,
}


# ----------------------------------------------------------------- GaRAGe scores


def test_answer_quality_and_hybrid_scores_by_hand():
    metrics = compute_metrics(frame(garage_rows()))["g"]
    assert set(metrics) >= set(all_metrics())
    assert_metrics(metrics, GARAGE_EXPECTED)


def test_raf_stands_in_for_a_missing_answer_correct_column():
    df = frame(garage_rows()).drop(columns=["answer_correct"])
    assert_metrics(compute_metrics(df)["g"], GARAGE_EXPECTED)


def test_multi_document_metrics_are_nan_on_single_document_rows():
    single = [dict(r, model="s", variant="single", raf=None, eligibility=None, factuality=None) for r in garage_rows()]
    metrics = compute_metrics(frame(garage_rows(), single))
    assert_metrics(metrics["g"], GARAGE_EXPECTED)
    assert_metrics(metrics["s"], {name: NAN for name in multi_document_metrics()})
    # A single-document run: §6's metrics only by default, NaN (never 0) when asked for all.
    alone = frame(M1)
    assert set(compute_metrics(alone)["m1"]) == set(single_document_metrics()) | {
        "n",
        "n_answerable",
        "n_unanswerable",
        "n_confidence",
        "n_unjudged",
    }
    assert_metrics(compute_metrics(alone, all_metrics())["m1"], {name: NAN for name in multi_document_metrics()})


def test_only_multi_document_rows_enter_the_garage_scores():
    # One model, its 10 multi rows plus 2 single rows (a correct answer, a right refusal).
    extra = [
        {
            "model": "g",
            "item_id": "s1",
            "expected": A,
            "decision": "ANSWER",
            "answer_correct": True,
            "raf": None,
            "eligibility": None,
            "factuality": None,
            "variant": "single",
        },
        {
            "model": "g",
            "item_id": "s2",
            "expected": "REFUSE_OTHER",
            "decision": "REFUSE_OTHER",
            "answer_correct": None,
            "raf": None,
            "eligibility": None,
            "factuality": None,
            "variant": "single",
        },
    ]
    metrics = compute_metrics(frame(garage_rows(), extra))["g"]
    assert_metrics(
        metrics,
        {
            **{k: GARAGE_EXPECTED[k] for k in multi_document_metrics()},
            "answer_accuracy": 4 / 7,
            "refusal_accuracy": 4 / 5,
        },
    )


def test_without_a_variant_column_a_file_with_raf_is_multi_document():
    df = frame(garage_rows()).drop(columns=["variant"])
    assert_metrics(compute_metrics(df)["g"], GARAGE_EXPECTED)
    assert prepare(df)["multi"].all()
    assert not prepare(frame(M1))["multi"].any()


def test_raf_one_with_eligibility_zero_is_refused_as_input(tmp_path):
    rows = garage_rows()
    rows[2] = dict(rows[2], raf=1, answer_correct=True)  # a3: eligibility 0
    path = tmp_path / "j.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(InputError) as error:
        read_judged(path)
    assert (error.value.line, error.value.field) == (3, "raf")
    assert "eligibility" in str(error.value)


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda rows: rows.__setitem__(0, dict(rows[0], answer_correct=False)), "answer_correct"),  # RAF 1
        (lambda rows: rows.__setitem__(1, dict(rows[1], factuality=3)), "factuality"),
        (lambda rows: rows.__setitem__(1, dict(rows[1], variant="both")), "variant"),
    ],
)
def test_bad_multi_document_cells_name_their_field(change, field):
    rows = garage_rows()
    change(rows)
    with pytest.raises(InputError) as error:
        prepare(frame(rows))
    assert error.value.field == field


def test_multi_document_metrics_round_trip_through_csv(tmp_path):
    path = tmp_path / "j.csv"
    frame(garage_rows()).to_csv(path, index=False)
    assert_metrics(compute_metrics(read_judged(path))["g"], GARAGE_EXPECTED)


# ----------------------------------------------------------------- standard errors (App. G)


def test_standard_errors_are_the_bootstrap_spread():
    df = synthetic(n_per_model=2000, models=("alpha",))
    intervals, errors = bootstrap_summary(df, n_resamples=1000, seed=4)
    assert intervals == bootstrap_intervals(df, n_resamples=1000, seed=4)  # the same resamples
    metrics = compute_metrics(df)["alpha"]
    # For a proportion the bootstrap SE approaches the binomial sqrt(p(1 - p) / n).
    for name, n in (("answer_accuracy", metrics["n_answerable"]), ("refusal_rate", metrics["n"])):
        p = metrics[name]
        assert errors["alpha"][name] == pytest.approx(math.sqrt(p * (1 - p) / n), rel=0.1), name
    assert all(errors["alpha"][name] > 0 for name in single_document_metrics() if not name.startswith("ece"))


def test_standard_error_is_nan_where_the_metric_is_undefined():
    df = frame([r for r in M1 if r["expected"] == A])  # answerable only
    errors = bootstrap_summary(df, n_resamples=200)[1]["m1"]
    assert math.isnan(errors["refusal_accuracy"])
    assert errors["answer_accuracy"] > 0


# ----------------------------------------------------------------- breakdown intervals


def _wilson(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def test_breakdown_rows_have_wilson_intervals_for_proportions():
    table = breakdown(frame(M1), "intensity").set_index(["value", "metric"])
    # LOW = a1..a4: answer accuracy 2/4, FRR 1/4
    for metric, k, n in (("answer_accuracy", 2, 4), ("false_refusal_rate", 1, 4)):
        low, high = _wilson(k, n)
        assert table.loc[("LOW", metric), "ci_low"] == pytest.approx(low)
        assert table.loc[("LOW", metric), "ci_high"] == pytest.approx(high)
    # HIGH: refusal accuracy 2/4; MEDIUM: missed refusal rate 1/2
    assert tuple(table.loc[("HIGH", "refusal_accuracy"), ["ci_low", "ci_high"]]) == pytest.approx(_wilson(2, 4))
    assert tuple(table.loc[("MEDIUM", "missed_refusal_rate"), ["ci_low", "ci_high"]]) == pytest.approx(_wilson(1, 2))
    # 0 of 1 (LOW precision: a3 refused, answerable) starts at 0; 3 of 3 (HIGH precision) ends at 1
    assert tuple(table.loc[("LOW", "detection_precision"), ["ci_low", "ci_high"]]) == pytest.approx(_wilson(0, 1))
    assert table.loc[("LOW", "detection_precision"), "ci_low"] == 0.0
    assert table.loc[("HIGH", "detection_precision"), "ci_high"] == 1.0
    # undefined (MEDIUM has no answerable item): NaN estimate, NaN interval
    assert table.loc[("MEDIUM", "false_refusal_rate"), ["estimate", "ci_low", "ci_high"]].isna().all()
    # a composite (CRS, bootstrap within LOW) gets an interval too
    assert table.loc[("LOW", "calibrated_refusal_score"), ["ci_low", "ci_high"]].isna().all()  # refusal side undefined
    assert table.loc[("LOW", "detection_f1"), ["ci_low", "ci_high"]].isna().all()
    assert table.loc[("HIGH", "detection_f1"), ["ci_low", "ci_high"]].notna().all()


def test_every_defined_breakdown_row_has_an_interval():
    result = score_frame(synthetic(n_per_model=240), n_resamples=200, seed=2)
    table = result.breakdown
    defined = table["estimate"].notna()
    assert {"intensity", "domain", "overall"} <= set(table["group"])
    assert table.loc[defined, ["ci_low", "ci_high"]].notna().all().all()
    assert table.loc[~defined, ["ci_low", "ci_high"]].isna().all().all()
    assert (table.loc[defined, "ci_low"] <= table.loc[defined, "ci_high"] + 1e-12).all()
    # composite metrics (bootstrap within the group) bracket their estimate in these large groups
    formulas = [m for m in all_metrics() if not metric_spec(m).is_ratio]
    composite = table[defined & table["metric"].isin(formulas) & (table["group"] != "overall")]
    assert not composite.empty
    inside = (composite["ci_low"] <= composite["estimate"] + 1e-9) & (
        composite["estimate"] <= composite["ci_high"] + 1e-9
    )
    assert inside.mean() > 0.95


def test_breakdown_intervals_are_deterministic_and_group_local():
    df = synthetic(n_per_model=240)
    first = breakdown(df, "domain", n_resamples=100, seed=5)
    again = breakdown(df, "domain", n_resamples=100, seed=5)
    pd.testing.assert_frame_equal(first, again)
    alone = breakdown(df[df["model"] == "alpha"], "domain", n_resamples=100, seed=5)
    pd.testing.assert_frame_equal(first[first["model"] == "alpha"].reset_index(drop=True), alone)
    no_bootstrap = breakdown(df, "domain", n_resamples=0)
    assert no_bootstrap[no_bootstrap["metric"] == "detection_f1"]["ci_low"].isna().all()
    accuracy = no_bootstrap[no_bootstrap["metric"] == "answer_accuracy"]
    assert accuracy["ci_low"].notna().tolist() == accuracy["estimate"].notna().tolist()  # Wilson needs no resample


# ----------------------------------------------------------------- response distribution

M1_OUTCOMES = {  # a1 a4 | a2 | u1 u2 u5 | u3 | a3 | u4 u6 | (every row usable)
    "correct_answer": 2,
    "wrong_answer": 1,
    "correct_refusal": 3,
    "wrong_category_refusal": 1,
    "false_refusal": 1,
    "missed_refusal": 2,
    "no_usable_response": 0,
}


def test_seven_way_distribution_by_hand():
    table = response_distribution(frame(M1))
    assert table["outcome"].tolist() == list(M1_OUTCOMES)
    assert dict(zip(table["outcome"], table["count"])) == M1_OUTCOMES
    assert table["fraction"].tolist() == pytest.approx([c / 10 for c in M1_OUTCOMES.values()])
    assert table["fraction"].sum() == pytest.approx(1.0)
    assert set(table["n"]) == {10}
    low, high = _wilson(3, 10)
    row = table.set_index("outcome").loc["correct_refusal"]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))


def test_distribution_sums_to_one_per_model_and_reaches_the_files():
    df = synthetic(n_per_model=90)
    result = score_frame(df, n_resamples=20)
    sums = result.response_distribution.groupby("model")["fraction"].sum()
    assert sums.to_numpy() == pytest.approx([1.0, 1.0])
    files = render_score_outputs(result)
    assert rb_files.RESPONSE_DISTRIBUTION.name in files
    document = json.loads(files[rb_files.METRICS.name])
    assert sum(document["response_distribution"]["alpha"].values()) == pytest.approx(1.0)
    loaded = load_score_outputs(files)
    pd.testing.assert_frame_equal(loaded.response_distribution, result.response_distribution, check_dtype=False)


# ----------------------------------------------------------------- FRR-MRR correlation


def test_frr_mrr_correlation_by_hand():
    metrics = {
        "m1": {"false_refusal_rate": 0.1, "missed_refusal_rate": 0.8},
        "m2": {"false_refusal_rate": 0.2, "missed_refusal_rate": 0.5},
        "m3": {"false_refusal_rate": 0.3, "missed_refusal_rate": 0.6},
        "m4": {"false_refusal_rate": 0.4, "missed_refusal_rate": 0.1},
        "m5": {"false_refusal_rate": 0.5, "missed_refusal_rate": NAN},  # undefined: left out
    }
    result = frr_mrr_correlation(metrics)
    # dx = (-.15, -.05, .05, .15), dy = (.3, 0, .1, -.4): r = -.1 / sqrt(.05 · .26)
    assert result["pearson"] == pytest.approx(-0.1 / math.sqrt(0.05 * 0.26))
    # ranks (1, 2, 3, 4) vs (4, 2, 3, 1): Σd² = 18, ρ = 1 − 6·18 / (4·15)
    assert result["spearman"] == pytest.approx(1 - 6 * 18 / 60)
    assert result["n"] == 4 and result["models"] == ["m1", "m2", "m3", "m4"]


def test_frr_mrr_correlation_needs_three_varying_models():
    two = frr_mrr_correlation(
        {
            "a": {"false_refusal_rate": 0.1, "missed_refusal_rate": 0.2},
            "b": {"false_refusal_rate": 0.3, "missed_refusal_rate": 0.1},
        }
    )
    assert math.isnan(two["pearson"]) and math.isnan(two["spearman"]) and two["n"] == 2
    flat = frr_mrr_correlation(
        {m: {"false_refusal_rate": 0.2, "missed_refusal_rate": v} for m, v in (("a", 0.1), ("b", 0.2), ("c", 0.3))}
    )
    assert math.isnan(flat["pearson"]) and flat["n"] == 3


def test_metrics_json_carries_the_new_keys_and_validates():
    multi = [dict(r, model="h") for r in garage_rows()]
    result = score_frame(
        pd.concat([synthetic(n_per_model=60), frame(garage_rows(), multi)], ignore_index=True), n_resamples=50, seed=1
    )
    files = render_score_outputs(result)
    document = json.loads(files[rb_files.METRICS.name])
    rb_files.METRICS.schema.model_validate(document)  # the declared shape
    assert document["models"]["alpha"]["answer_quality_score"] is None  # single-document: null
    assert document["models"]["g"]["answer_quality_score"] == pytest.approx(0.5)
    assert document["standard_errors"]["alpha"]["answer_accuracy"] > 0
    assert document["intervals"]["g"]["hybrid_score"][0] <= 0.6 <= document["intervals"]["g"]["hybrid_score"][1]
    assert document["frr_mrr_correlation"]["n"] == 4
    assert document["multi_document"] == {
        m: {"n_items": 10, "n_answerable": 6, "n_answer_attempts_judged": 5, "n_eligibility": 5, "n_factuality": 5}
        for m in ("g", "h")
    }
    back = read_metrics_json(files[rb_files.METRICS.name])
    assert math.isnan(back["standard_errors"]["alpha"]["answer_quality_score"])  # null -> NaN
    assert back["frr_mrr_correlation"]["pearson"] == pytest.approx(result.frr_mrr_correlation["pearson"])
    single = json.loads(render_score_outputs(score_frame(frame(M1), n_resamples=10))[rb_files.METRICS.name])
    assert single["frr_mrr_correlation"]["pearson"] is None and single["frr_mrr_correlation"]["n"] == 1
    assert single["multi_document"] == {}


# ----------------------------------------------------------------- multi-document judging


def _item(i, expected=A, multi=True):
    return BenchmarkItem(
        item_id=f"item{i}",
        base_id=f"b{i}",
        variant="multi" if multi else "single",
        perturbation_class="P-MissingInfo",
        intensity="LOW",
        lever_id="lever-low",
        generator="gen-a",
        question=f"What is item {i}?",
        context=None if multi else "The answer is x.",
        passages=[Passage(text="The answer is x.", relevant=True)] if multi else None,
        original_question="q",
        answers=["x"],
        expected=expected,
        domain="science",
    )


def _response(i, decision="ANSWER"):
    return Response(item_id=f"item{i}", model="t", decision=decision, raw="It is x.")


def test_judge_reply_with_raf_but_no_eligibility_is_a_parse_failure():
    parsed, problem = parse_output(JudgeMultiOutput, '{"eligibility": 0, "factuality": 1, "raf": 1}')
    assert parsed is None and "eligibility" in problem
    good, _ = parse_output(JudgeMultiOutput, '{"eligibility": 1, "factuality": 0, "raf": 1}')
    assert good is not None
    # An object that slipped past validation (model_construct) is refused by the judge stage too.
    result = CallResult(
        model="judge",
        key="k",
        text="{}",
        parsed=JudgeMultiOutput.model_construct(eligibility=0, factuality=1, raf=1, rationale=""),
    )
    judgment = judgment_from_result(_item(1), _response(1), "judge", result)
    assert judgment.error is not None and "eligibility" in judgment.error
    assert judgment.answer_correct is None and judgment.raf is None


def test_judged_frame_carries_variant_and_judge_scores():
    items = [_item(1), _item(2, "REFUSE_MISSING"), _item(3, multi=False)]
    judgments = [
        Judgment(
            item_id="item1",
            model="t",
            expected=A,
            decision="ANSWER",
            answer_correct=True,
            eligibility=1,
            factuality=1,
            raf=1,
        ),
        Judgment(
            item_id="item2", model="t", expected="REFUSE_MISSING", decision="REFUSE_MISSING", refusal_correct=True
        ),
        Judgment(item_id="item3", model="t", expected=A, decision="ANSWER", answer_correct=False, quality=2),
    ]
    frame_, excluded = judged_frame(judgments, items)
    assert frame_["variant"].tolist() == ["multi", "multi", "single"]
    assert {"raf", "eligibility", "factuality"} <= set(frame_.columns) and excluded == {}
    metrics = compute_metrics(frame_)["t"]
    # multi rows: item1 answered RAF 1, item2 right code -> AQS 1/1, hybrid 2/2; item3 is single
    assert_metrics(metrics, {"answer_quality_score": 1.0, "hybrid_score": 1.0, "answer_accuracy": 1 / 2})
    single_only, _ = judged_frame(judgments[2:])
    assert not {"raf", "eligibility", "factuality", "variant"} & set(single_only.columns)


# ----------------------------------------------------------------- report and leaderboard


def test_report_shows_distribution_standard_errors_and_garage_scores():
    multi = [dict(r, model="h", decision="ANSWER" if r["item_id"] == "u2" else r["decision"]) for r in garage_rows()]
    df = pd.concat([frame(garage_rows(), multi), synthetic(n_per_model=60, models=("alpha",))], ignore_index=True)
    result = score_frame(df, n_resamples=50, seed=0)
    page = build_report(ReportInputs.from_score(result))
    for heading in ("Response distribution", "Standard errors", "Multi-document answer quality"):
        assert f"<h2>{heading}</h2>" in page
    assert "Answer quality (mean RAF)" in page and "Wrong-category refusal" in page
    assert "Correlation of false and missed refusal rates across 3 models" in page
    single = build_report(ReportInputs.from_score(score_frame(frame(M1), n_resamples=20)))
    assert "<h2>Multi-document answer quality</h2>" not in single
    assert "<h2>Response distribution</h2>" in single and "correlation across models: undefined" in single


def test_leaderboard_forms_add_garage_scores_and_the_crs_standard_error():
    result = score_frame(frame(garage_rows(), M1), n_resamples=50)
    rows = leaderboard_rows(result.metrics, result.intervals, result.standard_errors)
    by_model = {r["model"]: r for r in rows}
    assert by_model["g"]["answer_quality_score"] == 0.5 and by_model["m1"]["answer_quality_score"] is None
    assert by_model["g"]["crs_se"] > 0
    assert "Answer quality" in leaderboard_markdown(result.metrics, result.intervals)
    plain = leaderboard_rows(compute_metrics(frame(M1), all_metrics()))
    assert "answer_quality_score" not in plain[0] and "crs_se" not in plain[0]
    assert not np.isnan(by_model["g"]["hybrid_score"])


def test_group_bootstrap_matches_row_resampling_within_the_group():
    df = prepare(synthetic(n_per_model=1200, models=("alpha",)))
    table = breakdown(df, "domain", n_resamples=1000, seed=3).set_index(["value", "metric"])
    group = df[df["domain"] == "health"].reset_index(drop=True)  # unanswerable items only
    rng = np.random.default_rng(11)
    drawn = {"detection_f1": [], "ece_refusal": []}
    for _ in range(1000):
        sample = group.iloc[rng.integers(0, len(group), len(group))].copy()
        sample["item_id"] = np.arange(len(group)).astype(str)
        metrics = compute_metrics(sample)["alpha"]
        for name in drawn:
            drawn[name].append(metrics[name])
    for name, values in drawn.items():
        low, high = np.percentile(values, [2.5, 97.5])
        assert table.loc[("health", name), "ci_low"] == pytest.approx(low, abs=0.02), name
        assert table.loc[("health", name), "ci_high"] == pytest.approx(high, abs=0.02), name
