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

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from refusalbench.tasks.core.html_page import escape, figure_or_note, image_tag, section
from refusalbench.tasks.core.plotting import plot_text, png_base64
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
    """Fig. 7: ECE over answer attempts and over refusals, side by side per model (one figure);
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
    answers = np.array([_number(metrics[m].get("ece_answer")) for m in models])
    refusals = np.array([_number(metrics[m].get("ece_refusal")) for m in models])
    positions = np.arange(len(models))
    # Horizontal bars: 30 models stay legible in one figure.
    fig = Figure(figsize=(7.0, 1.2 + 0.32 * len(models)))
    ax = fig.add_subplot()
    ax.barh(positions - 0.2, np.nan_to_num(answers), height=0.4, color="#0072b2", label="answers")
    ax.barh(positions + 0.2, np.nan_to_num(refusals), height=0.4, color="#e69f00", label="refusals")
    for offset, values in ((-0.2, answers), (0.2, refusals)):  # undefined (no such response): said, not drawn as 0
        for position in positions[np.isnan(values)]:
            ax.text(0.005, position + offset, "n/a", va="center", fontsize=7, color="#666")
    ax.set_yticks(positions, [plot_text(m) for m in models], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(0.1, float(np.nanmax(np.concatenate([answers, refusals]))) * 1.1))
    ax.set_xlabel("expected calibration error (lower is better)")
    ax.set_title("ECE for answers vs refusals (Fig. 7)")
    ax.legend(fontsize=8, loc="best")
    ax.grid(axis="x", alpha=0.3)
    return png_base64(fig)


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
    figure = figure_or_note(ece_answers_vs_refusals(metrics, order), "ECE for answers vs refusals")
    diagrams = image_tag(reliability_diagrams(calibration, metrics), "reliability diagrams")
    return section(TITLE, note + calibration_table_html(metrics, max_confidence or {}, order) + figure + diagrams)
