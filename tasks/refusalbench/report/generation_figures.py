"""The report's generation figures, drawn from ``gv_analysis.json`` (seed paper Figs. 2, 4, 12, 14, 15, 17).

- benchmark composition: items per perturbation class x intensity (Fig. 2)
- generator contributions: accepted and sampled items per generator, stacked by class (Fig. 12)
- pass rate per generator x class and generator x intensity (Figs. 4, 15)
- self-evaluation bias per class, for models that both generate and verify (Fig. 17)
- verifier agreement: pairwise Cohen's kappa (Fig. 14)
- self vs cross pass rate per model and averaged, on the matched set (Fig. 3; ``matched_set``)

The tables come from the run's candidates and verifications (``tasks.gv_analysis``, effective
verdicts); here they are shaped into frames (pure functions, tested) and drawn. A figure the
run cannot have is replaced by one line that names what it lacks.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import PIL
from matplotlib.figure import Figure

from refusalbench.tasks.core import html_page, plotting
from refusalbench.tasks.core.html_page import escape, image_tag, is_nan
from refusalbench.tasks.core.plotting import ordered, plot_text, png_base64
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES

# gv_analysis.json keys drawn here (the G-V section leaves them out of its generic tables).
FIGURE_KEYS = (
    "pass_rate_by_generator_class",
    "pass_rate_by_generator_intensity",
    "self_evaluation_by_class",
    "benchmark_composition",
    "accepted_by_generator_class",
    "sampled_by_generator_class",
)
_EARLIER = "not recorded in this run's gv_analysis.json (analysed by an earlier version)"


# ---------------------------------------------------------------- tables


def _grid(nested: Mapping[str, Mapping[str, Any]], rows: Sequence[str], columns_first: Sequence[str]) -> pd.DataFrame:
    """``{row: {column: value}}`` as a frame, rows and columns in taxonomy order where they have one."""
    frame = pd.DataFrame.from_dict({r: dict(v) for r, v in nested.items()}, orient="index")
    if frame.empty:
        return frame
    index = ordered([str(i) for i in frame.index], rows)
    columns = ordered([str(c) for c in frame.columns], columns_first)
    return frame.reindex(index=index, columns=columns)


def composition_table(analysis: Mapping[str, Any]) -> pd.DataFrame:
    """Benchmark items per class (rows) x intensity (columns); 0 where a stratum has none."""
    table = _grid(analysis.get("benchmark_composition") or {}, PERTURBATION_CLASSES, INTENSITIES)
    return table.fillna(0).astype(int)


def contribution_table(analysis: Mapping[str, Any], stage: str) -> pd.DataFrame:
    """Items per generator (rows) x class (columns) at ``stage``: 'accepted' (by the filter) or 'sampled'."""
    generators = list((analysis.get("pass_rate_matrix") or {}).keys())
    table = _grid(analysis.get(f"{stage}_by_generator_class") or {}, generators, PERTURBATION_CLASSES)
    if not table.empty:  # a generator with none still gets its (empty) bar
        table = table.reindex(index=ordered([*table.index, *generators], generators))
    return table.fillna(0).astype(int)


def pass_rate_table(analysis: Mapping[str, Any], dimension: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pass rate and verdict count per generator (rows) x class or intensity (columns, ``dimension``)."""
    cells = analysis.get(f"pass_rate_by_generator_{dimension}") or {}
    generators = list((analysis.get("pass_rate_matrix") or {}).keys())
    preferred = PERTURBATION_CLASSES if dimension == "class" else INTENSITIES
    rates = _grid({g: {k: c.get("pass_rate") for k, c in v.items()} for g, v in cells.items()}, generators, preferred)
    judged = _grid({g: {k: c.get("judged") for k, c in v.items()} for g, v in cells.items()}, generators, preferred)
    return rates.astype(float), judged.fillna(0).astype(int)


def self_bias_table(analysis: Mapping[str, Any]) -> pd.DataFrame:
    """Self pass rate minus cross pass rate per model (rows) x class (columns); NaN where undefined."""
    cells = analysis.get("self_evaluation_by_class") or {}
    table = _grid(
        {m: {k: c.get("self_evaluation_bias") for k, c in v.items()} for m, v in cells.items()},
        sorted(cells),
        PERTURBATION_CLASSES,
    )
    return table.astype(float)


