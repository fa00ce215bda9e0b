"""The paper figures across models (report.paper_tables / paper_figures): tables checked by hand,
and each figure whose data the run lacks left out with its one-line reason.

The figures drawn from a scripted run are checked in headless Chromium by test_report_browser.py.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from refusalbench.tasks.refusalbench.report import ReportInputs, build_report
from refusalbench.tasks.refusalbench.report.paper_figures import paper_figures
from refusalbench.tasks.refusalbench.report.paper_tables import (
    aggregate_confusion,
    class_difficulty,
    confusion_by_intensity,
    dashboard_panels,
    domain_distribution,
    generation_class_ranking,
    model_domain_grid,
    prediction_shares,
    refusal_ranking,
)

MISSING, AMBIGUOUS = "REFUSE_INFO_MISSING_IN_CONTEXT", "REFUSE_AMBIGUOUS_QUERY"
CONFUSION = pd.DataFrame(
    [
        ("a", "ANSWER_CORRECTLY", "ANSWER", 3),
        ("a", AMBIGUOUS, MISSING, 2),
        ("a", MISSING, MISSING, 1),
        ("b", "ANSWER_CORRECTLY", MISSING, 1),
        ("b", AMBIGUOUS, AMBIGUOUS, 2),
        ("b", MISSING, "ANSWER", 1),
    ],
    columns=["model", "expected", "predicted", "count"],
)


def judged_row(model, item, expected, decision, intensity, outcome="ok"):
    return {
        "model": model,
        "item_id": item,
        "expected": expected,
        "decision": decision,
        "answer_correct": True if decision == "ANSWER" and expected == "ANSWER_CORRECTLY" else None,
        "confidence": None,
        "perturbation_class": "P-Ambiguity",
        "intensity": intensity,
        "lever_id": "l",
        "domain": "health",
        "generator": "g",
        "outcome": outcome,
        "treatment": "scored" if outcome == "ok" else "x",
    }


def breakdown_rows(group, metric, values):
    return pd.DataFrame(
        [
            {
                "model": m,
                "group": group,
                "value": v,
                "metric": metric,
                "estimate": e,
                "ci_low": math.nan,
                "ci_high": math.nan,
                "n": 4,
            }
            for m, v, e in values
        ]
    )


def test_paper_tables_by_hand():
    matrix = aggregate_confusion(CONFUSION)
    assert list(matrix.index) == ["ANSWER_CORRECTLY", AMBIGUOUS, MISSING]  # taxonomy order
    assert list(matrix.columns) == ["ANSWER", AMBIGUOUS, MISSING]
    assert matrix.loc[AMBIGUOUS, MISSING] == 2 and matrix.loc["ANSWER_CORRECTLY", "ANSWER"] == 3
    shares = prediction_shares(matrix)
    assert shares[MISSING] == pytest.approx(4 / 10) and shares.sum() == pytest.approx(1)

    judged = pd.DataFrame(
        [
            judged_row("a", "i1", "ANSWER_CORRECTLY", "ANSWER", "LOW"),
            judged_row("b", "i1", "ANSWER_CORRECTLY", "REFUSE_MISSING", "LOW"),
            judged_row("a", "i2", AMBIGUOUS, "REFUSE_MISSING", "HIGH"),
            judged_row("b", "i2", AMBIGUOUS, None, "HIGH", outcome="truncated"),
        ]
    )
    by_intensity = confusion_by_intensity(judged)
    assert list(by_intensity) == ["LOW", "HIGH"]
    assert by_intensity["LOW"].loc["ANSWER_CORRECTLY"].to_dict() == {"ANSWER": 1, MISSING: 1}
    assert int(by_intensity["HIGH"].to_numpy().sum()) == 1  # the truncated row is not a prediction
    assert confusion_by_intensity(judged.assign(intensity=None)) == {}

    bench = pd.DataFrame({"item_id": list("abcde"), "domain": ["health", "health", "law", "law", None]})
    table = domain_distribution(bench)
    assert table.to_dict("list") == {"domain": ["health", "law"], "items": [2, 2], "share": [0.4, 0.4]}
    assert domain_distribution(bench.drop(columns="domain")).empty

    grid = model_domain_grid(
        breakdown_rows("domain", "refusal_accuracy", [("a", "law", 0.5), ("b", "health", 1.0)]),
        "refusal_accuracy",
        ["b", "a"],
    )
    assert list(grid.index) == ["b", "a"] and grid.loc["a", "law"] == 0.5 and math.isnan(grid.loc["a", "health"])

    classes = class_difficulty(
        breakdown_rows(
            "perturbation_class",
            "refusal_accuracy",
            [
                ("a", "P-Ambiguity", 0.2),
                ("b", "P-Ambiguity", 0.4),
                ("a", "P-MissingInfo", 0.9),
                ("b", "P-MissingInfo", math.nan),
            ],
        )
    )
    assert classes["perturbation_class"].tolist() == ["P-Ambiguity", "P-MissingInfo"]  # hardest first
    assert classes.iloc[0][["mean", "min", "max", "models"]].tolist() == pytest.approx([0.3, 0.2, 0.4, 2])
    assert classes.iloc[1]["models"] == 1 and classes.iloc[1]["std"] == 0  # NaN is no model's value
    assert (
        generation_class_ranking({"pass_rate_by_class": {"P-Ambiguity": 0.9, "P-MissingInfo": 0.7}}).index[0]
        == "P-MissingInfo"
    )

    metrics = {
        "a": {"refusal_accuracy": 0.6, "hierarchical_score": 0.5, "answer_accuracy": 0.4},
        "b": {"refusal_accuracy": 0.2, "hierarchical_score": math.nan, "answer_accuracy": 0.9},
        "c": {"refusal_accuracy": math.nan, "answer_accuracy": 0.5},
    }
    ranking = refusal_ranking(metrics)
    assert ranking["model"].tolist() == ["b", "a"]  # lowest first; c has no refusal accuracy
    panels = dict(dashboard_panels(metrics))
    assert panels["Answering vs refusing"] == ("answer_accuracy", "refusal_accuracy")
    assert "Multi-document answers" not in panels and "Errors" not in panels  # no value for any model
    assert "Multi-document answers" in dict(dashboard_panels({**metrics, "d": {"hybrid_score": 0.3}}))


def test_figures_without_their_data_are_left_out_with_their_reasons():
    # No scored row, one domain, no judged rows or benchmark file: nothing can be drawn.
    metrics = {"m<1>": {"answer_accuracy": math.nan, "refusal_accuracy": math.nan, "n": 0}}
    breakdown = breakdown_rows("domain", "answer_accuracy", [("m<1>", "health", 0.5)])
    run = ReportInputs(metrics=metrics, breakdown=breakdown)
    figures = paper_figures(run, ["m<1>"])
    reasons = dict(figures.left_out)
    assert reasons == {
        "Model dashboards": "no model has a defined metric",
        "Refusal accuracy ranking": "no model has a refusal accuracy (no scored unanswerable item)",
        "Class difficulty": "no refusal accuracy per perturbation class (no scored unanswerable item)",
        "Benchmark domains": "neither benchmark.parquet nor judged rows are in this run folder",
        "Model × domain specialisation": "needs scores in at least two domains (the judged rows' domain column)",
        "Confusion across models": "no scored response in this run",
    }
    assert figures.sections == []
    one_domain = paper_figures(
        ReportInputs(metrics=metrics, benchmark=pd.DataFrame({"domain": ["health"] * 3}), confusion=CONFUSION), ["m<1>"]
    )
    assert (
        dict(one_domain.left_out)["Benchmark domains"]
        == "needs items from at least two domains (this benchmark's: health)"
    )
    assert (
        dict(one_domain.left_out)["Confusion by intensity"] == "judged.parquet is absent or its rows carry no intensity"
    )
    # Without benchmark.parquet, the judged rows' items give the domains.
    judged = pd.DataFrame([judged_row("a", "i1", "ANSWER_CORRECTLY", "ANSWER", None)])
    from_judged = paper_figures(ReportInputs(metrics=metrics, judged=judged), ["m<1>"])
    assert (
        dict(from_judged.left_out)["Benchmark domains"]
        == "needs items from at least two domains (this benchmark's: health)"
    )

    page = build_report(run)
    assert "<h2>Figures not drawn</h2>" in page
    assert "<b>Benchmark domains</b>: neither benchmark.parquet nor judged rows are in this run folder." in page
    assert "Figures not drawn" not in build_report(ReportInputs(metrics={}))  # no model: no figure to miss
