"""The report's paper figures across models (seed paper Figs. 8, 11, 13, 16, 23, 24–25), and the
list of figures left out with their reasons.

- confusion across models: expected × predicted over every model, with each decision's share
  of all predictions (Fig. 8: "REFUSE_INFO_MISSING receives 25% of all predictions"), and the
  same matrix per intensity, one panel each
- model × domain specialisation: answering and refusing per model and domain (Fig. 11)
- the benchmark's domain distribution (Fig. 13)
- class difficulty: classes ranked by mean refusal accuracy across models with the spread, beside
  the generation pass rate per class (Fig. 16)
- refusal-accuracy ranking with the hierarchical score overlaid (Fig. 23)
- model dashboards: one row per model across the skills the paper sets side by side (Figs. 24–25)

Each is one chart whatever the number of models (small multiples, never one chart per model:
the page must stay small at 30 targets). The data comes from the run folder (metrics.json and
the breakdown, confusion.parquet, judged.parquet, benchmark.parquet, gv_analysis.json) through
:mod:`.paper_tables`. A figure whose data the run lacks is not drawn; :class:`PaperFigures` keeps
its one-line reason for the report's "Figures not drawn" list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field, percent
from refusalbench.tasks.core.html_page import escape, section
from refusalbench.tasks.refusalbench.report.figures import short_code
from refusalbench.tasks.refusalbench.report.paper_tables import (
    DOMAIN_METRICS,
    aggregate_confusion,
    class_difficulty,
    class_values,
    confusion_by_intensity,
    dashboard_panels,
    domain_distribution,
    generation_class_ranking,
    metric_title,
    model_domain_grid,
    prediction_shares,
    refusal_ranking,
)

_ANNOTATE_CELLS = 120  # heatmap cells up to which each shows its value (beyond: colour, and the tooltip)


# ---------------------------------------------------------------- charts


def _matrix_rows(matrix: pd.DataFrame) -> list[dict[str, Any]]:
    """Expected x predicted counts as one record per non-empty cell, with its share of the row and the row's n."""
    totals = matrix.sum(axis=1)
    return [
        {
            "expected": short_code(str(e)),
            "predicted": short_code(str(p)),
            "count": int(matrix.at[e, p]),
            "share": matrix.at[e, p] / totals[e],
            "row_n": int(totals[e]),
        }
        for e in matrix.index
        for p in matrix.columns
        if matrix.at[e, p]
    ]


def _confusion_cells(matrix: pd.DataFrame, text: bool) -> dict[str, Any]:
    tooltip = [
        field("expected"),
        field("predicted"),
        count("count", "count"),
        percent("share", "share of row"),
        count("row_n", "n (row)"),
    ]
    return charts.heatmap(
        x="predicted",
        y="expected",
        value="share",
        legend="share of row",
        scheme="blues",
        tooltip=tooltip,
        x_order=[short_code(str(c)) for c in matrix.columns],
        y_order=[short_code(str(r)) for r in matrix.index],
        x_title="predicted (REFUSE_ prefix dropped)",
        text=field("count", "quantitative") if text else None,
        cell=40,
    )


def confusion_overview_plot(matrix: pd.DataFrame, shares: pd.Series) -> str:
    """The confusion matrix over every model, under a bar of each decision's share of all predictions."""
    columns = [short_code(str(c)) for c in matrix.columns]
    totals = matrix.sum(axis=0)
    bars = [{"predicted": short_code(str(c)), "share": shares.get(c, 0.0), "n": int(totals[c])} for c in matrix.columns]
    top = {
        "data": {"values": charts.compact(bars)},
        "width": {"step": 40},
        "height": 80,
        "encoding": {
            "x": field("predicted", "ordinal", None, sort=columns, axis=None),
            "y": field("share", "quantitative", "share of all predictions", axis={"format": "%"}),
            "tooltip": [field("predicted"), percent("share", "share of all predictions"), count("n", "predictions")],
        },
        "layer": [
            {"mark": {"type": "bar", "color": "#0072b2"}},
            {
                "mark": {"type": "text", "dy": -6, "fontSize": 9},
                "encoding": {"text": field("share", "quantitative", format=".0%")},
            },
        ],
    }
    bottom = {"data": {"values": charts.compact(_matrix_rows(matrix))}, **_confusion_cells(matrix, text=True)}
    spec = {
        "title": charts.titled("Confusion across models", "colour = share of the expected row, text = count"),
        "vconcat": [top, bottom],
    }
    return charts.chart(spec, None, "confusion matrix across models")


