"""The report's generation figures, drawn from ``gv_analysis.json`` (seed paper Figs. 2, 4, 12, 14, 15, 17).

- benchmark composition: items per perturbation class x intensity (Fig. 2)
- generator contributions: accepted and sampled items per generator, stacked by class (Fig. 12)
- pass rate per generator x class and generator x intensity (Figs. 4, 15)
- self-evaluation bias per class, for models that both generate and verify (Fig. 17)
- verifier agreement: pairwise Cohen's kappa (Fig. 14)
- self vs cross pass rate per model and averaged, on the matched set (Fig. 3; ``matched_set``)

The tables come from the run's candidates and verifications (``tasks.gv_analysis``, effective
verdicts); here they are shaped into frames (pure functions, tested) and charted. A figure the
run cannot have is replaced by one line that names what it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field, ordered, percent
from refusalbench.tasks.core.html_page import escape, is_nan
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


# ---------------------------------------------------------------- charts


def _long(table: pd.DataFrame, row: str, column: str, value: str) -> list[dict[str, Any]]:
    """A (row x column) table as one record per cell."""
    return [{row: str(r), column: str(c), value: table.at[r, c]} for r in table.index for c in table.columns]


def _stacked(table: pd.DataFrame, row: str, stack: str, title: str, x_title: str) -> dict[str, Any]:
    """One bar per row of ``table``, stacked by its columns, each bar's total above it."""
    bars = {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": field(row, title=x_title, sort=[str(i) for i in table.index], axis={"labelAngle": -30}),
            "y": field("items", "quantitative", "items"),
            "color": field(stack, sort=[str(c) for c in table.columns]),
            "tooltip": [field(row), field(stack), count("items", "items")],
        },
    }
    totals = {
        "transform": [{"aggregate": [{"op": "sum", "field": "items", "as": "total"}], "groupby": [row]}],
        "mark": {"type": "text", "dy": -6, "fontSize": 9},
        "encoding": {
            "x": field(row, sort=[str(i) for i in table.index]),
            "y": field("total", "quantitative"),
            "text": field("total", "quantitative"),
            "tooltip": [field(row), count("total", "items")],
        },
    }
    return {"title": charts.titled(title), "width": {"step": 42}, "height": 240, "layer": [bars, totals]}


def composition_plot(table: pd.DataFrame) -> str:
    spec = _stacked(
        table,
        "perturbation_class",
        "intensity",
        f"Benchmark composition ({int(table.to_numpy().sum())} items)",
        "class",
    )
    return charts.chart(
        spec, _long(table, "perturbation_class", "intensity", "items"), "benchmark composition by class and intensity"
    )


def contribution_plot(panels: Sequence[tuple[str, pd.DataFrame]]) -> str:
    spec = {
        "title": charts.titled("Generator contributions by class"),
        "hconcat": [
            {
                **_stacked(table, "generator", "perturbation class", title, "generator"),
                "data": {"values": charts.compact(_long(table, "generator", "perturbation class", "items"))},
            }
            for title, table in panels
        ],
    }
    return charts.chart(spec, None, "generator contributions by class")


def heatmap(
    values: pd.DataFrame,
    title: str,
    *,
    xlabel: str,
    ylabel: str,
    vmin: float,
    vmax: float,
    scheme: str,
    label: str,
    cell: str,
    counts: pd.DataFrame | None = None,
    alt: str,
) -> str:
    """A matrix of ``values`` with the text of each cell (a d3 ``cell`` format; with ``counts``, a cell where
    nothing was judged is left out and the tooltip gives n)."""
    data = []
    for i, row in enumerate(values.index):
        for j, column in enumerate(values.columns):
            n = None if counts is None else int(counts.iat[i, j])
            if n == 0:
                continue  # nothing judged in this cell
            data.append({"row": str(row), "column": str(column), "value": values.iat[i, j], "n": n})
    tooltip = [
        field("row", title=ylabel),
        field("column", title=xlabel),
        field("value", "quantitative", label, format=cell),
    ]
    if counts is not None:
        tooltip.append(count())
    spec = {
        "title": charts.titled(title),
        **charts.heatmap(
            x="column",
            y="row",
            value="value",
            legend=label,
            scheme=scheme,
            tooltip=tooltip,
            x_title=xlabel,
            y_title=ylabel,
            x_order=[str(c) for c in values.columns],
            y_order=[str(r) for r in values.index],
            domain=(vmin, vmax),
            text=field("value", "quantitative", format=cell),
            cell=48,
        ),
    }
    return charts.chart(spec, data, alt)


