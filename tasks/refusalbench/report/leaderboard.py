"""The leaderboard: models ranked by calibrated refusal score, and how metric values print.

:func:`leaderboard_rows` (JSON-safe dicts) and :func:`leaderboard_markdown` feed the Prefect
table and markdown artifacts; the HTML page shows the same ranking. The columns and their
labels come from the metric declarations (``scoring.metrics``: ``leaderboard=True``).
Percentages print with one decimal, a metric declared ``percent=False`` (ECE) as a plain
number with three; an undefined value prints as "—".

A model scored on less than ``min_coverage`` of its rows (``coverage`` in its metrics: the
scored share; the rest were truncated, blocked, too long, empty or failed) is *incomplete*: it
is listed after the ranked models with its coverage and no rank, never ranked silently beside
models scored on every item. Metrics without ``coverage`` (scored before outcomes were
recorded) count as complete.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.core.html_page import is_nan
from refusalbench.tasks.refusalbench.scoring.metrics import (
    METRIC_SPECS,
    metric_spec,
    multi_document_metrics,
    single_document_metrics,
)
from refusalbench.tasks.refusalbench.scoring.result import DEFAULT_MIN_COVERAGE

RANK_METRIC = "calibrated_refusal_score"
COMPLETE, INCOMPLETE = "complete", "incomplete"


def incomplete_models(metrics: Mapping[str, Mapping[str, float]],
                      min_coverage: float = DEFAULT_MIN_COVERAGE) -> dict[str, float]:
    """{model: coverage} of the models scored on less than ``min_coverage`` of their rows."""
    out = {}
    for model, values in metrics.items():
        coverage = values.get("coverage")
        if coverage is not None and not is_nan(coverage) and float(coverage) < min_coverage:
            out[model] = float(coverage)
        elif coverage is not None and is_nan(coverage):
            out[model] = 0.0  # no row at all: nothing was scored
    return out


def incomplete_note(coverage: float) -> str:
    """How an incomplete model is marked beside its name."""
    return f"incomplete: {100 * coverage:.1f}% of rows scored"


def leaderboard_metrics(metrics: Mapping[str, Mapping[str, float]]) -> tuple[tuple[str, str], ...]:
    """The leaderboard's columns as (metric, label): :data:`RANK_METRIC`, then the other metrics
    declared ``leaderboard=True`` in declaration order; a multi-document (GaRAGe) one only when
    some model in ``metrics`` ({model: {metric: value}}) has a value for it."""
    single = [n for n in single_document_metrics() if metric_spec(n).leaderboard and n != RANK_METRIC]
    multi = [n for n in multi_document_metrics() if metric_spec(n).leaderboard
             and any(not is_nan(values.get(n)) for values in metrics.values())]
    return tuple((name, metric_spec(name).label) for name in [RANK_METRIC, *single, *multi])


def shown_as_percent(name: str) -> bool:
    """Whether values of ``name`` print as percentages: a metric as declared; any other share
    (a pass rate, an agreement) does."""
    spec = METRIC_SPECS.get(name)
    return spec is None or spec.percent


def ranked_models(metrics: Mapping[str, Mapping[str, float]], min_coverage: float = DEFAULT_MIN_COVERAGE) -> list[str]:
    """Models by calibrated refusal score, best first; undefined scores last, ties by name; then
    the incomplete models (:func:`incomplete_models`), most covered first, which get no rank."""
    incomplete = incomplete_models(metrics, min_coverage)

    def key(model: str) -> tuple[int, float, str]:
        if model in incomplete:
            return (2, -incomplete[model], model)
        score = metrics[model].get(RANK_METRIC, math.nan)
        return (1, 0.0, model) if is_nan(score) else (0, -float(score), model)

    return sorted(metrics, key=key)


def model_ranks(metrics: Mapping[str, Mapping[str, float]],
                min_coverage: float = DEFAULT_MIN_COVERAGE) -> list[tuple[str, int | None]]:
    """(model, rank) in :func:`ranked_models`' order; an incomplete model's rank is None."""
    incomplete = incomplete_models(metrics, min_coverage)
    ranked = [m for m in ranked_models(metrics, min_coverage) if m not in incomplete]
    return [(m, i) for i, m in enumerate(ranked, start=1)] + [
        (m, None) for m in ranked_models(metrics, min_coverage) if m in incomplete]


def _rounded(value: Any, digits: int = 4) -> float | None:
    return None if is_nan(value) else round(float(value), digits)


def leaderboard_rows(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
    standard_errors: Mapping[str, Mapping[str, float]] | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> list[dict[str, Any]]:
    """One JSON-safe dict per model, ranked (for a Prefect table artifact); NaN -> None.

    With ``standard_errors``, each row also carries the CRS's bootstrap standard error. Each
    row says its ``status`` (complete | incomplete) and ``coverage``; an incomplete model comes
    after the ranked ones with ``rank`` None.
    """
    intervals = intervals or {}
    incomplete = incomplete_models(metrics, min_coverage)
    rows = []
    for model, rank in model_ranks(metrics, min_coverage):
        values = metrics[model]
        row: dict[str, Any] = {"rank": rank, "model": model,
                               "status": INCOMPLETE if model in incomplete else COMPLETE,
                               "coverage": _rounded(values.get("coverage", 1.0))}
        for name, _ in leaderboard_metrics(metrics):
            row[name] = _rounded(values.get(name))
        low, high = intervals.get(model, {}).get(RANK_METRIC, (None, None))
        row["crs_ci_low"], row["crs_ci_high"] = _rounded(low), _rounded(high)
        if standard_errors is not None:
            row["crs_se"] = _rounded(standard_errors.get(model, {}).get(RANK_METRIC))
        row["n"] = int(values.get("n", 0))
        rows.append(row)
    return rows


def format_value(value: Any, metric: str) -> str:
    """A metric value for a table cell: a percentage, or three decimals for ECE; "—" if undefined."""
    if is_nan(value):
        return "—"
    return f"{100 * float(value):.1f}%" if shown_as_percent(metric) else f"{float(value):.3f}"


def format_interval(interval: tuple[float, float] | None, metric: str) -> str:
    """An interval in the same units as :func:`format_value`; "" if absent or undefined."""
    if not interval or is_nan(interval[0]) or is_nan(interval[1]):
        return ""
    low, high = interval
    if not shown_as_percent(metric):
        return f"[{low:.3f}, {high:.3f}]"
    return f"[{100 * low:.1f}, {100 * high:.1f}]"


def _markdown_cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|").replace("`", "\\`").replace("\n", " ")


def leaderboard_markdown(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> str:
    """The leaderboard as a markdown table (for a Prefect markdown artifact); incomplete models
    last, unranked ("—"), marked with their coverage."""
    intervals = intervals or {}
    columns = leaderboard_metrics(metrics)
    incomplete = incomplete_models(metrics, min_coverage)
    header = ["#", "Model", *(label for _, label in columns), "n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, rank in model_ranks(metrics, min_coverage):
        values = metrics[model]
        name = _markdown_cell(model)
        if model in incomplete:
            name += f" **({incomplete_note(incomplete[model])})**"
        cells = ["—" if rank is None else str(rank), name]
        for name, _ in columns:
            cell = format_value(values.get(name), name)
            ci = format_interval(intervals.get(model, {}).get(name), name)
            cells.append(f"{cell} {ci}".strip())
        cells.append(str(int(values.get("n", 0))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