def self_cross_table(analysis: Mapping[str, Any]) -> pd.DataFrame:
    """Self and cross pass rate (and their Wilson bounds) per model that generates and verifies, on the
    matched set, then their mean (the paper's headline pair); empty without a matched set."""
    matched = analysis.get("matched_set") or {}
    rows = {
        model: {
            "self": row.get("self_pass_rate"),
            "cross": row.get("cross_pass_rate"),
            "self_low": (row.get("self_interval") or [None, None])[0],
            "self_high": (row.get("self_interval") or [None, None])[1],
            "cross_low": (row.get("cross_interval") or [None, None])[0],
            "cross_high": (row.get("cross_interval") or [None, None])[1],
        }
        for model, row in (matched.get("self_evaluation") or {}).items()
    }
    if not rows:
        return pd.DataFrame()
    rows["mean"] = {"self": matched.get("self_pass_rate"), "cross": matched.get("cross_pass_rate")}
    return pd.DataFrame.from_dict(rows, orient="index").astype(float)


def kappa_matrix(analysis: Mapping[str, Any]) -> pd.DataFrame:
    """Verifier x verifier Cohen's kappa, symmetric, 1 on the diagonal, NaN where undefined."""
    pairs = analysis.get("verifier_kappa") or []
    verifiers = list(dict.fromkeys([p["verifier_a"] for p in pairs] + [p["verifier_b"] for p in pairs]))
    matrix = pd.DataFrame(np.nan, index=verifiers, columns=verifiers)
    for verifier in verifiers:
        matrix.loc[verifier, verifier] = 1.0
    for pair in pairs:
        kappa = np.nan if is_nan(pair.get("kappa")) else float(pair["kappa"])
        matrix.loc[pair["verifier_a"], pair["verifier_b"]] = matrix.loc[pair["verifier_b"], pair["verifier_a"]] = kappa
    return matrix


# ---------------------------------------------------------------- drawing


def _stacked_bars(ax: Any, table: pd.DataFrame, title: str, ylabel: str) -> None:
    """One bar per row of ``table``, stacked by its columns, the total above each bar."""
    positions = np.arange(len(table.index))
    bottom = np.zeros(len(positions))
    for column in table.columns:
        values = table[column].to_numpy(dtype=float)
        ax.bar(positions, values, bottom=bottom, label=plot_text(column))
        bottom += values
    for x, total in zip(positions, bottom):
        ax.text(x, total, f"{int(total)}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(positions, [plot_text(i) for i in table.index], rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, max(1.0, bottom.max() * 1.15))


def composition_plot(table: pd.DataFrame) -> str:
    fig = Figure(figsize=(max(6.0, 1.1 * len(table.index) + 2.5), 4.5))
    ax = fig.add_subplot()
    _stacked_bars(ax, table, f"Benchmark composition ({int(table.to_numpy().sum())} items)", "items")
    ax.legend(title="intensity", fontsize=8)
    return png_base64(fig)


def contribution_plot(panels: Sequence[tuple[str, pd.DataFrame]]) -> str:
    fig = Figure(figsize=(max(6.0, 5.0 * len(panels)), 4.8))
    for index, (title, table) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        _stacked_bars(ax, table, title, "items")
        ax.legend(title="perturbation class", fontsize=7)
    fig.tight_layout()
    return png_base64(fig)


def heatmap(
    values: pd.DataFrame,
    title: str,
    *,
    xlabel: str,
    ylabel: str,
    vmin: float,
    vmax: float,
    cmap: str,
    label: str,
    cell: Any,
    counts: pd.DataFrame | None = None,
) -> str:
    """A matrix with one annotated cell per value (``cell(value)`` gives its text; NaN reads NA)."""
    rows, cols = list(values.index), list(values.columns)
    fig = Figure(figsize=(1.35 * len(cols) + 3.4, 0.6 * len(rows) + 2.0))
    ax = fig.add_subplot()
    image = ax.imshow(
        np.ma.masked_invalid(values.to_numpy(dtype=float)), vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto"
    )
    for i in range(len(rows)):
        for j in range(len(cols)):
            value = values.iat[i, j]
            if counts is not None and not counts.iat[i, j]:
                continue  # nothing judged in this cell
            text = "NA" if is_nan(value) else cell(value)
            if counts is not None:
                text += f"\n(n={int(counts.iat[i, j])})"
            red, green, blue, _ = image.cmap(image.norm(value)) if not is_nan(value) else (1, 1, 1, 1)
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax.set_xticks(range(len(cols)), [plot_text(c) for c in cols], rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [plot_text(r) for r in rows])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=label)
    return png_base64(fig)


