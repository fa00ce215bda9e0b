"""The leaderboard a finished run prints in the terminal, and the bars ``--fail-under`` checks.

Read from the run's metrics.json: one row per target, ranked as the report ranks them
(``report.leaderboard``), with CRS, answer and refusal accuracy, the false and missed refusal
rates (each with its 95% interval) and the coverage. Labels, formats and which way each metric
is better come from the metric declarations (``scoring.paper_metrics``); the layout fits the
terminal's width without cutting a model's name (``core.text_table``); a target that names one of
the paper's models gets a line after the table with the paper's own figures (:func:`paper_lines`).
``--fail-under`` may name any declared metric, by its metrics.json name or an alias (``crs``,
``frr``, ``mrr``).
:func:`run_summary_markdown` is the same run's summary for the Prefect UI: the report's
leaderboard as markdown, the viewer command and the report's link (``core.where_to_look``).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from refusalbench.tasks.core.html_page import is_nan
from refusalbench.tasks.core.metric_bars import MetricBar, parse_bars
from refusalbench.tasks.core.stats import MIN_CLUSTERS, enough_clusters
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.core.text_table import Cell, Column, FittedTable, fit_table
from refusalbench.tasks.core.where_to_look import summary_markdown
from refusalbench.tasks.refusalbench.report.leaderboard import (
    format_interval,
    format_value,
    leaderboard_markdown,
    model_ranks,
)
from refusalbench.tasks.refusalbench.report.reference_section import terminal_lines
from refusalbench.tasks.refusalbench.report.support import ClusterSupport
from refusalbench.tasks.refusalbench.schema.artifacts import BENCHMARK, JUDGED
from refusalbench.tasks.refusalbench.scoring.result import DEFAULT_MIN_COVERAGE
from refusalbench.tasks.refusalbench.scoring.specs import (
    METRIC_SPECS,
    all_metrics,
    coverage_metrics,
    metric_aliases,
    metric_spec,
)

# The columns, after the rank and the model; coverage last, without an interval (it has none).
TERMINAL_METRICS = (
    "calibrated_refusal_score",
    "answer_accuracy",
    "refusal_accuracy",
    "false_refusal_rate",
    "missed_refusal_rate",
    "coverage",
)


def _detail_forms(interval: Any, metric: str) -> tuple[str, ...]:
    """An interval from its fullest form to its shortest: ``[50.0, 75.0]``, ``50.0–75.0``, ``50–75``."""
    full = format_interval(tuple(interval) if interval else None, metric)
    if not full:
        return ()
    low, high = (float(v) for v in interval)
    if metric_spec(metric).percent:
        return full, f"{100 * low:.1f}–{100 * high:.1f}", f"{100 * low:.0f}–{100 * high:.0f}"
    return full, f"{low:.3f}–{high:.3f}", f"{low:.2f}–{high:.2f}"


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _min_coverage(document: Mapping[str, Any]) -> float:
    return float((document.get("coverage") or {}).get("min_coverage", DEFAULT_MIN_COVERAGE))


# Base items behind a model's metric (``report.support.ClusterSupport.model``).
Support = Callable[[str, str], int]


def _guarded_forms(interval: Any, metric: str, units: int | None) -> tuple[str, ...]:
    """The interval's forms, or "n = K" where fewer than MIN_CLUSTERS base items support it
    (the report's guardrail: a bootstrap over so few units gives intervals that are too narrow)."""
    if units is not None and not enough_clusters(units) and interval:
        return (f"(insufficient data, n = {units})", f"(n = {units})")
    return _detail_forms(interval, metric)


def fitted_leaderboard(document: Mapping[str, Any], width: int, support: Support | None = None) -> FittedTable:
    """The leaderboard of metrics.json laid out for ``width`` characters (``core.text_table.fit_table``);
    ``support`` counts each model's base items, to leave out the intervals too few of them support."""
    models = target_values(document)
    intervals = document.get("intervals") or {}
    min_coverage = _min_coverage(document)
    columns = [Column("#"), Column("Model", align="left")]
    columns += [Column(metric_spec(name).label) for name in TERMINAL_METRICS]
    rows = []
    for model, rank in model_ranks(models, min_coverage):
        cells = [Cell("—" if rank is None else str(rank)), Cell(model)]
        for name in TERMINAL_METRICS:
            interval = (intervals.get(model) or {}).get(name)
            shown = interval if interval and not any(is_nan(_number(v)) for v in interval) else None
            units = support(model, name) if support is not None and shown else None
            cells.append(Cell(format_value(models[model].get(name), name), _guarded_forms(shown, name, units)))
        rows.append(cells)
    return fit_table(columns, rows, width, key=1)


def leaderboard_note(width: int) -> list[str]:
    """The lines under the table: what the brackets are, which way is better."""
    lower = [metric_spec(n).label for n in TERMINAL_METRICS if metric_spec(n).higher_is_better is False]
    text = (
        "Intervals: 95% cluster bootstrap over base items "
        f"(not shown where fewer than {MIN_CLUSTERS} base items support them). "
        f"Lower is better for {' and '.join(lower)}; higher for the rest. "
        "Unranked (—): scored on too few of its rows."
    )
    return textwrap.wrap(text, width=max(width, 20))


def paper_lines(document: Mapping[str, Any], width: int) -> list[str]:
    """After the table: for each target that names one of the paper's models, the paper's own figures
    for the table's columns, each with its source (``report.reference_section``)."""
    order = [model for model, _ in model_ranks(target_values(document), _min_coverage(document))]
    return terminal_lines(document, TERMINAL_METRICS, order, width)


def target_values(document: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{target: {metric: value}} of metrics.json (undefined: NaN), for ``--fail-under``."""
    return {m: {k: _number(v) for k, v in values.items()} for m, values in (document.get("models") or {}).items()}


def gate_metrics() -> dict[str, bool | None]:
    """The metrics a bar may name: {name: higher is better (None: neither way)}."""
    return {name: metric_spec(name).higher_is_better for name in (*all_metrics(), *coverage_metrics())}


def parse_fail_under(texts: Iterable[str]) -> list[MetricBar]:
    """``--fail-under`` bars against the declared metrics (InputError, exit 2, on a bad one)."""
    shares = [name for name, spec in METRIC_SPECS.items() if spec.percent]
    return parse_bars(texts, gate_metrics(), metric_aliases(), shares)


def run_summary_markdown(document: Mapping[str, Any], report: str, run_folder: str, title: str = "Run summary") -> str:
    """The run's summary for the Prefect UI: the leaderboard (the report's, as markdown), the viewer
    command and the report's link."""
    table = leaderboard_markdown(
        target_values(document),
        document.get("intervals") or {},
        min_coverage=_min_coverage(document),
        pairwise=document.get("pairwise") or None,
    )
    return summary_markdown(title, table, report, run_folder)


def base_item_support(run_folder: str, document: Mapping[str, Any]) -> Support:
    """Each model's base items behind a metric, counted from the run folder's judged rows and
    benchmark as the report counts them (without them: metrics.json's rows, each its own unit)."""
    store = ArtifactStore(run_folder)
    judged = store.read_frame(JUDGED.name) if store.exists(JUDGED.name) else None
    benchmark = store.read_frame(BENCHMARK.name) if store.exists(BENCHMARK.name) else None
    return ClusterSupport(judged, benchmark, document.get("models") or {}).model
