"""Report sections for the response distribution, standard errors and multi-document judging.

- :func:`distribution_section`: the six outcomes per model (paper App. F.8, Fig. 26) as a
  table and a stacked bar chart.
- :func:`standard_errors_section`: the bootstrap standard error of the leaderboard metrics
  (App. G).
- :func:`multi_document_section`: GaRAGe's Answer Quality and Hybrid scores and the judge's
  eligibility, factuality and RAF rates over answer attempts (App. D, F.9).
- :func:`correlation_note`: the false- vs missed-refusal correlation across models (§4.2).

Each returns None when the run has nothing for it, so the page leaves the section out. Given
the base items behind each model (``support``: :mod:`.support`), an interval or standard error
that too few of them support gives way to "insufficient data (n = K)".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field, percent
from refusalbench.tasks.core.html_page import escape, insufficient_data, is_nan, section
from refusalbench.tasks.core.stats import enough_clusters
from refusalbench.tasks.refusalbench.report.leaderboard import (
    format_interval,
    format_value,
    leaderboard_metrics,
    shown_as_percent,
)
from refusalbench.tasks.refusalbench.report.support import ClusterSupport, guarded_ci
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec, multi_document_metrics

# Outcome -> (label, colour): answers in greens/reds, refusals in blues/oranges.
OUTCOME_STYLE: dict[str, tuple[str, str]] = {
    "correct_answer": ("Correct answer", "#2e7d32"),
    "wrong_answer": ("Wrong answer", "#c62828"),
    "correct_refusal": ("Correct refusal", "#1565c0"),
    "wrong_category_refusal": ("Wrong-category refusal", "#90caf9"),
    "false_refusal": ("False refusal", "#ef6c00"),
    "missed_refusal": ("Missed refusal", "#8e24aa"),
}


def _percent(value: Any) -> str:
    return "—" if is_nan(value) else f"{100 * float(value):.1f}%"


def distribution_bars(table: pd.DataFrame, order: Sequence[str]) -> str | None:
    """Stacked horizontal bars: each model's responses split into the six outcomes."""
    if table is None or table.empty:
        return None
    present = set(table["model"])
    models = [m for m in order if m in present] + sorted(present - set(order))
    if few := charts.too_few(models, "model", "Response distribution"):
        return few
    labels = {outcome: label for outcome, (label, _) in OUTCOME_STYLE.items()}
    part = table[table["outcome"].isin(list(OUTCOME_STYLE))]
    data = [
        {"model": m, "outcome": labels[o], "k": list(OUTCOME_STYLE).index(o), "fraction": f, "n": n}
        for m, o, f, n in zip(part["model"], part["outcome"], part["fraction"], part["n"])
    ]
    spec = {
        "title": charts.titled("Response distribution"),
        "width": 520,
        "height": {"step": 18},
        "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "y": field("model", title=None, sort=models),
            "x": field(
                "fraction", "quantitative", "share of scorable responses", stack="zero", scale={"domain": [0, 1]}
            ),
            "color": field(
                "outcome",
                title=None,
                scale={"domain": list(labels.values()), "range": [c for _, c in OUTCOME_STYLE.values()]},
                legend={"orient": "bottom", "columns": 3},
            ),
            "order": field("k", "quantitative"),
            "tooltip": [field("model"), field("outcome"), percent("fraction", "share"), count()],
        },
    }
    return charts.chart(spec, data, "response distribution bars")


def distribution_section(
    table: pd.DataFrame | None, order: Sequence[str], support: ClusterSupport | None = None
) -> str | None:
    """Six-way outcome shares per model: table (with Wilson intervals, behind the guardrail with
    ``support``) and stacked bars."""
    if table is None or table.empty:
        return None
    head = (
        "<tr><th class='name'>Model</th>"
        + "".join(f"<th>{escape(label)}</th>" for label, _ in OUTCOME_STYLE.values())
        + "<th>n</th></tr>"
    )
    models = [m for m in order if m in set(table["model"])] + sorted(set(table["model"]) - set(order))
    rows = []
    by_model = {model: part.set_index("outcome") for model, part in table.groupby("model", sort=False)}
    for model in models:
        part = by_model[model]
        cells = [f"<td class='name'>{escape(model)}</td>"]
        for outcome in OUTCOME_STYLE:
            if outcome not in part.index:
                cells.append("<td>—</td>")
                continue
            row = part.loc[outcome]
            interval = "" if is_nan(row["ci_low"]) else f"[{100 * row['ci_low']:.1f}, {100 * row['ci_high']:.1f}]"
            ci = (
                guarded_ci(interval, support.model(model))
                if support
                else (interval and f"<br><span class='ci'>{interval}</span>")
            )
            cells.append(f"<td>{_percent(row['fraction'])}{ci}</td>")
        cells.append(f"<td>{int(part['n'].iloc[0])}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    lead = (
        "<p>Every scorable response falls in one outcome: answers to answerable items (correct or "
        "wrong), refusals of unanswerable items (right or wrong category), false refusals (an "
        "answerable item refused) and missed refusals (an unanswerable item answered). Brackets: "
        "Wilson 95% intervals.</p>"
    )
    body = lead + f"<table>{head}{''.join(rows)}</table>" + (distribution_bars(table, models) or "")
    return section("Response distribution", body)


