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

Each is one image whatever the number of models (small multiples, never one image per model:
the report must stay cheap at 30 targets). The data comes from the run folder (metrics.json and
the breakdown, confusion.parquet, judged.parquet, benchmark.parquet, gv_analysis.json) through
:mod:`.paper_tables`. A figure whose data the run lacks is not drawn; :class:`PaperFigures` keeps
its one-line reason for the report's "Figures not drawn" list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from refusalbench.tasks.core.html_page import escape, image_tag, section
from refusalbench.tasks.core.plotting import drawn_now, plot_text, png_base64
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

_ANNOTATE_CELLS = 120  # heatmap cells up to which each shows its value (beyond: colour alone)


def _row_height(rows: int) -> float:
    return 0.24 * rows + 1.6


def _hbars(
    ax: Any, fig: Figure, rows: int, positions: np.ndarray, values: np.ndarray, height: float, **style: Any
) -> None:
    """Horizontal bars of ``height`` rows drawn as one line collection: at 30 models, one artist instead
    of a Rectangle per bar (most of a bar chart's drawing time). The rows fill the axes (ylim set here)."""
    ax.set_ylim(rows - 0.5, -0.5)  # first row on top
    points_per_row = 0.77 * fig.get_figheight() / rows * 72  # the axes take 77% of the height (subplotpars)
    defined = ~np.isnan(values)
    ax.hlines(positions[defined], 0, values[defined], lw=height * points_per_row, capstyle="butt", **style)


# ---------------------------------------------------------------- drawing


def _shares_heatmap(
    ax: Any, matrix: pd.DataFrame, title: str, *, labels: bool = True, counts_shown: bool = True
) -> Any:
    """Counts coloured by share of the row (expected code) on ``ax``, with the count in each cell unless
    ``counts_shown`` is false (text is most of a heatmap's drawing time); returns the image."""
    counts = matrix.to_numpy(dtype=float)
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    image = ax.imshow(shares, vmin=0, vmax=1, cmap="Blues", aspect="auto", interpolation="nearest")
    for i, j in zip(*np.nonzero(counts)) if counts_shown else ():
        ax.text(
            j,
            i,
            f"{int(counts[i, j])}",
            ha="center",
            va="center",
            fontsize=7,
            color="white" if shares[i, j] > 0.6 else "black",
        )
    ax.set_xticks(
        range(matrix.shape[1]), [plot_text(short_code(c)) for c in matrix.columns], rotation=40, ha="right", fontsize=8
    )
    ax.set_yticks(
        range(matrix.shape[0]), [plot_text(short_code(r)) for r in matrix.index] if labels else [], fontsize=8
    )
    ax.set_title(title, fontsize=10)
    return image


def confusion_overview_plot(matrix: pd.DataFrame, shares: pd.Series) -> str:
    """The confusion matrix over every model, under a bar of each decision's share of all predictions."""
    fig = Figure(figsize=(0.9 * matrix.shape[1] + 3.2, 0.55 * matrix.shape[0] + 3.4))
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1, 3.2]}, sharex=True)
    values = shares.reindex(matrix.columns).fillna(0).to_numpy(dtype=float)
    top.bar(range(len(values)), values, color="#0072b2")
    for j, value in enumerate(values):
        top.text(j, value, f"{100 * value:.0f}%", ha="center", va="bottom", fontsize=8)
    top.set_ylim(0, max(0.05, values.max()) * 1.3)
    top.set_ylabel("share of all\npredictions", fontsize=8)
    top.set_title("Confusion across models (colour = share of the expected row, text = count)", fontsize=10)
    top.grid(axis="y", alpha=0.3)
    image = _shares_heatmap(bottom, matrix, "")
    bottom.set_xlabel("predicted (REFUSE_ prefix dropped)")
    bottom.set_ylabel("expected")
    fig.colorbar(image, ax=[top, bottom], label="share of row", shrink=0.7)
    return png_base64(fig)


def intensity_confusion_plot(by_intensity: Mapping[str, pd.DataFrame]) -> str:
    """One confusion panel per intensity (every model together), rows and columns shared."""
    expected = list(dict.fromkeys(r for m in by_intensity.values() for r in m.index))
    predicted = list(dict.fromkeys(c for m in by_intensity.values() for c in m.columns))
    fig = Figure(figsize=(3.2 + (0.55 * len(predicted) + 0.6) * len(by_intensity), 0.5 * len(expected) + 2.6))
    axes = fig.subplots(1, len(by_intensity), squeeze=False)[0]
    for index, (ax, (intensity, matrix)) in enumerate(zip(axes, by_intensity.items())):
        full = matrix.reindex(index=expected, columns=predicted, fill_value=0)
        image = _shares_heatmap(
            ax,
            full,
            f"{plot_text(intensity)}: all models (n = {int(full.to_numpy().sum())})",
            labels=index == 0,
            counts_shown=False,
        )
        ax.set_xlabel("predicted", fontsize=8)
    axes[0].set_ylabel("expected")
    fig.colorbar(image, ax=list(axes), label="share of row", shrink=0.8)
    return png_base64(fig)


