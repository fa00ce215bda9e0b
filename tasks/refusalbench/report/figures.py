"""The RefusalBench report's per-model charts: Vega-Lite specs drawn in the reader's browser
(``core.charts``: data inlined, a tooltip on every mark, one colour per model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field, ordered, percent
from refusalbench.tasks.core.html_page import is_nan
from refusalbench.tasks.refusalbench.decisions import ANSWER
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, INTENSITIES, PERTURBATION_CLASSES, REFUSAL_CODES

PANEL_COLUMNS = 5  # small multiples to a row


def short_code(code: str) -> str:
    """A refusal code without its REFUSE_ prefix (axis labels)."""
    return code.removeprefix("REFUSE_") if code.startswith("REFUSE_") else code


def _defined(value: Any) -> bool:
    return value is not None and not is_nan(value)


def scatter_plot(
    metrics: Mapping[str, Mapping[str, float]], x: str, y: str, title: str, xlabel: str, ylabel: str
) -> str | None:
    """Metric ``y`` against metric ``x``, one labelled point per model; None if no model has both, a note
    if only one has."""
    data = [
        {"model": m, "x": v.get(x), "y": v.get(y), "n": v.get("n")}
        for m, v in metrics.items()
        if _defined(v.get(x)) and _defined(v.get(y))
    ]
    if not data:
        return None
    if few := charts.too_few([row["model"] for row in data], "model", title):
        return few
    axis: dict[str, Any] = {"scale": {"domain": [0, 1]}}
    tooltip = [
        field("model"),
        field("x", "quantitative", xlabel, format=".3f"),
        field("y", "quantitative", ylabel, format=".3f"),
        count(),
    ]
    spec = {
        "title": charts.titled(title),
        "width": 380,
        "height": 320,
        "encoding": {
            "x": field("x", "quantitative", xlabel, **axis),
            "y": field("y", "quantitative", ylabel, **axis),
            "tooltip": tooltip,
        },
        "layer": [
            {
                "data": {"values": [{"x": 0, "y": 0}, {"x": 1, "y": 1}]},
                "mark": {"type": "line", "strokeDash": [2, 3], "color": "#999"},
                "encoding": {"tooltip": None},
            },
            {
                "mark": {"type": "point", "filled": True, "size": 70},
                "encoding": {"color": field("model", scale=charts.model_colours(list(metrics)), legend=None)},
            },
            {"mark": {"type": "text", "align": "left", "dx": 6, "fontSize": 10}, "encoding": {"text": field("model")}},
        ],
    }
    return charts.chart(spec, data, f"{title} scatter")


def class_intensity_chart(grid: pd.DataFrame) -> str:
    """Share of correct responses per perturbation class × intensity, one panel per model."""
    models = sorted(grid["model"].astype(str).unique())
    rows = ordered(grid["perturbation_class"].astype(str).tolist(), PERTURBATION_CLASSES)
    cols = ordered(grid["intensity"].astype(str).tolist(), INTENSITIES)
    if few := charts.too_few(rows, "perturbation class", "Class × intensity"):
        return few
    data = (
        grid.groupby(["model", "perturbation_class", "intensity"], as_index=False)
        .agg(correct_rate=("correct_rate", "mean"), n=("n", "sum"))
        .astype({"model": str, "perturbation_class": str, "intensity": str})
    )
    tooltip = [
        field("model"),
        field("perturbation_class", title="class"),
        field("intensity"),
        percent("correct_rate", "share correct"),
        count(),
    ]
    inner = charts.heatmap(
        x="intensity",
        y="perturbation_class",
        value="correct_rate",
        legend="share correct",
        scheme="redyellowgreen",
        tooltip=tooltip,
        x_order=cols,
        y_order=rows,
        y_title="perturbation class",
        text=field("correct_rate", "quantitative", format=".0%"),
    )
    spec = charts.facetted(
        inner,
        "model",
        order=models,
        columns=PANEL_COLUMNS,
        title=charts.titled("Correct responses per perturbation class × intensity", "hover a cell for its n"),
    )
    return charts.chart(spec, charts.rows(data), "class by intensity heatmaps, one panel per model")


def _confusion_rows(table: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Counts per ``keys`` + expected + predicted, with each cell's share of its expected row and the row's n."""
    data = table.groupby([*keys, "expected", "predicted"], as_index=False)["count"].sum()
    data = data[data["count"] > 0].copy()
    data["row_n"] = data.groupby([*keys, "expected"])["count"].transform("sum")
    data["share"] = data["count"] / data["row_n"]
    for column in ("expected", "predicted"):
        data[column] = data[column].astype(str).map(short_code)
    return data


