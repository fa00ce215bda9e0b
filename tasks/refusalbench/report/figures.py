"""The RefusalBench report's plots, drawn with matplotlib's Agg canvas and returned as
base64 PNGs (``core.plotting``: the canvas, and data text made safe with ``plot_text``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from refusalbench.tasks.core.html_page import is_nan
from refusalbench.tasks.core.plotting import ordered, plot_text, png_base64
from refusalbench.tasks.refusalbench.decisions import ANSWER
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, INTENSITIES, PERTURBATION_CLASSES, REFUSAL_CODES

# Per-model figures (class × intensity, confusion) are drawn one image per model up to this many
# models, and as one image of small multiples beyond: at 30 targets, two images instead of 60.
PER_MODEL_FIGURES = 4
PANEL_COLUMNS = 5  # small multiples to a row


def short_code(code: str) -> str:
    """A refusal code without its REFUSE_ prefix (axis labels)."""
    return code.removeprefix("REFUSE_") if code.startswith("REFUSE_") else code


def _label_positions(
    points: Sequence[tuple[float, float]], dx: float = 0.02, height: float = 0.045, width: float = 0.3
) -> list[tuple[float, float]]:
    """Label anchors right of each point, nudged upwards so that nearby labels do not overlap.

    Greedy, in data units on the [0, 1] axes: labels are placed bottom-up and a label that
    would sit within ``height`` (and ``width`` horizontally) of one already placed moves up.
    """
    placed: list[tuple[float, float]] = []
    result: list[tuple[float, float]] = [(0.0, 0.0)] * len(points)
    for index in sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0])):
        x, y = points[index][0] + dx, points[index][1]
        while any(abs(y - py) < height and abs(x - px) < width for px, py in placed):
            y += height / 2
        placed.append((x, y))
        result[index] = (x, y)
    return result


def scatter_plot(
    metrics: Mapping[str, Mapping[str, float]], x: str, y: str, title: str, xlabel: str, ylabel: str
) -> str | None:
    """Metric ``y`` against metric ``x``, one labelled point per model; None if no model has both."""
    given = [(m, v.get(x), v.get(y)) for m, v in metrics.items()]
    points = [(m, a, b) for m, a, b in given if a is not None and b is not None and not is_nan(a) and not is_nan(b)]
    if not points:
        return None
    fig = Figure(figsize=(6.5, 5))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], ls=":", color="#999", lw=1)
    leaders = []  # a label moved off its point: a line from the point to the label's left end
    for (model, a, b), (lx, ly) in zip(points, _label_positions([(a, b) for _, a, b in points])):
        ax.scatter([a], [b], s=60, zorder=3)
        if abs(ly - b) > 0.03:
            leaders.append([(a, b), (lx, ly)])
        ax.annotate(plot_text(model), (a, b), xytext=(lx, ly), textcoords="data", fontsize=9, va="center")
    # One line collection, not an arrow per label: an annotation's arrow is clipped to its text box by
    # bisection, twice per figure (crop and draw), most of a 30-model scatter's time.
    ax.add_collection(LineCollection(leaders, colors="#888", linewidths=0.7, clip_on=False))  # labels may sit above
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return png_base64(fig)


def class_intensity_heatmap(grid: pd.DataFrame, model: str) -> str:
    """Share of correct responses per perturbation class × intensity for one model."""
    rows = ordered(grid["perturbation_class"].astype(str).tolist(), PERTURBATION_CLASSES)
    cols = ordered(grid["intensity"].astype(str).tolist(), INTENSITIES)
    table = grid.pivot_table(
        index="perturbation_class", columns="intensity", values="correct_rate", aggfunc="mean"
    ).reindex(index=rows, columns=cols)
    counts = grid.pivot_table(index="perturbation_class", columns="intensity", values="n", aggfunc="sum").reindex(
        index=rows, columns=cols
    )
    fig = Figure(figsize=(1.6 * len(cols) + 3.2, 0.55 * len(rows) + 1.6))
    ax = fig.add_subplot()
    data = np.ma.masked_invalid(table.to_numpy(dtype=float))
    image = ax.imshow(data, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            value = table.iat[i, j]
            if not is_nan(value):
                ax.text(j, i, f"{100 * value:.0f}%\n(n={int(counts.iat[i, j])})", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), [plot_text(c) for c in cols])
    ax.set_yticks(range(len(rows)), [plot_text(r) for r in rows])
    ax.set_xlabel("intensity")
    ax.set_ylabel("perturbation class")
    ax.set_title(f"Correct responses — {plot_text(model)}")
    fig.colorbar(image, ax=ax, label="share correct")
    return png_base64(fig)


def confusion_plot(table: pd.DataFrame, model: str) -> str:
    """Expected × predicted counts for one model, coloured by share of the row."""
    expected = ordered(table["expected"].tolist(), [ANSWER_CORRECTLY, *REFUSAL_CODES])
    predicted = ordered(table["predicted"].tolist(), [ANSWER, *REFUSAL_CODES])
    counts = table.pivot_table(
        index="expected", columns="predicted", values="count", aggfunc="sum", fill_value=0
    ).reindex(index=expected, columns=predicted, fill_value=0)
    matrix = counts.to_numpy(dtype=float)
    totals = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)
    fig = Figure(figsize=(0.9 * len(predicted) + 3, 0.6 * len(expected) + 2))
    ax = fig.add_subplot()
    image = ax.imshow(shares, vmin=0, vmax=1, cmap="Blues", aspect="auto")
    for i in range(len(expected)):
        for j in range(len(predicted)):
            if matrix[i, j]:
                ax.text(
                    j,
                    i,
                    f"{int(matrix[i, j])}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if shares[i, j] > 0.6 else "black",
                )
    ax.set_xticks(range(len(predicted)), [plot_text(short_code(p)) for p in predicted], rotation=40, ha="right")
    ax.set_yticks(range(len(expected)), [plot_text(short_code(e)) for e in expected])
    ax.set_xlabel("predicted (REFUSE_ prefix dropped)")
    ax.set_ylabel("expected")
    ax.set_title(f"Confusion matrix — {plot_text(model)}\n(colour = row share, text = count)")
    fig.colorbar(image, ax=ax, label="share of row")
    return png_base64(fig)


def _panel_grid(count: int, panel: tuple[float, float], columns: int = PANEL_COLUMNS) -> tuple[Figure, list[Any]]:
    """A figure of ``count`` panels of ``panel`` inches, ``columns`` to a row (small multiples)."""
    columns = max(1, min(columns, count))
    rows = math.ceil(count / columns)
    height = panel[1] * rows + 0.9
    fig = Figure(figsize=(panel[0] * columns + 1.6, height))
    fig.subplots_adjust(top=1 - 0.95 / height, bottom=0.5 / height, hspace=0.35)  # the title just above the panels
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.set_axis_off()
    return fig, list(axes[:count])


def _outer_ticks(
    ax: Any, index: int, count: int, columns: int, x_labels: Sequence[str], y_labels: Sequence[str], **x_style: Any
) -> None:
    """Tick labels on the bottom panels (x) and the first column (y) only; the inner panels get no tick
    objects at all (creating ticks is most of the cost of a panel)."""
    if index >= count - columns:
        ax.set_xticks(range(len(x_labels)), x_labels, fontsize=7, **x_style)
    else:
        ax.set_xticks([])
    if index % columns == 0:
        ax.set_yticks(range(len(y_labels)), y_labels, fontsize=7)
    else:
        ax.set_yticks([])


def _rows_of(table: pd.DataFrame, model: str) -> pd.DataFrame:
    """``model``'s part of a table pivoted for every model (indexed by model first), without the model level;
    empty where the pivot left the model out (every value of it NaN), as its own pivot would have been."""
    if model in table.index.get_level_values(0):
        return table.loc[model]
    return pd.DataFrame(columns=table.columns, dtype=float)


def class_intensity_panels(grid: pd.DataFrame, models: Sequence[str]) -> str:
    """:func:`class_intensity_heatmap` of every model as one figure of small multiples (same cells and text),
    class and intensity labels on the outer panels only, one colour bar."""
    rows = ordered(grid["perturbation_class"].astype(str).tolist(), PERTURBATION_CLASSES)
    cols = ordered(grid["intensity"].astype(str).tolist(), INTENSITIES)
    fig, axes = _panel_grid(len(models), (1.1 * len(cols) + 0.9, 0.42 * len(rows) + 1.0))
    columns = min(PANEL_COLUMNS, len(models))
    # One table for every model, cut per model below: a pivot per model was a third of the figure's time.
    keys = ["model", "perturbation_class"]
    rates = grid.pivot_table(index=keys, columns="intensity", values="correct_rate", aggfunc="mean")
    sizes = grid.pivot_table(index=keys, columns="intensity", values="n", aggfunc="sum")
    for index, (ax, model) in enumerate(zip(axes, models)):
        table = _rows_of(rates, model).reindex(index=rows, columns=cols)
        counts = _rows_of(sizes, model).reindex(index=rows, columns=cols)
        values = table.to_numpy(dtype=float)
        image = ax.imshow(
            np.ma.masked_invalid(values), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", interpolation="nearest"
        )
        for i, j in np.argwhere(~np.isnan(values)):
            # Inside its cell: left out of the crop's measure (measuring every cell's text cost a draw's worth).
            ax.text(
                j,
                i,
                f"{100 * values[i, j]:.0f}%\n(n={int(counts.iat[i, j])})",
                ha="center",
                va="center",
                fontsize=6.5,
                in_layout=False,
            )
        _outer_ticks(ax, index, len(models), columns, [plot_text(c) for c in cols], [plot_text(r) for r in rows])
        ax.set_title(plot_text(model), fontsize=8)
    fig.suptitle("Correct responses per perturbation class (rows) × intensity (columns)", fontsize=10)
    fig.colorbar(image, ax=axes, label="share correct", shrink=0.6)
    return png_base64(fig)


def confusion_panels(confusion: pd.DataFrame, models: Sequence[str]) -> str:
    """:func:`confusion_plot` of every model as one figure of small multiples (same counts, coloured by
    share of the row), the union of the expected and predicted codes on every panel, one colour bar."""
    expected = ordered(confusion["expected"].tolist(), [ANSWER_CORRECTLY, *REFUSAL_CODES])
    predicted = ordered(confusion["predicted"].tolist(), [ANSWER, *REFUSAL_CODES])
    fig, axes = _panel_grid(len(models), (0.42 * len(predicted) + 1.0, 0.36 * len(expected) + 1.2))
    columns = min(PANEL_COLUMNS, len(models))
    every = confusion.pivot_table(
        index=["model", "expected"], columns="predicted", values="count", aggfunc="sum", fill_value=0
    )  # one table for every model, cut per model below
    for index, (ax, model) in enumerate(zip(axes, models)):
        counts = _rows_of(every, model).reindex(index=expected, columns=predicted, fill_value=0)
        matrix = counts.to_numpy(dtype=float)
        totals = matrix.sum(axis=1, keepdims=True)
        shares = np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)
        image = ax.imshow(shares, vmin=0, vmax=1, cmap="Blues", aspect="auto", interpolation="nearest")
        for i, j in zip(*np.nonzero(matrix)):
            ax.text(
                j,
                i,
                f"{int(matrix[i, j])}",
                ha="center",
                va="center",
                fontsize=6.5,
                color="white" if shares[i, j] > 0.6 else "black",
                in_layout=False,
            )  # inside its cell
        _outer_ticks(
            ax,
            index,
            len(models),
            columns,
            [plot_text(short_code(p)) for p in predicted],
            [plot_text(short_code(e)) for e in expected],
            rotation=40,
            ha="right",
        )
        ax.set_title(plot_text(model), fontsize=8)
    fig.suptitle(
        "Confusion matrices: expected (rows) × predicted (columns, REFUSE_ prefix dropped); "
        "colour = row share, text = count",
        fontsize=10,
    )
    fig.colorbar(image, ax=axes, label="share of row", shrink=0.6)
    return png_base64(fig)


def intensity_curves(table: pd.DataFrame) -> str:
    """Refusal rate per intensity, one line per model."""
    order = ordered(table["intensity"].astype(str).tolist(), INTENSITIES)
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    for model, part in table.groupby("model", sort=True):
        series = part.set_index("intensity")["refusal_rate"].reindex(order)
        ax.plot(range(len(order)), series.to_numpy(dtype=float), marker="o", label=plot_text(model))
    ax.set_xticks(range(len(order)), [plot_text(o) for o in order])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("perturbation intensity")
    ax.set_ylabel("refusal rate")
    ax.set_title("Refusal rate by intensity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return png_base64(fig)


def reliability_diagrams(calibration: pd.DataFrame, metrics: Mapping[str, Mapping[str, float]]) -> str:
    """Accuracy against stated confidence per bin, one panel per model, ECE in the title."""
    table = calibration[calibration["scope"] == "all"]
    models = sorted(table["model"].unique())
    columns = min(3, len(models))
    rows = math.ceil(len(models) / columns)
    fig = Figure(figsize=(4.2 * columns, 4 * rows))
    for index, model in enumerate(models):
        ax = fig.add_subplot(rows, columns, index + 1)
        part = table[table["model"] == model]
        ax.plot([0, 1], [0, 1], ls=":", color="#999", lw=1)
        sizes = 20 + 200 * part["n"].to_numpy() / max(1, part["n"].max())
        for kind, marker in (("verbal", "o"), ("float", "s")):
            sub = part[part["kind"] == kind]
            if not sub.empty:
                ax.scatter(
                    sub["mean_confidence"],
                    sub["accuracy"],
                    s=sizes[part["kind"].to_numpy() == kind],
                    marker=marker,
                    alpha=0.7,
                    label=f"{kind} bins",
                )
        ece = metrics.get(model, {}).get("ece", math.nan)
        ax.set_title(f"{plot_text(model)}\nECE = {'—' if is_nan(ece) else f'{ece:.3f}'}", fontsize=10)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("stated confidence")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Reliability diagrams (marker size = responses in bin)")
    fig.tight_layout()
    return png_base64(fig)


def refusal_error_bars(metrics: Mapping[str, Mapping[str, float]], order: Sequence[str]) -> str | None:
    """False and missed refusal rates side by side per model; None if both are undefined for all."""
    models = [
        m
        for m in order
        if not (is_nan(metrics[m].get("false_refusal_rate")) and is_nan(metrics[m].get("missed_refusal_rate")))
    ]
    if not models:
        return None
    frr = [np.nan_to_num(float(metrics[m].get("false_refusal_rate", math.nan))) for m in models]
    mrr = [np.nan_to_num(float(metrics[m].get("missed_refusal_rate", math.nan))) for m in models]
    positions = np.arange(len(models))
    fig = Figure(figsize=(max(6.0, 0.9 * len(models) + 3), 4.5))
    ax = fig.add_subplot()
    ax.bar(positions - 0.2, frr, width=0.4, label="false refusal rate (refused answerable)", color="#e69f00")
    ax.bar(positions + 0.2, mrr, width=0.4, label="missed refusal rate (answered unanswerable)", color="#0072b2")
    ax.set_xticks(positions, [plot_text(m) for m in models], rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rate")
    ax.set_title("False vs missed refusals (undefined rates drawn as 0)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return png_base64(fig)