def intensity_confusion_plot(by_intensity: Mapping[str, pd.DataFrame]) -> str:
    """One confusion panel per intensity (every model together), rows and columns shared."""
    expected = list(dict.fromkeys(r for m in by_intensity.values() for r in m.index))
    predicted = list(dict.fromkeys(c for m in by_intensity.values() for c in m.columns))
    panels: list[dict[str, Any]] = []
    for intensity, matrix in by_intensity.items():
        full = matrix.reindex(index=expected, columns=predicted, fill_value=0)
        title = f"{intensity}: all models (n = {int(full.to_numpy().sum())})"
        panels.extend({**row, "panel": title} for row in _matrix_rows(full))
    inner = _confusion_cells(pd.DataFrame(0, index=expected, columns=predicted), text=False)
    inner["encoding"]["tooltip"].insert(0, field("panel", title="intensity"))
    spec = charts.facetted(
        inner, "panel", order=list(dict.fromkeys(p["panel"] for p in panels)), columns=len(by_intensity)
    )
    return charts.chart(spec, panels, "confusion by intensity across models")


def domain_heatmaps(grids: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """One heatmap per metric: models (rows) × domains (columns), shared model order; grey: undefined."""
    data = [
        {"metric": title, "model": str(m), "domain": str(d), "value": grid.at[m, d]}
        for title, grid in grids
        for m in grid.index
        for d in grid.columns
    ]
    annotated = all(grid.size <= _ANNOTATE_CELLS for _, grid in grids)
    inner = charts.heatmap(
        x="domain",
        y="model",
        value="value",
        legend="score",
        scheme="redyellowgreen",
        tooltip=[field("metric"), field("model"), field("domain"), percent("value", "score")],
        y_order=[str(m) for m in grids[0][1].index],
        text=field("value", "quantitative", format=".0%") if annotated else None,
        cell=34,
    )
    inner["layer"].insert(0, {"mark": {"type": "rect", "color": "#d9d9d9"}})  # undefined cells stay grey
    spec = charts.facetted(inner, "metric", order=[t for t, _ in grids], columns=len(grids))
    spec["resolve"] = {"scale": {"x": "independent"}}
    return charts.chart(spec, data, "model by domain specialisation heatmaps")


def domain_distribution_plot(table: pd.DataFrame) -> str:
    """Benchmark items per domain, largest on top, with the share of all items."""
    encoding = {
        "y": field("domain", title=None, sort=[str(d) for d in table["domain"]]),
        "x": field("items", "quantitative", "benchmark items"),
        "tooltip": [field("domain"), count("items", "items"), percent("share", "share of all items")],
    }
    spec = {
        "title": charts.titled("Benchmark items per domain"),
        "width": 380,
        "height": {"step": 18},
        "encoding": encoding,
        "layer": [
            {"mark": {"type": "bar", "color": "#0072b2"}},
            {
                "mark": {"type": "text", "align": "left", "dx": 3, "fontSize": 9},
                "encoding": {"text": field("share", "quantitative", format=".1%")},
            },
        ],
    }
    return charts.chart(spec, charts.rows(table[["domain", "items", "share"]]), "benchmark items per domain")


def class_difficulty_plot(table: pd.DataFrame, points: pd.DataFrame, generation: pd.Series) -> str:
    """Refusal accuracy per class across models (mean, min–max, each model a dot), hardest on top;
    beside it, where the run has it, the generation pass rate per class."""
    classes = [str(c) for c in table["perturbation_class"]]
    y = field("perturbation_class", title=None, sort=classes)
    x: dict[str, Any] = {"scale": {"domain": [0, 1]}}
    summary = {
        "data": {"values": charts.compact(table.to_dict(orient="records"))},
        "encoding": {
            "y": y,
            "tooltip": [
                field("perturbation_class", title="class"),
                percent("mean"),
                percent("min"),
                percent("max"),
                count("models", "models"),
            ],
        },
        "layer": [
            {
                "mark": {"type": "bar", "color": "#e69f00", "opacity": 0.8},
                "encoding": {"x": field("mean", "quantitative", "refusal accuracy", **x)},
            },
            {
                "mark": {"type": "rule", "color": "#333"},
                "encoding": {"x": field("min", "quantitative"), "x2": {"field": "max"}},
            },
        ],
    }
    dots = {
        "data": {"values": charts.rows(points)},
        "mark": {"type": "circle", "size": 18, "color": "#333"},
        "encoding": {
            "y": y,
            "x": field("estimate", "quantitative", **x),
            "tooltip": [
                field("perturbation_class", title="class"),
                field("model"),
                percent("estimate", "refusal accuracy"),
            ],
        },
    }
    left = {
        "title": {
            "text": "Refusal accuracy per class across models",
            "subtitle": "bar: mean, whiskers: min–max, dots: models",
        },
        "width": 320,
        "height": {"step": 20},
        "layer": [summary, dots],
    }
    panels: list[dict[str, Any]] = [left]
    if not generation.empty:
        rates = [{"perturbation_class": str(c), "pass_rate": v} for c, v in generation.items()]
        panels.append(
            {
                "title": "Generation pass rate per class",
                "data": {"values": charts.compact(rates)},
                "width": 260,
                "height": {"step": 20},
                "mark": {"type": "bar", "color": "#009e73", "tooltip": True},
                "encoding": {
                    "y": field("perturbation_class", title=None, sort=[str(c) for c in generation.index]),
                    "x": field("pass_rate", "quantitative", "pass rate (all generator × verifier pairs)", **x),
                    "tooltip": [field("perturbation_class", title="class"), percent("pass_rate", "pass rate")],
                },
            }
        )
    spec = {"title": charts.titled("Class difficulty (hardest on top)"), "hconcat": panels}
    return charts.chart(spec, None, "class difficulty ranking")


def refusal_ranking_plot(table: pd.DataFrame, n: Mapping[str, Any] | None = None) -> str:
    """Refusal accuracy per model (bar coloured by value), the hierarchical score overlaid in blue."""
    data = table.assign(n=table["model"].map(lambda m: (n or {}).get(m)))
    models = [str(m) for m in table["model"]][::-1]  # highest refusal accuracy on top
    spec = {
        "title": charts.titled(
            "Refusal accuracy ranking", "blue: hierarchical score = detection F1 × category accuracy"
        ),
        "width": 420,
        "height": {"step": 16},
        "encoding": {
            "y": field("model", title=None, sort=models),
            "tooltip": [
                field("model"),
                percent("refusal_accuracy", "refusal accuracy"),
                percent("hierarchical_score", "hierarchical score"),
                count(),
            ],
        },
        "layer": [
            {
                "mark": "bar",
                "encoding": {
                    "x": field("refusal_accuracy", "quantitative", "score", scale={"domain": [0, 1]}),
                    "color": field(
                        "refusal_accuracy",
                        "quantitative",
                        "refusal accuracy",
                        scale={"scheme": "redyellowgreen", "domain": [0, 1]},
                    ),
                },
            },
            {
                "mark": {"type": "bar", "color": "#0072b2", "height": 5},
                "encoding": {"x": field("hierarchical_score", "quantitative")},
            },
        ],
    }
    return charts.chart(spec, charts.rows(data), "refusal accuracy ranking")


def _panel_title(title: str, names: Sequence[str]) -> str:
    """A dashboard panel's header, naming the metric of each bar colour."""
    return f"{title} ({'; '.join(f'{c}: {metric_title(n)}' for c, n in zip(('blue', 'orange'), names))})"


def dashboard_plot(
    metrics: Mapping[str, Mapping[str, float]], order: Sequence[str], panels: Sequence[tuple[str, tuple[str, ...]]]
) -> str:
    """One row per model (ranked order, best on top), one panel per pair of skills; undefined: no bar."""
    data = [
        {
            "panel": _panel_title(title, names),
            "model": m,
            "metric": metric_title(name),
            "k": k,
            "value": metrics[m].get(name),
            "n": metrics[m].get("n"),
        }
        for title, names in panels
        for k, name in enumerate(names)
        for m in order
    ]
    inner = {
        "width": 170,
        "height": {"step": 16},
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "y": field("model", title=None, sort=list(order)),
            "yOffset": field("k", "nominal"),
            "x": field("value", "quantitative", None, scale={"domain": [0, 1]}),
            "color": field("k", "nominal", legend=None, scale={"range": ["#0072b2", "#e69f00"]}),
            "tooltip": [field("model"), field("metric"), percent("value", "value"), count()],
        },
    }
    spec = charts.facetted(inner, "panel", order=[_panel_title(t, n) for t, n in panels], columns=len(panels))
    spec["resolve"] = {"scale": {"y": "shared"}}
    return charts.chart(spec, data, "model dashboards")


