"""The leaderboard and breakdown tables of the report, each interval behind the small-sample guardrail.

A cell shows its estimate always; beneath it, its 95% interval where enough base items support it
(``core.stats.MIN_CLUSTERS``), else "insufficient data (n = K)" (:mod:`.support`). The leaderboard's
rank range and group are significance results: they follow the same rule on the model's CRS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from refusalbench.tasks.core.charts import ordered
from refusalbench.tasks.core.html_page import escape, insufficient_data
from refusalbench.tasks.core.stats import enough_clusters
from refusalbench.tasks.refusalbench.report.leaderboard import (
    RANK_METRIC,
    format_interval,
    format_value,
    group_text,
    incomplete_models,
    incomplete_note,
    leaderboard_metrics,
    model_ranks,
    rank_range_text,
    significance,
)
from refusalbench.tasks.refusalbench.report.support import ClusterSupport, guarded_ci
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES

BREAKDOWN_DIMENSIONS = ("perturbation_class", "intensity", "lever_id", "domain", "generator")
DIMENSION_TITLES = {
    "perturbation_class": "perturbation class",
    "intensity": "intensity",
    "lever_id": "lever",
    "domain": "domain",
    "generator": "generator",
}
_SHOWN = ("answer_accuracy", "refusal_accuracy")
_CELL_COLUMNS = ("model", "group", "value", "metric", "estimate", "ci_low", "ci_high")  # ci_*: optional


def leaderboard_html(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]],
    pairwise: Mapping[str, Any] | None,
    min_coverage: float,
    support: ClusterSupport,
    beside: Mapping[str, tuple[str, Mapping[str, str]]] | None = None,
) -> str:
    """The leaderboard table: rank, model, rank range and group (with pairwise comparisons), each
    leaderboard metric with its interval, the rows scored and the base items behind them.

    ``beside``: {model: (name cell, {metric: cell})}, a row under that model's (the paper's figures)."""
    columns = leaderboard_metrics(metrics)
    groups = significance(metrics, pairwise, min_coverage) if pairwise else None
    head = (
        "<tr><th>#</th><th class='name'>Model</th>"
        + ("<th>Rank range</th><th>Group</th>" if groups is not None else "")
        + "".join(f"<th>{escape(label)}</th>" for _, label in columns)
        + "<th>n</th><th>base items</th></tr>"
    )
    rows = []
    incomplete = incomplete_models(metrics, min_coverage)
    for model, rank in model_ranks(metrics, min_coverage):
        values = metrics[model]
        mark = f" <span class='ci'>({escape(incomplete_note(incomplete[model]))})</span>" if model in incomplete else ""
        cells = [f"<td>{'—' if rank is None else rank}</td>", f"<td class='name'>{escape(model)}{mark}</td>"]
        if groups is not None:
            entry = groups.get(model)
            behind = support.model(model, RANK_METRIC)
            if entry and not enough_clusters(behind):
                cells += [f"<td>{insufficient_data(behind)}</td>"] * 2
            else:
                cells += [f"<td>{escape(rank_range_text(entry))}</td>", f"<td>{escape(group_text(entry))}</td>"]
        for name, _ in columns:
            ci = format_interval(intervals.get(model, {}).get(name), name)
            ci_html = guarded_ci(ci, support.model(model, name))
            cells.append(f"<td>{escape(format_value(values.get(name), name))}{ci_html}</td>")
        cells.append(f"<td>{int(values.get('n', 0))}</td><td>{support.model(model)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
        if beside and model in beside:
            rows.append(_beside_row(*beside[model], [name for name, _ in columns], groups is not None))
    return f"<table>{head}{''.join(rows)}</table>"


def _beside_row(name: str, cells: Mapping[str, str], columns: list[str], grouped: bool) -> str:
    """A row under a model's: ``name`` in the model column, ``cells`` under their metrics, the rest empty."""
    row = ["<td></td>", f"<td class='name'>{name}</td>"] + ["<td></td>"] * (2 if grouped else 0)
    row += [f"<td>{cells.get(metric, '')}</td>" for metric in columns] + ["<td></td><td></td>"]
    return "<tr class='paper-reference'>" + "".join(row) + "</tr>"


def _cell(row: Mapping[str, Any] | None, metric: str, n_clusters: int) -> str:
    if row is None:
        return "—"
    value = format_value(row.get("estimate", math.nan), metric)
    interval = format_interval((row.get("ci_low", math.nan), row.get("ci_high", math.nan)), metric)
    return value + guarded_ci(interval, n_clusters)


def breakdown_tables(breakdown: pd.DataFrame, support: ClusterSupport) -> str:
    """Answer and refusal accuracy per model for each value of each breakdown dimension, each with
    its interval (or the guardrail's note)."""
    parts = []
    shown = breakdown[breakdown["metric"].isin(_SHOWN)]
    # One dict lookup per cell: a cell looked up in the frame costs ~0.1 ms, and 30 models x 5
    # dimensions x 2 metrics make thousands of them.
    cells_of = {
        (r["model"], r["group"], str(r["value"]), r["metric"]): r
        for r in shown[[c for c in shown.columns if c in _CELL_COLUMNS]].to_dict("records")
    }
    for dimension in BREAKDOWN_DIMENSIONS:
        part = breakdown[breakdown["group"] == dimension]
        if part.empty:
            continue
        models = sorted(part["model"].unique())
        values = ordered([str(v) for v in part["value"].tolist()], [*PERTURBATION_CLASSES, *INTENSITIES])
        head = (
            f"<tr><th class='name'>{escape(DIMENSION_TITLES[dimension])}</th>"
            + "".join(f"<th>{escape(m)}<br><span class='ci'>answer / refusal acc.</span></th>" for m in models)
            + "</tr>"
        )
        rows = []
        for value in values:
            cells = [f"<td class='name'>{escape(value)}</td>"]
            for model in models:
                pair = [
                    _cell(cells_of.get((model, dimension, value, m)), m, support.group(model, dimension, value, m))
                    for m in _SHOWN
                ]
                cells.append(f"<td>{pair[0]}<br>/ {pair[1]}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        parts.append(f"<h3>By {escape(DIMENSION_TITLES[dimension])}</h3><table>{head}{''.join(rows)}</table>")
    return "".join(parts)
