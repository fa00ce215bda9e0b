"""Metrics of DESIGN.md §6 on small hand-computed tables, bootstrap, tables, files."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.refusalbench import scoring
from refusalbench.tasks.refusalbench.decisions import parse_decision
from refusalbench.tasks.refusalbench.scoring import (
    bootstrap_intervals,
    breakdown,
    class_intensity_grid,
    compute_metrics,
    confusion,
    domain_champions,
    load_score_outputs,
    prepare,
    read_judged,
    read_metrics_json,
    read_score,
    refusal_rate_by_intensity,
    render_score_outputs,
    score_frame,
    single_document_metrics,
    write_score,
)

A = "ANSWER_CORRECTLY"
NAN = math.nan


def rows(model, spec):
    """spec: (item, expected, response-or-decision, answer_correct, confidence, intensity)."""
    return [
        {
            "model": model,
            "item_id": item,
            "expected": expected,
            "response": response,
            "answer_correct": correct,
            "confidence": confidence,
            "intensity": intensity,
        }
        for item, expected, response, correct, confidence, intensity in spec
    ]


# m1: 4 answerable + 6 unanswerable, verbal confidences, responses in mixed spellings.
M1 = rows(
    "m1",
    [
        ("a1", A, "Paris.", True, "VERY_CONFIDENT", "LOW"),
        ("a2", A, "Lyon.", False, "CONFIDENT", "LOW"),
        ("a3", A, "**REFUSE_MISSING**", None, "UNCERTAIN", "LOW"),  # false refusal
        ("a4", A, "1912", True, "confident", "LOW"),
        ("u1", "REFUSE_AMBIGUOUS_QUERY", "refuse_ambiguous", None, "VERY_CONFIDENT", "HIGH"),  # right
        ("u2", "REFUSE_MISSING", "`REFUSE_INFO_MISSING`", None, "CONFIDENT", "MEDIUM"),  # right
        (
            "u3",
            "REFUSE_FALSE_PREMISE_IN_QUERY",
            "REFUSE_INFO_MISSING_IN_CONTEXT",
            None,
            "VERY_CONFIDENT",
            "HIGH",
        ),  # wrong code
        (
            "u4",
            "REFUSE_GRANULARITY_MISMATCH",
            "The info is missing, but 5.",
            False,
            "VERY_CONFIDENT",
            "MEDIUM",
        ),  # missed
        ("u5", "REFUSE_NONFACTUAL_QUERY", "REFUSE_NONFACTUAL", None, "SOMEWHAT_CONFIDENT", "HIGH"),  # right
        ("u6", "REFUSE_CONTRADICTORY_CONTEXT", "Both, really.", False, None, "HIGH"),  # missed
    ],
)

M1_EXPECTED = {
    "n": 10,
    "n_answerable": 4,
    "n_unanswerable": 6,
    "n_confidence": 9,
    "n_unjudged": 0,
    "answer_accuracy": 2 / 4,  # a1, a4 answered correctly / 4 answerable
    "refusal_accuracy": 3 / 6,  # u1, u2, u5 right code / 6 unanswerable
    "false_refusal_rate": 1 / 4,  # a3 refused / 4 answerable
    "missed_refusal_rate": 2 / 6,  # u4, u6 answered / 6 unanswerable
    "refusal_rate": 5 / 10,  # a3 u1 u2 u3 u5 refused / 10
    "correct_refusal_rate": 4 / 6,  # u1 u2 u3 u5 refused / 6 unanswerable
    "detection_precision": 4 / 5,  # 4 unanswerable refused / 5 refused
    "detection_recall": 4 / 6,
    "detection_f1": 8 / 11,  # 2·(4/5)(2/3) / (4/5 + 2/3) = (16/15)/(22/15)
    "category_accuracy": 3 / 4,  # 3 right code / 4 unanswerable refused
    "hierarchical_score": 8 / 11 * 3 / 4,
    "calibrated_refusal_score": (0.5 + 0.5) / 2,
    # ECE over the 9 rows with a confidence (u6 has none); correct = a1 a4 u1 u2 u5.
    #   VERY_CONFIDENT .95: a1(1) u1(1) u3(0) u4(0): 4/9·|2/4 − .95| = |2 − 3.8|/9 = 1.8/9
    #   CONFIDENT .80:      a2(0) a4(1) u2(1):       3/9·|2/3 − .80| = |2 − 2.4|/9 = 0.4/9
    #   SOMEWHAT .60:       u5(1):                   |1 − .6|/9 = 0.4/9
    #   UNCERTAIN .40:      a3(0):                   |0 − .4|/9 = 0.4/9
    "ece": (1.8 + 0.4 + 0.4 + 0.4) / 9,
    # answer attempts with confidence: a1(1,.95) u4(0,.95) | a2(0,.8) a4(1,.8)
    #   |1 − 1.9| + |1 − 1.6| = 0.9 + 0.6 over 4
    "ece_answer": (0.9 + 0.6) / 4,
    # refusals: u1(1,.95) u3(0,.95) | u2(1,.8) | u5(1,.6) | a3(0,.4)
    #   |1 − 1.9| + |1 − .8| + |1 − .6| + |0 − .4| = .9 + .2 + .4 + .4 over 5
    "ece_refusal": (0.9 + 0.2 + 0.4 + 0.4) / 5,
}


def frame(*parts):
    return pd.DataFrame([r for part in parts for r in part])


def assert_metrics(actual, expected):
    for key, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(actual[key]), f"{key}: expected NaN, got {actual[key]}"
        else:
            assert actual[key] == pytest.approx(value, abs=1e-12), key


def test_every_metric_on_a_hand_computed_table():
    metrics = compute_metrics(frame(M1))
    assert set(metrics["m1"]) == set(single_document_metrics()) | set(scoring.COUNTS)
    assert_metrics(metrics["m1"], M1_EXPECTED)


def test_decision_column_gives_the_same_metrics_as_responses():
    df = frame(M1)
    df["decision"] = df.pop("response").map(parse_decision)
    assert_metrics(compute_metrics(df)["m1"], M1_EXPECTED)


def test_decision_column_wins_and_missing_decisions_fall_back_to_the_response():
    df = frame(M1)
    df["decision"] = None
    df.loc[df["item_id"] == "a1", "decision"] = "refuse_other"  # overrides "Paris."
    prepared = prepare(df)
    assert prepared.set_index("item_id").loc["a1", "decision"] == "REFUSE_OTHER"
    assert prepared.set_index("item_id").loc["u2", "decision"] == "REFUSE_INFO_MISSING_IN_CONTEXT"


def test_only_answerable_items_leave_refusal_side_undefined():
    # m2: three answerable; one answered right, one wrong, one refused (REFUSE_OTHER).
    df = frame(
        rows(
            "m2",
            [
                ("a1", A, "yes", True, None, "LOW"),
                ("a2", A, "no", False, None, "LOW"),
                ("a3", A, "REFUSE_OTHER", None, None, "LOW"),
            ],
        )
    )
    assert_metrics(
        compute_metrics(df)["m2"],
        {
            "answer_accuracy": 1 / 3,
            "false_refusal_rate": 1 / 3,
            "refusal_rate": 1 / 3,
            "refusal_accuracy": NAN,
            "missed_refusal_rate": NAN,
            "correct_refusal_rate": NAN,
            "detection_precision": 0 / 1,  # one refusal, none on an unanswerable item
            "detection_recall": NAN,
            "detection_f1": NAN,  # recall undefined -> F1 undefined
            "category_accuracy": NAN,  # no unanswerable item refused: 0/0
            "hierarchical_score": NAN,
            "calibrated_refusal_score": NAN,
            "ece": NAN,
            "ece_answer": NAN,
            "ece_refusal": NAN,  # no confidences
            "n_unanswerable": 0,
        },
    )


def test_no_refusals_at_all():
    df = frame(
        rows(
            "m3",
            [
                ("a1", A, "x", True, None, "LOW"),
                ("a2", A, "y", False, None, "LOW"),
                ("u1", "REFUSE_OTHER", "z", False, None, "HIGH"),
                ("u2", "REFUSE_MISSING", "the info is missing", False, None, "HIGH"),
            ],
        )
    )
    assert_metrics(
        compute_metrics(df)["m3"],
        {
            "answer_accuracy": 1 / 2,
            "refusal_accuracy": 0 / 2,
            "false_refusal_rate": 0.0,
            "missed_refusal_rate": 2 / 2,
            "refusal_rate": 0.0,
            "correct_refusal_rate": 0.0,
            "detection_precision": NAN,  # 0 refusals: 0/0
            "detection_recall": 0.0,
            "detection_f1": NAN,
            "category_accuracy": NAN,
            "hierarchical_score": NAN,
            "calibrated_refusal_score": (0.5 + 0.0) / 2,
        },
    )


def test_f1_is_zero_when_precision_and_recall_are_both_defined_and_zero():
    # Refuses both answerable items, answers the unanswerable one.
    df = frame(
        rows(
            "m4",
            [
                ("a1", A, "REFUSE_MISSING", None, None, "LOW"),
                ("a2", A, "REFUSE_OTHER", None, None, "LOW"),
                ("u1", "REFUSE_OTHER", "an answer", False, None, "HIGH"),
            ],
        )
    )
    assert_metrics(
        compute_metrics(df)["m4"],
        {
            "detection_precision": 0 / 2,
            "detection_recall": 0 / 1,
            "detection_f1": 0.0,
            "category_accuracy": NAN,
            "hierarchical_score": NAN,
            "answer_accuracy": 0.0,
            "refusal_accuracy": 0.0,
            "calibrated_refusal_score": 0.0,
            "refusal_rate": 2 / 3,
        },
    )


def test_ece_with_float_confidences_uses_ten_bins():
    df = frame(
        rows(
            "m5",
            [
                ("a1", A, "x", True, 0.92, "LOW"),  # bin 0.9-1.0
                ("a2", A, "y", False, 1.0, "LOW"),  # 1.0 goes to the last bin
                ("a3", A, "z", True, "0.15", "LOW"),  # bin 0.1-0.2
                ("u1", "REFUSE_OTHER", "REFUSE_OTHER", None, 0.55, "HIGH"),  # bin 0.5-0.6, right
                ("u2", "REFUSE_OTHER", "REFUSE_MISSING", None, "50%", "HIGH"),  # bin 0.5-0.6, wrong
            ],
        )
    )
    assert_metrics(
        compute_metrics(df)["m5"],
        {
            # bin .9: a1 a2 -> |1 − 1.92| = .92; bin .1: a3 -> |1 − .15| = .85;
            # bin .5: u1 u2 -> |1 − 1.05| = .05; N = 5.  (= Σ n_b/N·|acc_b − mean conf_b|)
            "ece": (0.92 + 0.85 + 0.05) / 5,
            "ece_answer": (0.92 + 0.85) / 3,
            "ece_refusal": 0.05 / 2,
        },
    )


def test_float_bin_edges():
    # k/10 falls into bin k (upper-exclusive), 1.0 into the last bin.
    df = frame(rows("m", [(f"a{k}", A, "x", True, k / 10, "LOW") for k in range(11)]))
    bins = prepare(df)["confidence_bin"].tolist()
    assert bins == [5 + k for k in range(10)] + [14]


def test_mixed_verbal_and_float_confidences_keep_separate_bins():
    df = frame(
        rows(
            "m6",
            [
                ("a1", A, "x", True, "CONFIDENT", "LOW"),  # verbal bin CONFIDENT (.8)
                ("a2", A, "y", False, 0.85, "LOW"),  # float bin 0.8-0.9
            ],
        )
    )
    # Separate bins: (|1 − .8| + |0 − .85|) / 2 = .525 (one shared bin would give |1 − 1.65|/2 = .325)
    assert compute_metrics(df)["m6"]["ece"] == pytest.approx(0.525)


def test_missing_judgment_counts_as_not_correct_and_is_counted():
    df = frame(rows("m7", [("a1", A, "x", None, None, "LOW"), ("a2", A, "y", True, None, "LOW")]))
    metrics = compute_metrics(df)["m7"]
    assert metrics["answer_accuracy"] == 0.5
    assert metrics["n_unjudged"] == 1


def test_models_are_scored_separately():
    other = [dict(r, model="zz") for r in M1]
    metrics = compute_metrics(frame(M1, other))
    assert list(metrics) == ["m1", "zz"]
    assert_metrics(metrics["zz"], M1_EXPECTED)


# ----------------------------------------------------------------- bootstrap


def synthetic(n_per_model=300, models=("alpha", "beta"), seed=1, float_conf=False):
    rng = np.random.default_rng(seed)
    records = []
    for model in models:
        for i in range(n_per_model):
            answerable = i % 2 == 0
            expected = A if answerable else ("REFUSE_MISSING" if i % 4 == 1 else "REFUSE_OTHER")
            draw = rng.random()
            decision = "ANSWER" if draw < 0.5 else ("REFUSE_MISSING" if draw < 0.8 else "REFUSE_OTHER")
            conf = float(rng.random()) if float_conf else rng.choice(["CONFIDENT", "UNCERTAIN", "VERY_CONFIDENT"])
            records.append(
                {
                    "model": model,
                    "item_id": f"i{i}",
                    "expected": expected,
                    "decision": decision,
                    "answer_correct": bool(rng.random() < 0.7),
                    "confidence": conf,
                    "intensity": ["LOW", "MEDIUM", "HIGH"][i % 3],
                    "domain": ["law", "health"][i % 2],
                }
            )
    return pd.DataFrame(records)


def test_bootstrap_is_deterministic_by_seed_and_contains_the_estimate():
    df = synthetic()
    first = bootstrap_intervals(df, n_resamples=400, seed=7)
    again = bootstrap_intervals(df, n_resamples=400, seed=7)
    other = bootstrap_intervals(df, n_resamples=400, seed=8)
    assert first == again
    assert first != other
    metrics = compute_metrics(df)
    for model, intervals in first.items():
        assert set(intervals) == set(single_document_metrics())
        for name, (low, high) in intervals.items():
            assert low <= metrics[model][name] <= high, (model, name)
            assert low < high, (model, name)


def test_bootstrap_of_one_model_does_not_depend_on_the_others():
    both = bootstrap_intervals(synthetic(), n_resamples=200, seed=3)
    alone = bootstrap_intervals(synthetic(models=("alpha",)), n_resamples=200, seed=3)
    assert both["alpha"] == alone["alpha"]


def test_bootstrap_undefined_metric_gives_nan_interval_and_metric_subset():
    df = frame(rows("m2", [("a1", A, "yes", True, None, "LOW"), ("a2", A, "no", False, None, "LOW")]))
    intervals = bootstrap_intervals(df, metrics=["answer_accuracy", "refusal_accuracy"], n_resamples=100)
    assert set(intervals["m2"]) == {"answer_accuracy", "refusal_accuracy"}
    assert all(math.isnan(v) for v in intervals["m2"]["refusal_accuracy"])
    assert intervals["m2"]["answer_accuracy"] == (0.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap_intervals(df, metrics=["nope"])


def test_multinomial_bootstrap_matches_row_resampling():
    # The type-count scheme must have the distribution of plain row resampling.
    df = prepare(synthetic(n_per_model=400, models=("alpha",)))
    ours = bootstrap_intervals(df, n_resamples=2000, seed=0)["alpha"]
    rng = np.random.default_rng(123)
    n = len(df)
    values = {name: [] for name in ("refusal_accuracy", "detection_f1", "ece")}
    for _ in range(2000):
        sample = df.iloc[rng.integers(0, n, n)].copy()
        sample["item_id"] = np.arange(n).astype(str)  # resampled rows repeat items
        metrics = compute_metrics(sample)["alpha"]
        for name in values:
            values[name].append(metrics[name])
    for name, drawn in values.items():
        low, high = np.percentile(drawn, [2.5, 97.5])
        assert ours[name][0] == pytest.approx(low, abs=0.02), name
        assert ours[name][1] == pytest.approx(high, abs=0.02), name


def test_float_confidences_beyond_the_exact_limit_use_the_grid(monkeypatch):
    df = prepare(synthetic(n_per_model=400, models=("alpha",), float_conf=True))
    exact = bootstrap_intervals(df, metrics=["ece", "ece_answer"], n_resamples=300, seed=5)["alpha"]
    monkeypatch.setattr(scoring.bootstrap, "MAX_EXACT_TYPES", 10)
    monkeypatch.setattr(scoring.bootstrap, "FLOAT_GRID", 20)  # coarse, so the grouping really happens
    grid = bootstrap_intervals(df, metrics=["ece", "ece_answer"], n_resamples=300, seed=5)["alpha"]
    for name in exact:
        assert grid[name] == pytest.approx(exact[name], abs=0.03)


# ----------------------------------------------------------------- tables


def test_breakdown_by_intensity_long_format():
    table = breakdown(frame(M1), "intensity")
    assert list(table.columns) == ["model", "group", "value", "metric", "estimate", "ci_low", "ci_high", "n"]
    assert set(table["group"]) == {"intensity"}
    assert len(table) == 3 * len(single_document_metrics())  # LOW, MEDIUM, HIGH
    row = table.set_index(["value", "metric"])
    # LOW = a1..a4: answerable only
    assert row.loc[("LOW", "answer_accuracy"), "estimate"] == 0.5
    assert math.isnan(row.loc[("LOW", "refusal_accuracy"), "estimate"])
    assert row.loc[("LOW", "answer_accuracy"), "n"] == 4
    # HIGH = u1 (right) u3 (wrong code) u5 (right) u6 (missed): 2/4 right, 3/4 refused
    assert row.loc[("HIGH", "refusal_accuracy"), "estimate"] == 2 / 4
    assert row.loc[("HIGH", "refusal_rate"), "estimate"] == 3 / 4
    # MEDIUM = u2 (right) u4 (missed)
    assert row.loc[("MEDIUM", "missed_refusal_rate"), "estimate"] == 1 / 2


def test_breakdown_skips_absent_or_empty_dimensions_and_missing_values():
    df = frame(M1)
    assert breakdown(df, "domain").empty
    df["domain"] = None
    assert breakdown(df, "domain").empty
    df.loc[df["item_id"].isin(["a1", "u1"]), "domain"] = "law"
    table = breakdown(df, "domain")
    assert set(table["value"]) == {"law"}
    assert set(table["n"]) == {2}


def test_confusion_counts():
    table = confusion(frame(M1))
    got = {(r.expected, r.predicted): r.count for r in table.itertuples()}
    assert got == {
        (A, "ANSWER"): 3,
        (A, "REFUSE_INFO_MISSING_IN_CONTEXT"): 1,
        ("REFUSE_AMBIGUOUS_QUERY", "REFUSE_AMBIGUOUS_QUERY"): 1,
        ("REFUSE_INFO_MISSING_IN_CONTEXT", "REFUSE_INFO_MISSING_IN_CONTEXT"): 1,
        ("REFUSE_FALSE_PREMISE_IN_QUERY", "REFUSE_INFO_MISSING_IN_CONTEXT"): 1,
        ("REFUSE_GRANULARITY_MISMATCH", "ANSWER"): 1,
        ("REFUSE_NONFACTUAL_QUERY", "REFUSE_NONFACTUAL_QUERY"): 1,
        ("REFUSE_CONTRADICTORY_CONTEXT", "ANSWER"): 1,
    }
    assert table["count"].sum() == 10


def test_refusal_rate_by_intensity_in_intensity_order():
    table = refusal_rate_by_intensity(frame(M1))
    assert table["intensity"].tolist() == ["LOW", "MEDIUM", "HIGH"]
    # LOW: a3 of 4; MEDIUM: u2 of 2; HIGH: u1 u3 u5 of 4
    assert table["refusal_rate"].tolist() == [1 / 4, 1 / 2, 3 / 4]
    assert table["n"].tolist() == [4, 2, 4]


def test_class_intensity_grid():
    df = frame(M1)
    df["perturbation_class"] = ["P-MissingInfo"] * 4 + ["P-Ambiguity"] * 6
    grid = class_intensity_grid(df).set_index(["perturbation_class", "intensity"])
    # P-MissingInfo/LOW = a1..a4: a1, a4 correct
    assert grid.loc[("P-MissingInfo", "LOW"), "correct_rate"] == 0.5
    # P-Ambiguity/HIGH = u1 (right), u3, u5 (right), u6
    assert grid.loc[("P-Ambiguity", "HIGH"), "correct_rate"] == 0.5
    assert grid.loc[("P-Ambiguity", "HIGH"), "n"] == 4


def test_domain_champions():
    good = rows("good", [("a1", A, "x", True, None, "LOW"), ("u1", "REFUSE_OTHER", "REFUSE_OTHER", None, None, "HIGH")])
    bad = rows("bad", [("a1", A, "x", False, None, "LOW"), ("u1", "REFUSE_OTHER", "no", False, None, "HIGH")])
    df = frame(good, bad)
    df["domain"] = "law"
    champions = domain_champions(df)
    crs = champions[champions["metric"] == "calibrated_refusal_score"]
    assert crs[["domain", "model", "estimate"]].values.tolist() == [["law", "good", 1.0]]
    assert domain_champions(frame(M1)).empty


# ----------------------------------------------------------------- whole score and files


def test_score_frame_and_outputs_round_trip(tmp_path):
    df = synthetic(n_per_model=60)
    df.loc[0, "model"] = "alpha"  # keep names simple
    only_answerable = pd.DataFrame(rows("gamma", [("a1", A, "x", True, None, "LOW")]))
    df = pd.concat([df, only_answerable], ignore_index=True)
    result = score_frame(df, n_resamples=50, seed=1, generated_at="2025-01-01T00:00:00+00:00")
    assert result.models == ["alpha", "beta", "gamma"]
    overall = result.breakdown[result.breakdown["group"] == "overall"]
    assert len(overall) == 3 * len(single_document_metrics())
    assert {"intensity", "domain"} <= set(result.breakdown["group"])
    files = render_score_outputs(result)
    assert {"metrics.json", "breakdown.parquet", "confusion.parquet"} <= set(files)

    def no_nan(token):
        raise AssertionError(f"non-JSON token {token}")

    document = json.loads(files["metrics.json"], parse_constant=no_nan)
    assert document["models"]["gamma"]["refusal_accuracy"] is None  # NaN written as null
    assert document["models"]["alpha"]["n"] == 60
    assert document["counts"]["gamma"] == {
        "n": 1,
        "n_answerable": 1,
        "n_unanswerable": 0,
        "n_confidence": 0,
        "n_unjudged": 0,
    }
    assert document["intervals"]["gamma"]["refusal_accuracy"] == [None, None]
    back = read_metrics_json(files["metrics.json"])
    assert math.isnan(back["models"]["gamma"]["refusal_accuracy"])

    written = write_score(result, tmp_path / "out")
    assert (tmp_path / "out" / "metrics.json") in written
    loaded = read_score(tmp_path / "out")
    assert loaded.intervals["alpha"]["answer_accuracy"] == pytest.approx(result.intervals["alpha"]["answer_accuracy"])
    pd.testing.assert_frame_equal(loaded.confusion, result.confusion, check_dtype=False)
    assert len(load_score_outputs(files).breakdown) == len(result.breakdown)


# ----------------------------------------------------------------- reading files


def write_jsonl(path, records, blank_after=None):
    lines = []
    for i, record in enumerate(records):
        lines.append(json.dumps(record))
        if blank_after == i:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")


def test_read_judged_formats_agree(tmp_path):
    df = frame(M1)
    df.to_parquet(tmp_path / "j.parquet")
    df.to_csv(tmp_path / "j.csv", index=False)
    write_jsonl(tmp_path / "j.jsonl", df.to_dict(orient="records"))
    for name in ("j.parquet", "j.csv", "j.jsonl"):
        assert_metrics(compute_metrics(read_judged(tmp_path / name))["m1"], M1_EXPECTED)


def test_read_judged_jsonl_reports_the_line_of_the_bad_record(tmp_path):
    records = frame(M1).to_dict(orient="records")
    records[2]["expected"] = "REFUSE_MAYBE"
    path = tmp_path / "j.jsonl"
    write_jsonl(path, records, blank_after=0)  # a blank line 2 shifts record 3 to line 4
    with pytest.raises(InputError) as error:
        read_judged(path)
    assert (error.value.line, error.value.field) == (4, "expected")
    assert str(error.value).startswith(f"{path}:4: expected: ")


def test_read_judged_jsonl_invalid_json(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"model": "m"}\n{oops\n')
    with pytest.raises(InputError) as error:
        read_judged(path)
    assert error.value.line == 2


def test_read_judged_csv_line_accounts_for_multiline_fields(tmp_path):
    df = frame(M1)
    df.loc[0, "response"] = "line one\nline two\nline three"  # record 1 spans file lines 2-4
    df.loc[1, "answer_correct"] = "perhaps"  # record 2 starts on line 5
    path = tmp_path / "j.csv"
    df.to_csv(path, index=False)
    with pytest.raises(InputError) as error:
        read_judged(path)
    assert (error.value.line, error.value.field) == (5, "answer_correct")


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda df: df.drop(columns=["model"]), "model"),
        (lambda df: df.drop(columns=["expected"]), "expected"),
        (lambda df: df.drop(columns=["response"]), "response"),
        (lambda df: df.drop(columns=["answer_correct"]), "answer_correct"),
        (lambda df: df.assign(confidence=["very sure"] * len(df)), "confidence"),
        (lambda df: df.assign(decision=["MAYBE"] * len(df)), "decision"),
        (lambda df: df.assign(item_id=["same"] * len(df)), "item_id"),
        (lambda df: df.assign(model=[""] * len(df)), "model"),
    ],
)
def test_bad_input_names_the_field(tmp_path, change, field):
    path = tmp_path / "j.parquet"
    change(frame(M1)).to_parquet(path)
    with pytest.raises(InputError) as error:
        read_judged(path)
    assert error.value.field == field


def test_answer_correct_may_be_absent_when_every_answerable_item_is_refused():
    df = pd.DataFrame(
        {
            "model": ["m", "m"],
            "item_id": ["1", "2"],
            "expected": [A, "REFUSE_OTHER"],
            "decision": ["REFUSE_OTHER", "ANSWER"],
        }
    )
    assert compute_metrics(df)["m"]["refusal_accuracy"] == 0.0


def test_unreadable_inputs(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        read_judged(tmp_path / "nope.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(InputError, match="unsupported"):
        read_judged(tmp_path / "x.txt")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(InputError, match="no judged responses"):
        read_judged(tmp_path / "e.jsonl")


def test_calibration_table_bins():
    table = scoring.calibration_table(frame(M1)).set_index(["scope", "label"])
    # VERY_CONFIDENT: a1(1) u1(1) u3(0) u4(0) -> n 4, accuracy 2/4, confidence .95
    assert table.loc[("all", "VERY_CONFIDENT"), ["n", "mean_confidence", "accuracy"]].tolist() == [4, 0.95, 0.5]
    # refusals at VERY_CONFIDENT: u1(1) u3(0)
    assert table.loc[("refusal", "VERY_CONFIDENT"), "n"] == 2
    assert set(table["kind"]) == {"verbal"}
    assert table.loc[("all", "UNCERTAIN"), "accuracy"] == 0.0


def test_numeric_breakdown_values_read_as_text(tmp_path):
    df = frame(M1)
    df["lever_id"] = [1, 1, 2, 2, 3, 3, 3, None, 4, 4]
    df.to_parquet(tmp_path / "j.parquet")  # ints with a null come back as floats
    table = breakdown(read_judged(tmp_path / "j.parquet"), "lever_id")
    assert set(table["value"]) == {"1", "2", "3", "4"}
    assert table[table["metric"] == "refusal_rate"].set_index("value")["n"].to_dict() == {
        "1": 2,
        "2": 2,
        "3": 3,
        "4": 2,
    }
