"""The contamination check's page (``contamination.html``): static set vs fresh round, per model and stratum.

Built from ``contamination.json`` alone (``rounds/contamination.py``): a table per model of the static and
fresh scores, the gap with its 95% interval, the adjusted p-value and the flag; a chart of the gaps with
their intervals; the strata in a folded table. The viewer shows the same tables (``contamination_tables``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.html_page import CSS, escape, folded, section, summary_card, table_of_contents
from refusalbench.tasks.refusalbench.rounds.contamination import METRICS, OVERALL, gap_text
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec

_HEADER = ("model", "metric", "static", "fresh", "gap [95% CI]", "adjusted p", "flag")


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _rows(document: Mapping[str, Any], scope: str) -> list[list[str]]:
    rows = []
    for model, entry in sorted(document.get("models", {}).items()):
        if scope not in entry["gap"]:
            continue
        for m in document.get("metrics", METRICS):
            test = entry["ci"][scope][m]
            q = test.get("adjusted_p_value")
            rows.append(
                [
                    escape(model),
                    escape(metric_spec(m).label),
                    _cell(entry["static"][scope][m]),
                    _cell(entry["fresh"][scope][m]),
                    escape(gap_text(entry["gap"][scope][m], test)),
                    "—" if q is None else f"{q:.3f}",
                    "<b class='warn'>flagged</b>" if test.get("flagged") else "",
                ]
            )
    return rows


def _table(rows: list[list[str]], first: tuple[str, ...] = ()) -> str:
    head = "".join(f"<th class='name'>{escape(h)}</th>" for h in (*first, *_HEADER))
    body = "".join("<tr>" + "".join(f"<td class='name'>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def contamination_tables(document: Mapping[str, Any]) -> str:
    """The overall table, then the strata folded away: what the report and the viewer both show."""
    flagged = sorted(m for m, e in document.get("models", {}).items() if e.get("flagged"))
    verdict = (
        f"<p class='warn'><b>Flagged</b> (significantly lower on fresh items): {escape(', '.join(flagged))}</p>"
        if flagged
        else "<p><b>No model flagged</b>: no gap is significantly negative at the false-discovery rate "
        f"{escape(document.get('fdr'))}.</p>"
    )
    strata_rows = [
        [escape(stratum), *row] for stratum in document.get("strata", []) for row in _rows(document, stratum)
    ]
    return (
        verdict
        + _table(_rows(document, OVERALL))
        + f"<p class='note'>{escape(document.get('direction', ''))}. Test: {escape(document.get('test', ''))}.</p>"
        + folded(f"Per stratum ({len(document.get('strata', []))})", _table(strata_rows, ("stratum",)))
    )


def _gap_chart(document: Mapping[str, Any]) -> str:
    data = []
    for model, entry in sorted(document.get("models", {}).items()):
        for m in METRICS:
            interval = entry["ci"][OVERALL][m].get("interval")
            if entry["gap"][OVERALL][m] is None or interval is None:
                continue
            data.append(
                {"model": model, "metric": metric_spec(m).label, "gap": entry["gap"][OVERALL][m],
                 "low": interval[0], "high": interval[1]}
            )  # fmt: skip
    if not data:
        return charts.note("No gap has an interval: too few base items in a set.")
    y = charts.field("model", title="model")
    spec = {
        "facet": {"column": charts.field("metric", title=None)},
        "spec": {
            "layer": [
                {"mark": "rule", "encoding": {"x": {"field": "low", "type": "quantitative", "title": "gap (fresh - static)"},
                                              "x2": {"field": "high"}, "y": y}},
                {"mark": {"type": "point", "filled": True}, "encoding": {"x": {"field": "gap", "type": "quantitative"}, "y": y,
                                                                         "tooltip": [{"field": k} for k in ("model", "gap", "low", "high")]}},
                {"mark": {"type": "rule", "strokeDash": [4, 4]}, "encoding": {"x": {"datum": 0}}},
            ],
        },
    }  # fmt: skip
    return charts.chart(spec, data, "Gap fresh - static per model and metric, with 95% intervals")


def contamination_page(document: Mapping[str, Any]) -> str:
    """The whole ``contamination.html``: summary, the table, the chart; self-contained like report.html."""
    static, fresh = document.get("static", {}), document.get("fresh", {})
    card = summary_card(
        [
            ("static set", f"{escape(static.get('path'))} ({escape(static.get('items'))} items)"),
            ("static sha256", f"<code>{escape(static.get('sha256'))}</code>"),
            ("static run", escape(static.get("run"))),
            ("fresh round", f"{escape(fresh.get('run'))} ({escape(fresh.get('items'))} items)"),
            ("strata compared", escape(", ".join(document.get("strata", [])))),
        ]
    )
    sections = [
        card,
        section("Static vs fresh", contamination_tables(document)),
        section("Gaps with intervals", _gap_chart(document)),
    ]
    contents, sections = table_of_contents(sections)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>Contamination check</title>"
        f"<style>{CSS}</style>{charts.head_script(''.join(sections))}</head><body><h1>Contamination check</h1>"
        f"{contents}{''.join(sections)}</body></html>"
    )
