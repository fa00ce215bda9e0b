"""KnowOrNot's terminal rates and ``--fail-under`` on its rates."""

from __future__ import annotations

import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.metric_bars import check_bars
from refusalbench.tasks.core.text_table import plain_lines
from refusalbench.tasks.knowornot.report.terminal_rates import (
    fitted_rates,
    parse_fail_under,
    rates_markdown,
    target_values,
)


def _row(target: str, retrieval: str, abstention: float, factuality: float | None, prompt: str = "basic") -> dict:
    return {
        "target": target,
        "retrieval": retrieval,
        "prompt": prompt,
        "n": 12,
        "abstention_rate": abstention,
        "abstention_ci_low": max(abstention - 0.2, 0.0),
        "abstention_ci_high": min(abstention + 0.2, 1.0),
        "factuality_rate": factuality,
        "factuality_ci_low": None if factuality is None else factuality - 0.1,
        "factuality_ci_high": None if factuality is None else factuality + 0.1,
    }


DOCUMENT = {
    "configurations": [
        _row("local-qwen-2.5-7b-instruct-q4", "direct", 0.25, 0.5),
        _row("local-qwen-2.5-7b-instruct-q4", "hyde", 0.5, None),
        _row("tiny", "direct", 0.75, 0.9),
    ]
}


@pytest.mark.parametrize("width", [60, 80, 120])
def test_one_row_per_target_and_retrieval_fitted_to_the_width(width):
    lines = plain_lines(fitted_rates(DOCUMENT, width))
    assert max(len(line) for line in lines) <= width
    assert sum("local-qwen-2.5-7b-instruct-q4" in line for line in lines) == 2
    # The target beside its values, or (where the width is short) on the line above them.
    assert any(
        "direct" in line and "75.0%" in line and ("tiny" in line or lines[i - 1] == "tiny")
        for i, line in enumerate(lines)
    )
    assert "Prompt" not in "\n".join(lines)  # one prompt: no column for it


def test_fail_under_names_each_configuration_below_its_bar():
    bars = parse_fail_under(["abstention=0.5", "factuality_rate=60%"])
    lines = [f.line() for f in check_bars(target_values(DOCUMENT), bars)]
    assert lines == [
        "fail: local-qwen-2.5-7b-instruct-q4 (direct): abstention_rate = 0.25, below the bar 0.5",
        "fail: local-qwen-2.5-7b-instruct-q4 (direct): factuality_rate = 0.5, below the bar 0.6",
        "fail: local-qwen-2.5-7b-instruct-q4 (hyde): factuality_rate = undefined, below the bar 0.6",
    ]


def test_an_unknown_rate_lists_the_known_ones():
    with pytest.raises(InputError) as caught:
        parse_fail_under(["abstension=0.5"])
    assert "did you mean 'abstention'?" in str(caught.value) and "abstention_rate, factuality" in str(caught.value)


def test_the_markdown_table_has_every_configuration():
    table = rates_markdown(DOCUMENT)
    assert (
        table.count("| local-qwen-2.5-7b-instruct-q4 |") == 2
        and "| tiny | direct | basic | 75.0% [55.0, 95.0]" in table
    )
