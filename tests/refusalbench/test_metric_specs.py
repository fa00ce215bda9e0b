"""A metric is declared once (``scoring.specs.MetricSpec``): adding one is one declaration, and the
scores, intervals, breakdowns, metrics.json, leaderboard, comparison figures and inspect metrics follow.

Each test declares its metric inside the test and removes it after, so no other test sees it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pytest

from refusalbench.tasks.integrations.inspect.bridge import sample_metrics
from refusalbench.tasks.refusalbench.report import leaderboard_markdown, leaderboard_metrics, leaderboard_rows
from refusalbench.tasks.refusalbench.report.comparison_figures import ModelFacts, compared_metrics, scaling_table
from refusalbench.tasks.refusalbench.schema.records import Judgment
from refusalbench.tasks.refusalbench.scoring import (
    METRIC_SPECS,
    METRICS_FILE,
    MetricSpec,
    all_metrics,
    declare,
    formula_metric,
    render_score_outputs,
    score_frame,
    single_document_metrics,
)
from tests.refusalbench.test_scoring import M1, assert_metrics, frame, synthetic

SHARE = "false_refusal_share"


@pytest.fixture
def false_refusal_share() -> Iterator[MetricSpec]:
    """A new ratio metric, one declaration: of the refusals, the share on answerable items."""
    spec = declare(
        MetricSpec(
            SHARE,
            label="False refusal share",
            numerator=("answerable_refused",),
            denominator=("refused",),
            higher_is_better=False,
            leaderboard=True,
        )
    )
    yield spec
    METRIC_SPECS.remove(SHARE)


def test_a_ratio_metric_is_one_declaration(false_refusal_share):
    result = score_frame(frame(M1), n_resamples=200, seed=1, generated_at="fixed")
    # M1 refuses a3 u1 u2 u3 u5; a3 is the one answerable item among them.
    assert result.metrics["m1"][SHARE] == pytest.approx(1 / 5)
    assert all_metrics().index(SHARE) == len(single_document_metrics()) - 1  # after §6's, before GaRAGe's

    low, high = result.intervals["m1"][SHARE]  # the per-model bootstrap
    assert 0 <= low <= 1 / 5 <= high <= 1 and low < high
    assert result.standard_errors["m1"][SHARE] > 0

    # Breakdown rows with a Wilson interval: LOW (a1..a4) refuses only a3, an answerable item: 1/1.
    row = result.breakdown.query("group == 'intensity' and value == 'LOW' and metric == @SHARE").iloc[0]
    assert row["estimate"] == 1.0 and row["ci_high"] == 1.0 and 0 < row["ci_low"] < 1
    assert len(result.breakdown.query("group == 'overall' and metric == @SHARE")) == 1

    document = json.loads(render_score_outputs(result)[METRICS_FILE])
    assert document["models"]["m1"][SHARE] == pytest.approx(1 / 5)
    assert document["intervals"]["m1"][SHARE] == [pytest.approx(low), pytest.approx(high)]

    # The leaderboard: a column after the built-in ones, its label in the markdown header.
    assert leaderboard_metrics(result.metrics)[-1] == (SHARE, "False refusal share")
    (board,) = leaderboard_rows(result.metrics, result.intervals)
    assert board[SHARE] == 0.2
    markdown = leaderboard_markdown(result.metrics, result.intervals)
    assert "| ECE | False refusal share | n |" in markdown and "20.0% [" in markdown.splitlines()[2]


def test_a_second_declaration_of_a_name_raises_unless_replacing(false_refusal_share):
    with pytest.raises(ValueError, match="metric 'false_refusal_share' is already registered"):
        declare(MetricSpec(SHARE, label="Other", numerator=("refused",), denominator=("n",)))
    declare(MetricSpec(SHARE, label="Share", numerator=("refused",), denominator=("n",)), replace=True)
    assert score_frame(frame(M1), n_resamples=0).metrics["m1"][SHARE] == pytest.approx(5 / 10)


def test_a_formula_metric_is_one_function_and_one_decorator():
    try:

        @formula_metric(
            "balanced_error",
            label="Balanced error",
            of=("false_refusal_rate", "missed_refusal_rate"),
            higher_is_better=False,
            compared=True,
        )
        def balanced_error(frr: np.ndarray, mrr: np.ndarray) -> np.ndarray:
            return (frr + mrr) / 2

        result = score_frame(frame(M1), n_resamples=200, seed=1)
        assert_metrics(result.metrics["m1"], {"balanced_error": (1 / 4 + 2 / 6) / 2})
        low, high = result.intervals["m1"]["balanced_error"]
        assert low <= (1 / 4 + 2 / 6) / 2 <= high
        # Breakdown rows: a formula's interval is a bootstrap within the group.
        table = score_frame(synthetic(n_per_model=80), n_resamples=100, seed=1).breakdown
        grouped = table.query("metric == 'balanced_error' and group != 'overall' and estimate.notna()")
        assert not grouped.empty and grouped[["ci_low", "ci_high"]].notna().all().all()
        # The comparison figures draw it, under its title.
        assert compared_metrics()[-1] == ("balanced_error", "Balanced error")
        facts = {"m-1b": ModelFacts("m-1b", "fam", 1.0), "m-7b": ModelFacts("m-7b", "fam", 7.0)}
        scaling = scaling_table({m: result.metrics["m1"] for m in facts}, facts)
        assert scaling["balanced_error"].tolist() == [pytest.approx((1 / 4 + 2 / 6) / 2)] * 2
    finally:
        METRIC_SPECS.remove("balanced_error")


def test_inspect_metrics_are_the_declared_ones_computed_from_judgments(false_refusal_share):
    """The inspect task's metrics go through ``score``'s own computation, a new declaration included."""
    verdicts = [
        ("a1", "ANSWER_CORRECTLY", "ANSWER", True),
        ("a2", "ANSWER_CORRECTLY", "REFUSE_MISSING", False),
        ("a3", "ANSWER_CORRECTLY", "ANSWER", False),
        ("u1", "REFUSE_MISSING", "REFUSE_MISSING", None),
        ("u2", "REFUSE_OTHER", "ANSWER", False),
        ("u3", "REFUSE_OTHER", "REFUSE_MISSING", None),
    ]
    payloads = [
        {
            "judgment": Judgment(
                item_id=item, model="m", expected=expected, decision=decision, answer_correct=correct
            ).model_dump(mode="json"),
            "variant": "single",
        }
        for item, expected, decision, correct in verdicts
    ]
    failed = Judgment(item_id="a4", model="m", expected="ANSWER_CORRECTLY", decision="ANSWER", error="judge failed")
    payloads += [{"judgment": failed.model_dump(mode="json"), "variant": "single"}, None]  # both left out
    names = ["refusal_rate", "false_refusal_rate", "missed_refusal_rate", SHARE]
    assert sample_metrics(payloads, names) == pytest.approx(
        {"refusal_rate": 3 / 6, "false_refusal_rate": 1 / 3, "missed_refusal_rate": 1 / 3, SHARE: 1 / 3}
    )
    assert all(math.isnan(v) for v in sample_metrics([None], names).values())


def test_a_declaration_that_cannot_be_computed_is_refused():
    with pytest.raises(ValueError, match="unknown statistic 'refusals'.*known: n, n_answerable"):
        MetricSpec("x", label="X", numerator=("refusals",), denominator=("n",))
    with pytest.raises(ValueError, match="give a numerator and a denominator, or a formula"):
        MetricSpec("x", label="X", numerator=("refused",))
    with pytest.raises(ValueError, match="a ratio or a formula, not both"):
        MetricSpec("x", label="X", numerator=("refused",), denominator=("n",), formula=lambda s: s)
    with pytest.raises(ValueError, match="a function of 'later', which must be declared before it"):
        declare(MetricSpec("x", label="X", formula=lambda a: a, of=("later",)))
    assert "x" not in METRIC_SPECS


def test_the_built_in_declarations_give_the_published_layout():
    """metrics.json's order and the leaderboard's columns (DESIGN.md §6) as they were before the declarations."""
    assert all_metrics() == (
        "answer_accuracy",
        "refusal_accuracy",
        "false_refusal_rate",
        "missed_refusal_rate",
        "refusal_rate",
        "correct_refusal_rate",
        "detection_precision",
        "detection_recall",
        "detection_f1",
        "category_accuracy",
        "hierarchical_score",
        "calibrated_refusal_score",
        "ece",
        "ece_answer",
        "ece_refusal",
        "answer_quality_score",
        "hybrid_score",
        "eligibility_rate",
        "factuality_rate",
        "raf_rate",
    )
    single = {"m": {"answer_quality_score": math.nan}}
    assert leaderboard_metrics(single) == (
        ("calibrated_refusal_score", "CRS"),
        ("answer_accuracy", "Answer acc."),
        ("refusal_accuracy", "Refusal acc."),
        ("false_refusal_rate", "FRR"),
        ("missed_refusal_rate", "MRR"),
        ("detection_f1", "Detection F1"),
        ("category_accuracy", "Category acc."),
        ("hierarchical_score", "Hierarchical"),
        ("ece", "ECE"),
    )
    multi = leaderboard_metrics({"m": {"answer_quality_score": 0.5, "hybrid_score": 0.4}})
    assert multi[-2:] == (("answer_quality_score", "Answer quality"), ("hybrid_score", "Hybrid"))
    assert [name for name, _ in compared_metrics()] == [
        "answer_accuracy",
        "refusal_accuracy",
        "calibrated_refusal_score",
    ]