def domain_heatmaps(grids: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """One heatmap per metric: models (rows) × domains (columns), shared model order."""
    width = sum(0.8 * grid.shape[1] + 1.2 for _, grid in grids) + 3.0
    fig = Figure(figsize=(width, _row_height(len(grids[0][1])) + 0.8))
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for index, (ax, (title, grid)) in enumerate(zip(axes, grids)):
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(
            np.ma.masked_invalid(values),
            vmin=0,
            vmax=1,
            aspect="auto",
            interpolation="nearest",
            cmap=colormaps["RdYlGn"].with_extremes(bad="#d9d9d9"),
        )
        if grid.size <= _ANNOTATE_CELLS:
            for i, j in np.argwhere(~np.isnan(values)):
                ax.text(j, i, f"{100 * values[i, j]:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(grid.shape[1]), [plot_text(c) for c in grid.columns], rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(grid.shape[0]), [plot_text(m) for m in grid.index] if index == 0 else [], fontsize=8)
        ax.set_title(plot_text(title), fontsize=10)
    fig.colorbar(image, ax=list(axes), label="score", shrink=0.8)
    return png_base64(fig)


def domain_distribution_plot(table: pd.DataFrame) -> str:
    """Benchmark items per domain, largest on top, with the share of all items."""
    fig = Figure(figsize=(6.5, 0.4 * len(table) + 1.6))
    ax = fig.add_subplot()
    positions = np.arange(len(table))
    ax.barh(positions, table["items"], color="#0072b2")
    for y, (items, share) in enumerate(zip(table["items"], table["share"])):
        ax.text(items, y, f" {100 * share:.1f}% ({items})", va="center", fontsize=8)
    ax.set_yticks(positions, [plot_text(d) for d in table["domain"]])
    ax.invert_yaxis()
    ax.set_xlim(0, table["items"].max() * 1.3)
    ax.set_xlabel("benchmark items")
    ax.set_title("Benchmark items per domain")
    ax.grid(axis="x", alpha=0.3)
    return png_base64(fig)


def class_difficulty_plot(table: pd.DataFrame, points: pd.DataFrame, generation: pd.Series) -> str:
    """Refusal accuracy per class across models (mean, min–max, each model a dot), hardest on top;
    beside it, where the run has it, the generation pass rate per class."""
    panels = 2 if not generation.empty else 1
    fig = Figure(figsize=(6.0 * panels, 0.45 * max(len(table), len(generation)) + 1.8))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    positions = np.arange(len(table))
    means = table["mean"].to_numpy(dtype=float)
    spread = np.vstack([means - table["min"].to_numpy(dtype=float), table["max"].to_numpy(dtype=float) - means])
    ax.barh(positions, means, xerr=spread, color="#e69f00", alpha=0.8, capsize=3)
    where = {c: i for i, c in enumerate(table["perturbation_class"])}
    ax.scatter(points["estimate"].astype(float), points["perturbation_class"].map(where), s=10, color="#333", zorder=3)
    ax.set_yticks(positions, [plot_text(c) for c in table["perturbation_class"]])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("refusal accuracy")
    ax.set_title("Refusal accuracy per class across models\n(bar: mean, whiskers: min–max, dots: models)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    if panels == 2:
        ax = axes[1]
        ax.barh(np.arange(len(generation)), generation.to_numpy(dtype=float), color="#009e73")
        ax.set_yticks(np.arange(len(generation)), [plot_text(c) for c in generation.index])
        ax.invert_yaxis()
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("pass rate (all generator × verifier pairs)")
        ax.set_title("Generation pass rate per class", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Class difficulty (hardest on top)", fontsize=11)
    fig.tight_layout()
    return png_base64(fig)


def refusal_ranking_plot(table: pd.DataFrame) -> str:
    """Refusal accuracy per model (bar coloured by value), the hierarchical score overlaid in blue."""
    fig = Figure(figsize=(7.0, _row_height(len(table))))
    ax = fig.add_subplot()
    positions = np.arange(len(table))
    accuracy = table["refusal_accuracy"].to_numpy(dtype=float)
    hierarchical = table["hierarchical_score"].to_numpy(dtype=float)
    _hbars(
        ax,
        fig,
        len(table),
        positions,
        accuracy,
        0.75,
        colors=colormaps["RdYlGn"](accuracy),
        label="refusal accuracy (colour: its value)",
    )
    _hbars(ax, fig, len(table), positions, hierarchical, 0.3, colors="#0072b2", label="hierarchical score")
    ax.invert_yaxis()  # lowest refusal accuracy at the bottom, as the paper orders them
    for y, (value, score) in enumerate(zip(accuracy, hierarchical)):
        text = f" {100 * value:.1f}%" + ("" if np.isnan(score) else f" (hier. {100 * score:.1f}%)")
        ax.text(np.nanmax([value, score]), y, text, va="center", fontsize=7)
    ax.set_yticks(positions, [plot_text(m) for m in table["model"]], fontsize=8)
    ax.set_xlim(0, 1.3)
    ax.set_xlabel("score")
    ax.set_title("Refusal accuracy ranking (blue: hierarchical score = detection F1 × category accuracy)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return png_base64(fig)


def dashboard_plot(
    metrics: Mapping[str, Mapping[str, float]], order: Sequence[str], panels: Sequence[tuple[str, tuple[str, ...]]]
) -> str:
    """One row per model (ranked order, best on top), one panel per pair of skills; undefined: no bar."""
    fig = Figure(figsize=(3.1 * len(panels) + 2.0, _row_height(len(order))))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    positions = np.arange(len(order))
    colours = ("#0072b2", "#e69f00")
    for ax, (title, names) in zip(axes, panels):
        height = 0.8 / len(names)
        for k, (name, colour) in enumerate(zip(names, colours)):
            values = np.array([float(metrics[m].get(name, np.nan)) for m in order], dtype=float)
            offset = (k - (len(names) - 1) / 2) * height
            _hbars(
                ax,
                fig,
                len(order),
                positions + offset,
                values,
                height,
                colors=colour,
                label=plot_text(metric_title(name)),
            )
        ax.set_yticks([])  # the model names once, on the first panel: no tick objects on the others
        ax.set_xlim(0, 1.02)
        ax.set_title(plot_text(title), fontsize=10)
        # Below the tick labels: about half an inch under the axes, whatever the figure's height.
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.5 / (0.77 * fig.get_figheight())))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(positions, [plot_text(m) for m in order], fontsize=8)
    return png_base64(fig)


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


def _confusion_sections(out: PaperFigures, run: Any, figure: Callable[..., str]) -> None:
    matrix = aggregate_confusion(run.confusion)
    if matrix.empty:
        out.leave_out("Confusion across models", "no scored response in this run")
        return
    shares = prediction_shares(matrix)
    body = (
        "<p>Every model's decisions together: rows are the expected outcome, columns the decision; "
        "the bars give each decision's share of all predictions.</p>"
        + image_tag(figure(confusion_overview_plot, matrix, shares), "confusion matrix across models")
        + _share_table(shares)
    )
    by_intensity = confusion_by_intensity(run.judged)
    if by_intensity:
        body += (
            "<h3>By intensity</h3><p>The same matrix per intensity (colour = share of the expected row; "
            "LOW items are answerable).</p>"
            + image_tag(figure(intensity_confusion_plot, by_intensity), "confusion by intensity across models")
        )
    else:
        out.leave_out("Confusion by intensity", "judged.parquet is absent or its rows carry no intensity")
    out.sections.append(section("Confusion across models", body))


def _domain_sections(out: PaperFigures, run: Any, order: Sequence[str], figure: Callable[..., str]) -> None:
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
        parts.append(image_tag(figure(domain_distribution_plot, distribution), "benchmark items per domain"))
    grids = [
        (metric_title(name), grid)
        for name in DOMAIN_METRICS
        if not (grid := model_domain_grid(run.breakdown, name, order)).empty
    ]
    if grids and grids[0][1].shape[1] >= 2:
        parts.append(image_tag(figure(domain_heatmaps, grids), "model by domain specialisation heatmaps"))
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


def paper_figures(run: Any, order: Sequence[str], figure: Callable[..., str] = drawn_now) -> PaperFigures:
    """The paper-figure sections of ``run`` (a :class:`~.page.ReportInputs`), models in ``order``; each
    image drawn by ``figure`` (``plotting.FigureSlots.add``: a placeholder filled later; default: at once)."""
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
                "No bar: undefined.</p>"
                + image_tag(figure(dashboard_plot, run.metrics, order, panels), "model dashboards"),
            )
        )
    else:
        out.leave_out("Model dashboards", "no model has a defined metric")
    ranking = refusal_ranking(run.metrics)
    if not ranking.empty:
        out.sections.append(
            section(
                "Refusal accuracy ranking", image_tag(figure(refusal_ranking_plot, ranking), "refusal accuracy ranking")
            )
        )
    else:
        out.leave_out("Refusal accuracy ranking", "no model has a refusal accuracy (no scored unanswerable item)")
    difficulty = class_difficulty(run.breakdown)
    if not difficulty.empty:
        plot = figure(
            class_difficulty_plot, difficulty, class_values(run.breakdown), generation_class_ranking(run.gv_analysis)
        )
        out.sections.append(section("Class difficulty", image_tag(plot, "class difficulty ranking")))
    else:
        out.leave_out("Class difficulty", "no refusal accuracy per perturbation class (no scored unanswerable item)")
    _domain_sections(out, run, order, figure)
    _confusion_sections(out, run, figure)
    return out