def self_cross_plot(table: pd.DataFrame) -> str:
    """Paired bars per model (self, cross) with Wilson intervals, the mean pair last (Fig. 3)."""
    positions = np.arange(len(table.index))
    fig = Figure(figsize=(max(4.5, 0.9 * len(positions) + 2.5), 3.6))
    ax = fig.add_subplot()
    for offset, column, label in (
        (-0.2, "self", "self (own candidates)"),
        (0.2, "cross", "cross (others' candidates)"),
    ):
        values = table[column].to_numpy(dtype=float)
        low = table.get(f"{column}_low", pd.Series(np.nan, index=table.index)).to_numpy(dtype=float)
        high = table.get(f"{column}_high", pd.Series(np.nan, index=table.index)).to_numpy(dtype=float)
        ax.bar(positions + offset, np.nan_to_num(values), 0.4, label=label)
        bounded = ~np.isnan(low) & ~np.isnan(high)  # the mean pair has no interval
        ax.errorbar(
            (positions + offset)[bounded],
            values[bounded],
            yerr=np.vstack([values - low, high - values])[:, bounded],
            fmt="none",
            ecolor="black",
            elinewidth=0.8,
            capsize=2,
        )
        for x, value, top in zip(positions + offset, values, np.where(bounded, high, values)):
            if not np.isnan(value):
                ax.text(x, top + 0.02, _percent(value), ha="center", va="bottom", fontsize=7)
    ax.axvline(len(positions) - 1.5, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xticks(positions, [plot_text(i) for i in table.index], rotation=30, ha="right")
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("pass rate (matched set)")
    ax.set_title("Self vs cross pass rate (Fig. 3 form)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return png_base64(fig)


def _percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def _points(value: float) -> str:
    return f"{100 * value:+.1f}pp"


# ---------------------------------------------------------------- the section


def _names(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "none"


def _reason(title: str, why: str) -> str:
    return f"<p class='note'>{escape(title)}: {escape(why)}.</p>"


def _self_cross_figure(analysis: Mapping[str, Any], generators: list[str], verifiers: list[str]) -> str:
    title = "Self vs cross pass rate"
    table = self_cross_table(analysis)
    if not table.empty and table[["self", "cross"]].notna().any().any():
        return image_tag(self_cross_plot(table), "self vs cross pass rate on the matched set")
    if "matched_set" not in analysis or analysis["matched_set"] is None:
        return _reason(title, _EARLIER)
    if table.empty:
        return _reason(
            title,
            "needs a model that is both a generator and a verifier "
            f"(this run: generators {_names(generators)}; verifiers {_names(verifiers)})",
        )
    return _reason(title, "no matched candidate of " + _names(list(table.index[:-1])) + " has a verdict")


def generation_figures_html(analysis: Mapping[str, Any]) -> str:
    """Every generation figure the analysis allows, each else one line naming what it lacks."""
    parts: list[str] = []
    sampled = (analysis.get("funnel") or {}).get("sampled", 0)
    generators = list((analysis.get("pass_rate_matrix") or {}).keys())
    verifiers = list(next(iter((analysis.get("pass_rate_matrix") or {}).values()), {}).keys())

    composition = composition_table(analysis)
    if not composition.empty:
        parts.append(image_tag(composition_plot(composition), "benchmark composition by class and intensity"))
    else:
        parts.append(_reason("Benchmark composition", "the benchmark holds no item" if not sampled else _EARLIER))

    panels = [
        (f"{label} ({int(table.to_numpy().sum())})", table)
        for label, table in (
            ("Accepted by the filter", contribution_table(analysis, "accepted")),
            ("In the benchmark", contribution_table(analysis, "sampled")),
        )
        if not table.empty
    ]
    if panels:
        parts.append(image_tag(contribution_plot(panels), "generator contributions by class"))
    else:
        accepted = (analysis.get("funnel") or {}).get("accepted", 0)
        parts.append(_reason("Generator contributions", "no candidate was accepted" if not accepted else _EARLIER))

    for dimension, axis_label, figure in (
        ("class", "perturbation class", "Fig. 4"),
        ("intensity", "intensity", "Fig. 15"),
    ):
        rates, judged = pass_rate_table(analysis, dimension)
        title = f"Pass rate by generator and {axis_label}"
        if rates.empty or not judged.to_numpy().any():
            verdicts = sum((analysis.get("verdict_counts") or {}).get(v, 0) for v in ("PASS", "FAIL"))
            parts.append(_reason(title, "no candidate received a PASS or FAIL verdict" if not verdicts else _EARLIER))
            continue
        parts.append(
            image_tag(
                heatmap(
                    rates,
                    f"{title} ({figure} form)",
                    xlabel=axis_label,
                    ylabel="generator",
                    vmin=0,
                    vmax=1,
                    cmap="RdYlGn",
                    label="pass rate (PASS / PASS+FAIL)",
                    cell=_percent,
                    counts=judged,
                ),
                title.lower(),
            )
        )

    parts.append(_self_cross_figure(analysis, generators, verifiers))

    bias = self_bias_table(analysis)
    if not bias.empty:
        parts.append(
            image_tag(
                heatmap(
                    bias,
                    "Self-evaluation bias by class (self minus cross pass rate)",
                    xlabel="perturbation class",
                    ylabel="model",
                    vmin=-1,
                    vmax=1,
                    cmap="RdBu_r",
                    label="self minus cross pass rate",
                    cell=_points,
                ),
                "self-evaluation bias by class",
            )
        )
    elif analysis.get("self_evaluation"):
        both = analysis["self_evaluation"]
        judged_any = any(row.get("n_self") or row.get("n_cross") for row in both.values())
        parts.append(
            _reason(
                "Self-evaluation bias by class",
                _EARLIER if judged_any else f"no candidate of {_names(list(both))} received a PASS or FAIL verdict",
            )
        )
    else:
        parts.append(
            _reason(
                "Self-evaluation bias by class",
                "needs a model that is both a generator and a verifier "
                f"(this run: generators {_names(generators)}; verifiers {_names(verifiers)})",
            )
        )

    kappa = kappa_matrix(analysis)
    if len(kappa) >= 2:
        parts.append(
            image_tag(
                heatmap(
                    kappa,
                    "Verifier agreement (Cohen's kappa)",
                    xlabel="verifier",
                    ylabel="verifier",
                    vmin=-1,
                    vmax=1,
                    cmap="PuOr",
                    label="kappa",
                    cell=lambda v: f"{v:.2f}",
                ),
                "verifier agreement heatmap",
            )
        )
        undefined = [p for p in analysis.get("verifier_kappa") or [] if is_nan(p.get("kappa"))]
        parts.extend(
            _reason(f"NA for {p['verifier_a']} and {p['verifier_b']}", p.get("reason") or "undefined")
            for p in undefined
        )
    else:
        parts.append(_reason("Verifier agreement", f"needs at least two verifiers (this run: {_names(verifiers)})"))

    return (
        "<div class='figs'>"
        + "".join(p for p in parts if p.startswith("<img"))
        + "</div>"
        + "".join(p for p in parts if not p.startswith("<img"))
    )


def drawn_figures_key(analysis: Mapping[str, Any]) -> str:
    """A digest of all that :func:`generation_figures_html` depends on: the analysis, the code that draws
    it (this module, the plotting kit) and matplotlib's and Pillow's versions. Equal digests give the same
    HTML byte for byte, so a copy stored with its digest may stand in for drawing the figures again."""
    digest = hashlib.sha256(json.dumps(analysis, sort_keys=True, default=str).encode())
    for module in (sys.modules[__name__], plotting, html_page):
        assert module.__file__ is not None, "these modules are loaded from files"
        digest.update(Path(module.__file__).read_bytes())
    digest.update(f"{matplotlib.__version__} {PIL.__version__}".encode())
    return digest.hexdigest()[:20]
