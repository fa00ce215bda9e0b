"""The terminal leaderboard's layout at any width, and ``--fail-under`` parsed and checked against the metric registry."""

from __future__ import annotations

import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.metric_bars import check_bars
from refusalbench.tasks.core.text_table import plain_lines
from refusalbench.tasks.refusalbench.report.terminal_leaderboard import (
    fitted_leaderboard,
    parse_fail_under,
    run_summary_markdown,
    target_values,
)

LONG = "openrouter/meta-llama/llama-3.3-70b-instruct-turbo-2025-01-15"


def _document(models: list[str]) -> dict:
    def values(i: int) -> dict:
        return {
            "calibrated_refusal_score": 0.5 - 0.1 * i,
            "answer_accuracy": 0.75,
            "refusal_accuracy": 0.25 - 0.2 * i,
            "false_refusal_rate": 0.125,
            "missed_refusal_rate": 0.5 + 0.1 * i,
            "coverage": 1.0,
            "n": 40,
        }

    interval = {
        "calibrated_refusal_score": [0.375, 0.625],
        "answer_accuracy": [0.5, 1.0],
        "refusal_accuracy": [0.0, 0.5],
        "false_refusal_rate": [0.0, 0.25],
        "missed_refusal_rate": [0.25, 0.75],
    }
    return {
        "models": {m: values(i) for i, m in enumerate(models)},
        "intervals": {m: interval for m in models},
        "coverage": {"min_coverage": 0.95},
    }


@pytest.mark.parametrize("width", [64, 80, 100, 200])
@pytest.mark.parametrize("models", [["a", "b"], ["gpt-4o-mini", "claude-3-5-haiku"], [LONG, "small"]])
def test_the_table_fits_the_width_and_never_cuts_a_model_id(width, models):
    lines = plain_lines(fitted_leaderboard(_document(models), width))
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    for model in models:
        assert any(model in line for line in lines), (model, lines)
    text = "\n".join(lines)
    # The intervals are there, in whichever form fits: in full where there is room, abbreviated where not.
    forms = ["[37.5, 62.5]", "37.5–62.5", "38–62"]
    assert any(form in text for form in forms)
    if width == 200:
        assert "50.0% [37.5, 62.5]" in text


def test_an_id_longer_than_the_width_is_folded_not_cut():
    lines = plain_lines(fitted_leaderboard(_document([LONG]), 40))
    assert LONG in "".join(line for line in lines if not line.startswith(("#", "-", " ")) and "%" not in line)


def test_intervals_too_few_base_items_support_are_not_shown():
    """Below MIN_CLUSTERS base items an interval gives way to the count, as in the report."""
    from refusalbench.tasks.core.stats import MIN_CLUSTERS

    few = {"a": MIN_CLUSTERS - 1, "b": MIN_CLUSTERS}
    text = "\n".join(plain_lines(fitted_leaderboard(_document(["a", "b"]), 200, lambda m, metric: few[m])))
    (row_a,) = [line for line in text.splitlines() if line.split()[1:2] == ["a"]]
    (row_b,) = [line for line in text.splitlines() if line.split()[1:2] == ["b"]]
    assert f"insufficient data, n = {MIN_CLUSTERS - 1}" in row_a and "[" not in row_a
    assert "50.0% [37.5, 62.5]" not in row_a and "40.0% [37.5, 62.5]" in row_b
    assert "insufficient" not in row_b


def test_bars_by_name_or_alias_and_their_direction():
    bars = parse_fail_under(["crs=0.45", "FRR=10%", "answer_accuracy=0.75"])
    assert [(b.metric, b.value, b.lower_is_better) for b in bars] == [
        ("calibrated_refusal_score", 0.45, False),
        ("false_refusal_rate", 0.1, True),
        ("answer_accuracy", 0.75, False),
    ]
    failures = check_bars(target_values(_document(["a", "b"])), bars)
    # b: CRS 0.4 below 0.45; both: FRR 0.125 above 0.1; answer accuracy 0.75 meets 0.75.
    assert [f.line() for f in failures] == [
        "fail: a: false_refusal_rate = 0.125, above the bar 0.1",
        "fail: b: calibrated_refusal_score = 0.4, below the bar 0.45",
        "fail: b: false_refusal_rate = 0.125, above the bar 0.1",
    ]


def test_an_undefined_value_fails_its_bar():
    document = _document(["a"])
    document["models"]["a"]["calibrated_refusal_score"] = None
    (failure,) = check_bars(target_values(document), parse_fail_under(["crs=0.1"]))
    assert failure.line() == "fail: a: calibrated_refusal_score = undefined, below the bar 0.1"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("crss=0.5", "unknown metric 'crss' (did you mean 'crs'?); known: answer_accuracy"),
        ("answer_acuracy=0.5", "did you mean 'answer_accuracy'?"),
        ("crs", "expected METRIC=VALUE"),
        ("crs=", "expected METRIC=VALUE"),
        ("crs=high", "'high' is not a number"),
        ("crs=70", "write 0.7 or 70%, not 70"),
        ("crs=nan", "finite"),
    ],
)
def test_a_bad_bar_is_one_input_error_naming_the_option(text, says):
    with pytest.raises(InputError) as caught:
        parse_fail_under([text])
    assert caught.value.field == "--fail-under" and says in str(caught.value)


def test_the_run_summary_has_the_leaderboard_the_view_command_and_the_report_link(tmp_path):
    summary = run_summary_markdown(_document(["a b", "c"]), str(tmp_path / "report.html"), str(tmp_path))
    assert "| 1 | a b |" in summary and "| CRS |" in summary
    assert f"refusalbench view '{tmp_path}'" in summary or f"refusalbench view {tmp_path}" in summary
    assert f"[report.html]({(tmp_path / 'report.html').as_uri()})" in summary
    remote = run_summary_markdown(_document(["c"]), "s3://bucket/run/report.html", "s3://bucket/run")
    assert "refusalbench view s3://bucket/run" in remote and "(s3://bucket/run/report.html)" in remote
