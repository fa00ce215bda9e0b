"""The report's "Trend across rounds" section (refresh rounds): one small plot per model over the
rounds with 95% intervals, what changed significantly since the previous round (or that no model
moved), the incomplete rounds, the round's error bound and a readable table.

The figure is also what the refresh run shows as a Prefect artifact (``tasks/pipeline/refusalbench/refresh_step.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from refusalbench.tasks.core.html_page import escape, frame_table, image_tag, section
from refusalbench.tasks.core.plotting import plot_text, png_base64
from refusalbench.tasks.refusalbench.report.support import guarded_trend
from refusalbench.tasks.refusalbench.rounds.freshness import fingerprint_lines, freshness_lines
from refusalbench.tasks.refusalbench.rounds.trend import (
    HEADLINE_METRIC,
    ROUND_PREFIX,
    change_line,
    changes_markdown,
    readable_trend,
)
from refusalbench.tasks.refusalbench.schema.json_files import TrendDocument
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec

COLUMNS = 4
CHANGED = "#d55e00"
STEADY = "#0072b2"


def round_label(round_id: object) -> str:
    """A round's short axis label: ``round-20261125T153925Z-s11`` -> ``11-25 15:39``; other names cut short."""
    round_id = str(round_id)
    stamp = round_id[len(ROUND_PREFIX) :] if round_id.startswith(ROUND_PREFIX) else round_id
    if len(stamp) >= 13 and stamp[8] == "T" and stamp[:8].isdigit():
        return f"{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}"
    return plot_text(round_id)[:16]


def _numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A column as floats; NaN where it is missing or null (a trend of an older version has no intervals)."""
    if column not in frame.columns:
        return np.full(len(frame), np.nan)
    numbers: np.ndarray = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    return numbers


def trend_plot(
    rows: pd.DataFrame, changed: Mapping[str, list[str]] | None = None, metric: str = HEADLINE_METRIC
) -> str | None:
    """Small multiples: ``metric`` per model over the rounds with its 95% interval; a model whose headline
    metric changed significantly has its latest point in orange, and ``changed`` names every metric that did.
    None when the rows lack the metric."""
    if rows.empty or metric not in rows.columns:
        return None
    changed = changed or {}
    models = sorted(rows["model"].unique())
    rounds = sorted(rows["round"].unique())
    columns = min(COLUMNS, len(models))
    lines = math.ceil(len(models) / columns)
    height = 2.6 * lines + 1.0
    fig = Figure(figsize=(3.3 * columns, height))
    axes = fig.subplots(lines, columns, sharex=True, sharey=True, squeeze=False)
    fig.subplots_adjust(top=1 - 1.0 / height, hspace=0.6, wspace=0.15)  # room for the title and two-line plot titles
    label = metric_spec(metric).label
    for ax, model in zip(axes.flat, models):
        part = rows[rows["model"] == model].sort_values("round")
        x = np.array([rounds.index(r) for r in part["round"]])
        y, low, high = (_numbers(part, name) for name in (metric, f"{metric}_ci_low", f"{metric}_ci_high"))
        below, above = np.nan_to_num(y - low, nan=0.0).clip(min=0), np.nan_to_num(high - y, nan=0.0).clip(min=0)
        ax.errorbar(x, y, yerr=[below, above], fmt="o-", color=STEADY, capsize=3, markersize=4, linewidth=1)
        moved = changed.get(model, [])
        if metric in moved and len(x):
            ax.plot(x[-1:], y[-1:], "o", color=CHANGED, markersize=9, zorder=3)
        title = plot_text(model) + (f"\nchanged: {', '.join(metric_spec(m).label for m in moved)}" if moved else "")
        ax.set_title(title, fontsize=8, color=CHANGED if moved else "black")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(models) :]:
        ax.set_visible(False)
    for column in range(columns):  # round labels under the lowest plot of each column
        ax = axes[(len(models) - 1 - column) // columns, column]
        ax.set_xticks(range(len(rounds)), [round_label(r) for r in rounds], rotation=40, ha="right", fontsize=7)
        ax.tick_params(labelbottom=True)
    for ax in axes[:, 0]:
        ax.set_ylabel(label, fontsize=8)
    fig.suptitle(
        f"{metric_spec(metric).title or label} per model over rounds\n95% intervals; orange: a significant "
        "change since the previous round",
        fontsize=10,
    )
    return png_base64(fig)


def changed_metrics(document: TrendDocument | None) -> dict[str, list[str]]:
    """model -> the metrics that changed significantly in the latest round."""
    out: dict[str, list[str]] = {}
    for flag in document.flags if document is not None else []:
        out.setdefault(flag.model, []).append(flag.metric)
    return out


def error_line(document: TrendDocument | None) -> str | None:
    """What the round's size guarantees, in words; None when it was not recorded."""
    error = document.round_error if document is not None else None
    if error is None:
        return None
    return (
        f"This round scored up to {error.items:,} items per model: by Theorem 3.1 every one of "
        f"{error.rounds} rounds of this size is within ±{error.epsilon:.3f} of the model's true score "
        f"(a per-item score in [0, 1]) with probability {1 - error.delta:g}."
    )


def trend_section(rows: pd.DataFrame, trend: Mapping[str, Any] | None) -> str:
    """The section's HTML from ``round_trend.parquet`` and ``trend.json`` (either may be older or absent)."""
    document = TrendDocument.model_validate(trend) if trend else None
    parts = []
    plot = trend_plot(rows, changed_metrics(document))
    if plot:
        parts.append(image_tag(plot, "trend across rounds per model"))
    if document is not None:
        if document.flags:
            items = "".join(f"<li>{escape(change_line(flag.model_dump()))}</li>" for flag in document.flags)
            lead = (
                f"<b>{len(document.flags)} significant change(s)</b> since the previous round, of "
                f"{document.comparisons} comparisons (false-discovery rate {document.fdr:g}):"
                if document.fdr is not None
                # a trend.json written before the FDR-controlled test
                else "Models whose estimate left their previous round's interval (no test for noise):"
            )
            parts.append(f"<p>{lead}</p><ul>{items}</ul>")
        else:
            parts.append(f"<p>{escape(changes_markdown(document).replace('**', ''))}</p>")
        if document.test:
            parts.append(f"<p class='note'>Test: {escape(document.test)}.</p>")
        if document.incomplete_rounds:
            items = "".join(f"<li>{escape(r.round)}: {escape(r.reason)}</li>" for r in document.incomplete_rounds)
            parts.append(f"<p>Incomplete rounds, not in the trend:</p><ul>{items}</ul>")
        if line := error_line(document):
            parts.append(f"<p>{escape(line)}</p>")
        fresh = freshness_lines(document.freshness)
        if fresh:
            parts.append(
                "<p>Freshness of this round:</p><ul>" + "".join(f"<li>{escape(x)}</li>" for x in fresh) + "</ul>"
            )
        changes = fingerprint_lines([c.model_dump() for c in document.fingerprint_changes])
        if changes:
            parts.append(
                "<p>Models whose provider fingerprint changed since the previous round (the model behind "
                "the name may have been updated):</p><ul>" + "".join(f"<li>{escape(x)}</li>" for x in changes) + "</ul>"
            )
    readable = readable_trend(rows)
    if readable:  # each point's interval behind the small-sample guardrail, and whether a line joins it
        labels = [k for k in readable[0] if k not in ("round", "model", "n")]
        parts.append(frame_table(pd.DataFrame(guarded_trend(readable, labels))))
    return section("Trend across rounds", "".join(parts))