def standard_errors_section(
    standard_errors: Mapping[str, Mapping[str, float]] | None,
    order: Sequence[str],
    iid: Mapping[str, Mapping[str, float]] | None = None,
    support: ClusterSupport | None = None,
) -> str | None:
    """Bootstrap standard errors of the leaderboard metrics, one row per model; with ``iid`` (rows
    resampled as if independent), that figure beneath each cluster one; with ``support``, both
    give way to the guardrail's note where too few base items support the metric."""
    if not standard_errors:
        return None
    names = [
        (n, label)
        for n, label in leaderboard_metrics(standard_errors)
        if any(not is_nan(v.get(n)) for v in standard_errors.values())
    ]
    if not names:
        return None
    head = "<tr><th class='name'>Model</th>" + "".join(f"<th>{escape(label)}</th>" for _, label in names) + "</tr>"
    rows = []

    def text(value: Any, name: str) -> str:
        return (
            "—"
            if is_nan(value)
            else (f"{100 * float(value):.1f} pp" if shown_as_percent(name) else f"{float(value):.3f}")
        )

    for model in [m for m in order if m in standard_errors] + sorted(set(standard_errors) - set(order)):
        cells = [f"<td class='name'>{escape(model)}</td>"]
        for name, _ in names:
            behind = support.model(model, name) if support else None
            if behind is not None and not enough_clusters(behind):
                cells.append(f"<td>{insufficient_data(behind)}</td>")
                continue
            beside = (iid or {}).get(model, {}).get(name)
            note = f"<br><span class='ci'>i.i.d. {text(beside, name)}</span>" if iid and model in iid else ""
            cells.append(f"<td>{text(standard_errors[model].get(name), name)}{note}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    lead = (
        "<p>Standard error of each metric: the standard deviation of its bootstrap resamples, as in the "
        "paper's Appendix G, with base items resampled (each with all of its benchmark items, the same "
        "draws for every model)"
        + (
            "; beneath it, the figure with items resampled as if independent, too small where items "
            "of one base item succeed or fail together"
            if iid
            else ""
        )
        + ".</p>"
    )
    return section("Standard errors", lead + f"<table>{head}{''.join(rows)}</table>")


def multi_document_section(
    metrics: Mapping[str, Mapping[str, Any]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]],
    counts: Mapping[str, Mapping[str, int]] | None,
    order: Sequence[str],
    support: ClusterSupport | None = None,
) -> str | None:
    """GaRAGe's scores per model with a multi-document item; None on a single-document run.

    The columns: the metrics declared ``multi_document=True``, headed by their titles.
    """
    columns = multi_document_metrics()
    models = [m for m in order if any(not is_nan(metrics[m].get(n)) for n in columns)]
    if not models:
        return None
    counts = counts or {}
    head = (
        "<tr><th class='name'>Model</th>"
        + "".join(f"<th>{escape(metric_spec(n).title)}</th>" for n in columns)
        + "<th>judged answers</th><th>items</th></tr>"
    )
    rows = []
    for model in models:
        cells = [f"<td class='name'>{escape(model)}</td>"]
        for name in columns:
            interval = format_interval(intervals.get(model, {}).get(name), name)
            if support is not None:
                ci = guarded_ci(interval, support.model(model, name))
            else:
                ci = f"<br><span class='ci'>{interval}</span>" if interval else ""
            cells.append(f"<td>{escape(format_value(metrics[model].get(name), name))}{ci}</td>")
        own = counts.get(model, {})
        cells.append(f"<td>{int(own.get('n_answer_attempts_judged', 0))}</td><td>{int(own.get('n_items', 0))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    lead = (
        "<p>Multi-document items (GaRAGe scoring). Answer quality = mean RAF over answerable items, "
        "a refusal scoring 0; hybrid = RAF and refusal accuracy weighted by their shares of the items; "
        "eligibility, factuality and RAF are the judge's rates over the answers it judged.</p>"
    )
    return section("Multi-document answer quality", lead + f"<table>{head}{''.join(rows)}</table>")


def correlation_note(correlation: Mapping[str, Any] | None) -> str:
    """One paragraph: the FRR-MRR correlation across models, or why there is none."""
    if not correlation:
        return ""
    n = int(correlation.get("n") or 0)
    pearson, spearman = correlation.get("pearson"), correlation.get("spearman")
    if is_nan(pearson) and is_nan(spearman):
        return (
            f"<p class='note'>False vs missed refusal rate correlation across models: undefined "
            f"({n} model(s) with both rates; at least 3 that differ are needed).</p>"
        )

    def fmt(value: Any) -> str:
        return "—" if is_nan(value) else f"{float(value):+.2f}"

    return (
        f"<p>Correlation of false and missed refusal rates across {n} models: Pearson r = "
        f"{fmt(pearson)}, Spearman ρ = {fmt(spearman)}.</p>"
    )
