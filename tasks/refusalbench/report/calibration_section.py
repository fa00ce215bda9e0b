"""The report's calibration section (paper §4.3 "Severe Miscalibration", App. F.2).

A table per model (rows with a stated confidence, ECE overall / answers / refusals, the share
of predictions at maximum confidence and their accuracy), Fig. 7 (ECE for answers vs refusals,
all models in one figure) and the reliability diagrams. In an evaluation run the confidences
come from the calibration pass (``calibration_judgments.parquet``); a judged-responses file
given to ``score`` brings its own. A run without confidences gets one line saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field
from refusalbench.tasks.core.html_page import escape, section
from refusalbench.tasks.refusalbench.report.figures import reliability_diagrams
from refusalbench.tasks.refusalbench.report.leaderboard import format_value
from refusalbench.tasks.refusalbench.scoring.calibration import FROM_CALIBRATION_PASS, MAX_CONFIDENCE

TITLE = "Calibration"
ECE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ece", "ECE"),
    ("ece_answer", "ECE (answers)"),
    ("ece_refusal", "ECE (refusals)"),
)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _percent(value: Any) -> str:
    number = _number(value)
    return "—" if math.isnan(number) else f"{100 * number:.1f}%"


def ece_answers_vs_refusals(metrics: Mapping[str, Mapping[str, Any]], order: Sequence[str]) -> str | None:
    """Fig. 7: ECE over answer attempts and over refusals, side by side per model (one chart);
    None when no model has either."""
    models = [
        m
        for m in order
        if not (
            math.isnan(_number(metrics[m].get("ece_answer"))) and math.isnan(_number(metrics[m].get("ece_refusal")))
        )
    ]
    if not models:
        return None
    if few := charts.too_few(models, "model", "ECE for answers vs refusals"):
        return few
    data = [
        {"model": m, "kind": kind, "ece": _number(metrics[m].get(key)), "n": _number(metrics[m].get("n_confidence"))}
        for m in models
        for key, kind in (("ece_answer", "answers"), ("ece_refusal", "refusals"))
    ]
    # Horizontal bars: 30 models stay legible in one chart; an undefined ECE (no such response) has no bar.
    spec = {
        "title": charts.titled("ECE for answers vs refusals (Fig. 7)", "no bar: undefined"),
        "width": 420,
        "height": {"step": 9},
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "y": field("model", title=None, sort=models),
            "yOffset": field("kind"),
            "x": field("ece", "quantitative", "expected calibration error (lower is better)"),
            "color": field("kind", title=None, scale={"range": ["#0072b2", "#e69f00"]}),
            "tooltip": [
                field("model"),
                field("kind"),
                field("ece", "quantitative", "ECE", format=".3f"),
                count("n", "n with confidence"),
            ],
        },
    }
    return charts.chart(spec, data, "ECE for answers vs refusals")


def calibration_table_html(
    metrics: Mapping[str, Mapping[str, Any]], max_confidence: Mapping[str, Mapping[str, Any]], order: Sequence[str]
) -> str:
    """Per model: rows with a confidence, ECE (all, answers, refusals), share at maximum confidence, its accuracy."""
    head = (
        "<tr><th class='name'>Model</th><th>n with confidence</th>"
        + "".join(f"<th>{escape(label)}</th>" for _, label in ECE_COLUMNS)
        + "<th>At maximum confidence</th><th>Accuracy at maximum</th></tr>"
    )
    rows = []
    for model in order:
        values, top = metrics[model], max_confidence.get(model, {})
        rows.append(
            f"<tr><td class='name'>{escape(model)}</td><td>{int(_number(values.get('n_confidence')) or 0)}</td>"
            + "".join(f"<td>{format_value(values.get(name), name)}</td>" for name, _ in ECE_COLUMNS)
            + f"<td>{_percent(top.get('max_confidence_share'))}</td>"
            + f"<td>{_percent(top.get('max_confidence_accuracy'))}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def calibration_section(
    metrics: Mapping[str, Mapping[str, Any]],
    calibration: pd.DataFrame | None,
    max_confidence: Mapping[str, Mapping[str, Any]] | None,
    source: str | None,
    order: Sequence[str],
) -> str:
    """The calibration section; one line when the run has no stated confidence."""
    order = [m for m in order if m in metrics]
    if calibration is None or calibration.empty or not any(_number(metrics[m].get("n_confidence")) > 0 for m in order):
        return section(
            TITLE,
            "<p class='note'>No confidences were elicited in this run (no calibration pass: "
            "evaluation.confidence is off), so ECE is undefined.</p>",
        )
    origin = (
        "the calibration pass: the same items asked again with a prompt that also asks for a confidence "
        "level (App. F.2); the headline metrics come from the plain prompt"
        if source == FROM_CALIBRATION_PASS
        else "the confidences stated in the scored responses"
    )
    note = (
        f"<p>Confidences from {escape(origin)}. Maximum confidence: VERY_CONFIDENT or a number ≥ "
        f"{MAX_CONFIDENCE:g}.</p>"
    )
    figure = charts.or_note(ece_answers_vs_refusals(metrics, order), "ECE for answers vs refusals")
    diagrams = reliability_diagrams(calibration, metrics)
    return section(TITLE, note + calibration_table_html(metrics, max_confidence or {}, order) + figure + diagrams)