def confusion_chart(table: pd.DataFrame, *, by: str = "model", title: str | None = None) -> str:
    """Expected × predicted counts coloured by share of the row, one panel per ``by`` (a model, or an
    intensity of every model together)."""
    expected = [
        short_code(c) for c in ordered(table["expected"].astype(str).tolist(), [ANSWER_CORRECTLY, *REFUSAL_CODES])
    ]
    predicted = [short_code(c) for c in ordered(table["predicted"].astype(str).tolist(), [ANSWER, *REFUSAL_CODES])]
    data = _confusion_rows(table, [by])
    tooltip = [
        field(by),
        field("expected"),
        field("predicted"),
        count("count", "count"),
        percent("share", "share of row"),
        count("row_n", "n (row)"),
    ]
    inner = charts.heatmap(
        x="predicted",
        y="expected",
        value="share",
        legend="share of row",
        scheme="blues",
        tooltip=tooltip,
        x_order=predicted,
        y_order=expected,
        x_title="predicted (REFUSE_ prefix dropped)",
        text=field("count", "quantitative"),
        cell=30,
    )
    spec = charts.facetted(
        inner,
        by,
        order=ordered(data[by].astype(str).tolist(), INTENSITIES),
        columns=PANEL_COLUMNS,
        title=charts.titled(title or "Confusion matrices: expected × predicted", "colour = row share, text = count"),
    )
    return charts.chart(
        spec, charts.rows(data[[by, "expected", "predicted", "count", "share", "row_n"]]), "confusion matrices"
    )


def intensity_curves(table: pd.DataFrame) -> str:
    """Refusal rate per intensity, one line per model."""
    order = ordered(table["intensity"].astype(str).tolist(), INTENSITIES)
    models = table["model"].astype(str).unique().tolist()
    if few := charts.too_few(models, "model", "Refusal rate by intensity"):
        return few
    columns = ["model", "intensity", "refusal_rate"] + (["n"] if "n" in table.columns else [])
    data = table[columns].astype({"model": str, "intensity": str})
    tooltip = [field("model"), field("intensity"), percent("refusal_rate", "refusal rate")] + (
        [count()] if "n" in columns else []
    )
    spec = {
        "title": charts.titled("Refusal rate by intensity"),
        "width": 420,
        "height": 280,
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": field("intensity", "ordinal", "perturbation intensity", sort=order),
            "y": field("refusal_rate", "quantitative", "refusal rate", scale={"domain": [0, 1]}),
            "color": field("model", scale=charts.model_colours(models)),
            "tooltip": tooltip,
        },
    }
    return charts.chart(spec, charts.rows(data), "refusal rate by intensity curves")


def reliability_diagrams(calibration: pd.DataFrame, metrics: Mapping[str, Mapping[str, float]]) -> str:
    """Accuracy against stated confidence per bin, one panel per model, ECE in the panel's title."""
    table = calibration[calibration["scope"] == "all"].copy()
    ece = {m: metrics.get(m, {}).get("ece", math.nan) for m in table["model"].unique()}
    table["panel"] = table["model"].map(lambda m: f"{m} · ECE {'—' if is_nan(ece[m]) else f'{ece[m]:.3f}'}")
    data = table[["panel", "model", "kind", "mean_confidence", "accuracy", "n"]]
    unit: dict[str, Any] = {"scale": {"domain": [0, 1]}}
    inner = {
        "width": 220,
        "height": 200,
        "layer": [
            {
                "mark": {"type": "rule", "strokeDash": [2, 3], "color": "#999"},
                "encoding": {"x": {"datum": 0}, "y": {"datum": 0}, "x2": {"datum": 1}, "y2": {"datum": 1}},
            },
            {
                "mark": {"type": "point", "filled": True, "opacity": 0.75},
                "encoding": {
                    "x": field("mean_confidence", "quantitative", "stated confidence", **unit),
                    "y": field("accuracy", "quantitative", "accuracy", **unit),
                    "size": field("n", "quantitative", "responses in bin"),
                    "shape": field("kind", title="bins"),
                    "color": field("kind", title="bins"),
                    "tooltip": [
                        field("model"),
                        field("kind"),
                        percent("mean_confidence", "mean confidence"),
                        percent("accuracy"),
                        count(),
                    ],
                },
            },
        ],
    }
    spec = charts.facetted(
        inner, "panel", columns=3, title=charts.titled("Reliability diagrams", "marker size = responses in bin")
    )
    return charts.chart(spec, charts.rows(data), "reliability diagrams")


def refusal_error_bars(metrics: Mapping[str, Mapping[str, float]], order: Sequence[str]) -> str | None:
    """False and missed refusal rates side by side per model; None if both are undefined for all."""
    names = {
        "false_refusal_rate": "false refusal rate (refused answerable)",
        "missed_refusal_rate": "missed refusal rate (answered unanswerable)",
    }
    models = [m for m in order if any(_defined(metrics[m].get(k)) for k in names)]
    if not models:
        return None
    if few := charts.too_few(models, "model", "False vs missed refusals"):
        return few
    data = [
        {"model": m, "rate": label, "value": metrics[m].get(key), "n": metrics[m].get("n")}
        for m in models
        for key, label in names.items()
    ]
    spec = {
        "title": charts.titled("False vs missed refusals", "no bar: undefined"),
        "width": {"step": 14},
        "height": 260,
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": field("model", title=None, sort=list(models), axis={"labelAngle": -30}),
            "xOffset": field("rate"),
            "y": field("value", "quantitative", "rate", scale={"domain": [0, 1]}),
            "color": field(
                "rate",
                title=None,
                scale={"range": ["#e69f00", "#0072b2"]},
                legend={"orient": "top", "direction": "vertical"},
            ),
            "tooltip": [field("model"), field("rate"), percent("value", "value"), count()],
        },
    }
    return charts.chart(spec, data, "false and missed refusal rate bars")