def self_cross_plot(table: pd.DataFrame) -> str:
    """Paired bars per model (self, cross) with Wilson intervals, the mean pair last (Fig. 3)."""
    data = [
        {
            "model": str(model),
            "kind": label,
            "rate": table.at[model, column],
            "low": table.at[model, f"{column}_low"] if f"{column}_low" in table.columns else None,
            "high": table.at[model, f"{column}_high"] if f"{column}_high" in table.columns else None,
        }
        for model in table.index
        for column, label in (("self", "self (own candidates)"), ("cross", "cross (others' candidates)"))
    ]
    x = field("model", title=None, sort=[str(m) for m in table.index], axis={"labelAngle": -30})
    tooltip = [
        field("model"),
        field("kind"),
        percent("rate", "pass rate"),
        percent("low", "95% low"),
        percent("high", "95% high"),
    ]
    spec = {
        "title": charts.titled(
            "Self vs cross pass rate (Fig. 3 form)", "whiskers: Wilson 95% intervals; last pair: the mean"
        ),
        "width": {"step": 18},
        "height": 220,
        "encoding": {"x": x, "xOffset": field("kind"), "tooltip": tooltip},
        "layer": [
            {
                "mark": "bar",
                "encoding": {
                    "y": field("rate", "quantitative", "pass rate (matched set)", scale={"domain": [0, 1]}),
                    "color": field("kind", title=None),
                },
            },
            {
                "mark": {"type": "rule", "color": "black"},
                "encoding": {"y": field("low", "quantitative"), "y2": {"field": "high"}},
            },
        ],
    }
    return charts.chart(spec, data, "self vs cross pass rate on the matched set")


# ---------------------------------------------------------------- the section


def _names(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "none"


def _reason(title: str, why: str) -> str:
    return f"<p class='note'>{escape(title)}: {escape(why)}.</p>"


def _self_cross_figure(analysis: Mapping[str, Any], generators: list[str], verifiers: list[str]) -> str:
    title = "Self vs cross pass rate"
    table = self_cross_table(analysis)
    if not table.empty and table[["self", "cross"]].notna().any().any():
        return self_cross_plot(table)
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
        parts.append(composition_plot(composition))
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
        parts.append(contribution_plot(panels))
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
            heatmap(
                rates,
                f"{title} ({figure} form)",
                xlabel=axis_label,
                ylabel="generator",
                vmin=0,
                vmax=1,
                scheme="redyellowgreen",
                label="pass rate (PASS / PASS+FAIL)",
                cell=".0%",
                counts=judged,
                alt=title.lower(),
            )
        )

    parts.append(_self_cross_figure(analysis, generators, verifiers))

    bias = self_bias_table(analysis)
    if not bias.empty:
        parts.append(
            heatmap(
                bias,
                "Self-evaluation bias by class (self minus cross pass rate, in points)",
                xlabel="perturbation class",
                ylabel="model",
                vmin=-1,
                vmax=1,
                scheme="redblue",
                label="self minus cross pass rate",
                cell="+.1%",
                alt="self-evaluation bias by class",
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
            heatmap(
                kappa,
                "Verifier agreement (Cohen's kappa)",
                xlabel="verifier",
                ylabel="verifier",
                vmin=-1,
                vmax=1,
                scheme="purpleorange",
                label="kappa",
                cell=".2f",
                alt="verifier agreement heatmap",
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
        + "".join(p for p in parts if charts.has_chart(p))
        + "</div>"
        + "".join(p for p in parts if not charts.has_chart(p))
    )
