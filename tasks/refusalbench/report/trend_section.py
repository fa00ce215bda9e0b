"""The report's "Trend across rounds" section (refresh rounds): one small chart per model over the
rounds with 95% intervals, what changed significantly since the previous round (or that no model
moved), the incomplete rounds, the round's error bound and a readable table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field
from refusalbench.tasks.core.html_page import escape, frame_table, section
from refusalbench.tasks.core.stats import enough_clusters
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
    return round_id[:16]


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
    Rounds below the small-sample minimum (``stats.MIN_CLUSTERS``) are lone points: no interval, no line.
    None when the rows lack the metric."""
    if rows.empty or metric not in rows.columns:
        return None
    changed = changed or {}
    rounds = sorted(rows["round"].astype(str).unique())
    latest = rows.groupby("model")["round"].transform("max")
    moved = {m: ", ".join(metric_spec(k).label for k in names) for m, names in changed.items() if names}
    data = pd.DataFrame(
        {
            "panel": [f"{m} (changed: {moved[m]})" if m in moved else str(m) for m in rows["model"]],
            "round": rows["round"].astype(str),
            "label": rows["round"].map(round_label),
            "value": _numbers(rows, metric),
            "low": _numbers(rows, f"{metric}_ci_low"),
            "high": _numbers(rows, f"{metric}_ci_high"),
            "n": _numbers(rows, "n"),
            # The guardrail: a round whose n is below the minimum is a lone point, no interval, no line.
            "joined": [enough_clusters(n) for n in _numbers(rows, "n")],
            "changed": [
                bool(metric in changed.get(m, []) and r == last)
                for m, r, last in zip(rows["model"], rows["round"], latest)
            ],
        }
    )
    label = metric_spec(metric).label
    x = field("label", "ordinal", "round", sort=[round_label(r) for r in rounds], axis={"labelAngle": -40})
    tooltip = [
        field("panel", title="model"),
        field("round"),
        field("value", "quantitative", label, format=".3f"),
        field("low", "quantitative", "95% low", format=".3f"),
        field("high", "quantitative", "95% high", format=".3f"),
        count(),
    ]
    inner = {
        "width": 170,
        "height": 130,
        "encoding": {"x": x, "tooltip": tooltip},
        "layer": [
            {
                "transform": [{"filter": "datum.joined"}],
                "mark": {"type": "rule", "color": STEADY},
                "encoding": {"y": field("low", "quantitative"), "y2": {"field": "high"}},
            },
            {
                "transform": [{"filter": "datum.joined"}],
                "mark": {"type": "line", "color": STEADY},
                "encoding": {"y": field("value", "quantitative", label)},
            },
            {
                "mark": {"type": "point", "filled": True},
                "encoding": {
                    "y": field("value", "quantitative", label),
                    "color": {"condition": {"test": "datum.changed", "value": CHANGED}, "value": STEADY},
                    "size": {"condition": {"test": "datum.changed", "value": 90}, "value": 30},
                },
            },
        ],
    }
    spec = charts.facetted(
        inner,
        "panel",
        columns=COLUMNS,
        title=charts.titled(
            f"{metric_spec(metric).title or label} per model over rounds",
            "95% intervals; orange: a significant change since the previous round",
        ),
    )
    return charts.chart(spec, charts.rows(data), "trend across rounds per model")


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
        parts.append(plot)
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