# ---------------------------------------------------------------- the sections


@dataclasses.dataclass
class PaperFigures:
    """The paper-figure sections of one report and the figures left out, each with its reason."""

    sections: list[str] = dataclasses.field(default_factory=list)
    left_out: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def leave_out(self, title: str, why: str) -> None:
        self.left_out.append((title, why))

    def left_out_section(self) -> str | None:
        """The "Figures not drawn" list (None when every figure was drawn)."""
        if not self.left_out:
            return None
        items = "".join(f"<li><b>{escape(title)}</b>: {escape(why)}.</li>" for title, why in self.left_out)
        return section("Figures not drawn", f"<p class='note'>Figures this run has no data for.</p><ul>{items}</ul>")


def _share_table(shares: pd.Series) -> str:
    ranked = shares.sort_values(ascending=False)
    cells = "".join(
        f"<tr><td class='name'>{escape(code)}</td><td>{100 * share:.1f}%</td></tr>" for code, share in ranked.items()
    )
    return f"<table><tr><th class='name'>Predicted</th><th>Share of all predictions</th></tr>{cells}</table>"


def _confusion_sections(out: PaperFigures, run: Any) -> None:
    matrix = aggregate_confusion(run.confusion)
    if matrix.empty:
        out.leave_out("Confusion across models", "no scored response in this run")
        return
    shares = prediction_shares(matrix)
    body = (
        "<p>Every model's decisions together: rows are the expected outcome, columns the decision; "
        "the bars give each decision's share of all predictions.</p>"
        + confusion_overview_plot(matrix, shares)
        + _share_table(shares)
    )
    by_intensity = confusion_by_intensity(run.judged)
    if by_intensity:
        body += (
            "<h3>By intensity</h3><p>The same matrix per intensity (colour = share of the expected row; "
            "LOW items are answerable).</p>" + intensity_confusion_plot(by_intensity)
        )
    else:
        out.leave_out("Confusion by intensity", "judged.parquet is absent or its rows carry no intensity")
    out.sections.append(section("Confusion across models", body))


