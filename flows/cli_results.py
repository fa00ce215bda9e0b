"""What ``run``, ``evaluate``, ``refresh`` and ``knowornot run`` print when their flow ends, and
``--fail-under``.

The leaderboard (RefusalBench) or the rates (KnowOrNot) from the run folder's metrics.json, fitted
to the terminal's width (``COLUMNS`` or 80 when piped): a styled table on a terminal, plain text
otherwise. Then where to look: the metrics and report, the ``refusalbench view`` command, the flow
run's Prefect page. Then the ``--fail-under`` bars: each target worse than a bar is one line on
stderr, and the command exits 1. The bars are parsed before the flow starts (exit 2 on a bad one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from refusalbench.flows.listing import print_fitted
from refusalbench.tasks.core.metric_bars import MetricBar, check_bars
from refusalbench.tasks.core.where_to_look import where_to_look

if TYPE_CHECKING:
    from refusalbench.flows.results import EvaluationResult, MainResult, RefreshResult

FAIL_UNDER_HELP = (
    "METRIC=VALUE (repeatable): exit 1 when a target's METRIC, as named in metrics.json (or crs, frr, "
    "mrr), is worse than VALUE; on metrics.json's scale, a share from 0 to 1 (0.7, or 70%). Worse is "
    "below the bar, except for metrics where lower is better (false_refusal_rate, missed_refusal_rate, "
    "ece, the non-response rates): above it. An undefined value fails."
)
KNOWORNOT_FAIL_UNDER_HELP = (
    "METRIC=VALUE (repeatable): exit 1 when a configuration's abstention_rate or factuality_rate is "
    "below VALUE, a share from 0 to 1 (0.7, or 70%). An undefined value fails."
)


def refusalbench_bars(texts: list[str] | None) -> list[MetricBar]:
    """The ``--fail-under`` bars of a RefusalBench command, checked before anything runs."""
    from refusalbench.tasks.refusalbench.report.terminal_leaderboard import parse_fail_under

    return parse_fail_under(texts or [])


def knowornot_bars(texts: list[str] | None) -> list[MetricBar]:
    """The ``--fail-under`` bars of ``knowornot run``, checked before anything runs."""
    from refusalbench.tasks.knowornot.report.terminal_rates import parse_fail_under

    return parse_fail_under(texts or [])


def _metrics(run_folder: str, name: str) -> tuple[dict[str, Any], str]:
    """The run folder's metrics document ``name`` (as its method declares it), and its URI."""
    from refusalbench.tasks.core.store import ArtifactStore

    store = ArtifactStore(run_folder)
    return dict(json.loads(store.read_bytes(name))), store.uri(name)


def _lines(out: Console, lines: list[str]) -> None:
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _check(err: Console, values: Mapping[str, Mapping[str, float]], bars: list[MetricBar]) -> None:
    failures = check_bars(values, bars)
    for failure in failures:
        err.print(failure.line(), markup=False, highlight=False)
    if failures:
        err.print(f"--fail-under: {len(failures)} bar(s) not met", markup=False, highlight=False)
        raise typer.Exit(1)


def round_folder(out_root: str, round_id: str) -> str:
    """A refresh round's run folder under ``out_root``."""
    from refusalbench.tasks.core.store import ArtifactStore

    return ArtifactStore(out_root).child(round_id).root


def print_leaderboard(
    out: Console,
    err: Console,
    run_folder: str,
    report: str,
    bars: list[MetricBar],
    incomplete: tuple[EvaluationResult | MainResult | RefreshResult, bool] | None = None,
) -> None:
    """A RefusalBench run's leaderboard and where to look; then, given ``incomplete`` (the flow's
    result and ``--strict``), the line naming its incomplete targets (strict: exit 1); then the
    bars (exit 1 when one is not met)."""
    from refusalbench.flows.launch import incomplete_line, last_flow_run_page
    from refusalbench.tasks.refusalbench.report.terminal_leaderboard import (
        base_item_support,
        fitted_leaderboard,
        leaderboard_note,
        paper_lines,
        target_values,
    )
    from refusalbench.tasks.refusalbench.schema.artifacts import METRICS

    document, metrics = _metrics(run_folder, METRICS.name)
    support = base_item_support(run_folder, document)
    print_fitted(out, fitted_leaderboard(document, out.width, support), leaderboard_note(out.width))
    paper = paper_lines(document, out.width)  # the paper's own figures of targets it also ran
    if paper:
        out.print()
        _lines(out, paper)
    out.print()
    _lines(out, where_to_look(report, run_folder, last_flow_run_page(), metrics))
    if incomplete is not None and (line := incomplete_line(*incomplete)):
        err.print(line, markup=False, highlight=False)
    _check(err, target_values(document), bars)


def print_rates(out: Console, err: Console, run_folder: str, report: str, bars: list[MetricBar]) -> None:
    """A KnowOrNot run's rates and where to look; exit 1 when a bar is not met."""
    from refusalbench.flows.launch import last_flow_run_page
    from refusalbench.tasks.knowornot.report.terminal_rates import fitted_rates, rates_note, target_values
    from refusalbench.tasks.knowornot.schema.artifacts import KON_METRICS

    document, metrics = _metrics(run_folder, KON_METRICS.name)
    print_fitted(out, fitted_rates(document, out.width), rates_note(out.width))
    out.print()
    _lines(out, where_to_look(report, run_folder, last_flow_run_page(), metrics))
    _check(err, target_values(document), bars)