def _domain_sections(out: PaperFigures, run: Any, order: Sequence[str]) -> None:
    parts = []
    # Without benchmark.parquet (a run scored from inspect logs or a judged file) the judged rows name the items.
    items = run.benchmark
    if items is None and run.judged is not None and {"item_id", "domain"} <= set(run.judged.columns):
        items = run.judged.drop_duplicates("item_id")
    distribution = domain_distribution(items)
    if items is None:
        out.leave_out("Benchmark domains", "neither benchmark.parquet nor judged rows are in this run folder")
    elif len(distribution) < 2:
        out.leave_out(
            "Benchmark domains",
            f"needs items from at least two domains (this benchmark's: {', '.join(distribution['domain']) or 'none'})",
        )
    else:
        parts.append(domain_distribution_plot(distribution))
    grids = [
        (metric_title(name), grid)
        for name in DOMAIN_METRICS
        if not (grid := model_domain_grid(run.breakdown, name, order)).empty
    ]
    if grids and grids[0][1].shape[1] >= 2:
        parts.append(domain_heatmaps(grids))
    else:
        out.leave_out(
            "Model × domain specialisation", "needs scores in at least two domains (the judged rows' domain column)"
        )
    if parts:
        out.sections.append(
            section(
                "Domains",
                "<p>Benchmark items per domain (Fig. 13), and each model's "
                "scores per domain in % (specialisation, Fig. 11; grey: undefined).</p>"
                "<div class='figs'>" + "".join(parts) + "</div>",
            )
        )


def paper_figures(run: Any, order: Sequence[str]) -> PaperFigures:
    """The paper-figure sections of ``run`` (a :class:`~.page.ReportInputs`), models in ``order``."""
    out = PaperFigures()
    if not run.metrics:
        return out
    panels = dashboard_panels(run.metrics)
    if panels:
        out.sections.append(
            section(
                "Model dashboards",
                "<p>One row per model, in the leaderboard's order; one "
                "panel per pair of skills the paper sets side by side (its Figs. 24–25). "
                "No bar: undefined.</p>" + dashboard_plot(run.metrics, order, panels),
            )
        )
    else:
        out.leave_out("Model dashboards", "no model has a defined metric")
    ranking = refusal_ranking(run.metrics)
    if not ranking.empty:
        out.sections.append(
            section(
                "Refusal accuracy ranking",
                refusal_ranking_plot(ranking, {m: v.get("n") for m, v in run.metrics.items()}),
            )
        )
    else:
        out.leave_out("Refusal accuracy ranking", "no model has a refusal accuracy (no scored unanswerable item)")
    difficulty = class_difficulty(run.breakdown)
    if not difficulty.empty:
        plot = class_difficulty_plot(difficulty, class_values(run.breakdown), generation_class_ranking(run.gv_analysis))
        out.sections.append(section("Class difficulty", plot))
    else:
        out.leave_out("Class difficulty", "no refusal accuracy per perturbation class (no scored unanswerable item)")
    _domain_sections(out, run, order)
    _confusion_sections(out, run)
    return out
