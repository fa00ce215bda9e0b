"""The evaluation report: one self-contained HTML page, plus leaderboard forms for Prefect.

Everything is inline: CSS in a <style> block, plots as base64 PNGs drawn with matplotlib's
Agg canvas (no pyplot global state, no network, no JavaScript). Every piece of text that
comes from data — model names, group values, manifest entries — goes through
``html.escape`` before it reaches the page; in plots, ``$`` is escaped so a model name
cannot switch matplotlib into mathtext.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from refusalbench.tasks.decisions import ANSWER
from refusalbench.tasks.scoring import ScoreResult
from refusalbench.tasks.taxonomy import ANSWER_CORRECTLY, INTENSITIES, PERTURBATION_CLASSES, REFUSAL_CODES

# ----------------------------------------------------------------- inputs


@dataclasses.dataclass
class ReportInputs:
    """What a report shows. Only ``metrics`` is required; absent tables skip their section."""

    metrics: Mapping[str, Mapping[str, float]]
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)
    breakdown: pd.DataFrame | None = None
    confusion: pd.DataFrame | None = None
    calibration: pd.DataFrame | None = None
    class_intensity: pd.DataFrame | None = None
    refusal_by_intensity: pd.DataFrame | None = None
    champions: pd.DataFrame | None = None
    manifest: Mapping[str, Any] | None = None
    gv_analysis: Mapping[str, Any] | None = None
    round_trend: pd.DataFrame | None = None
    title: str = "RefusalBench report"
    generated_at: str | None = None

    @classmethod
    def from_score(cls, result: ScoreResult, **optional: Any) -> "ReportInputs":
        """Inputs from a ScoreResult; ``optional`` sets manifest, gv_analysis, round_trend, title."""
        return cls(
            metrics=result.metrics,
            intervals=result.intervals,
            breakdown=result.breakdown,
            confusion=result.confusion,
            calibration=result.calibration,
            class_intensity=result.class_intensity,
            refusal_by_intensity=result.refusal_by_intensity,
            champions=result.champions,
            generated_at=result.generated_at,
            **optional,
        )


# ----------------------------------------------------------------- leaderboard

LEADERBOARD_METRICS: tuple[tuple[str, str], ...] = (
    ("calibrated_refusal_score", "CRS"),
    ("answer_accuracy", "Answer acc."),
    ("refusal_accuracy", "Refusal acc."),
    ("false_refusal_rate", "FRR"),
    ("missed_refusal_rate", "MRR"),
    ("detection_f1", "Detection F1"),
    ("category_accuracy", "Category acc."),
    ("hierarchical_score", "Hierarchical"),
    ("ece", "ECE"),
)
_RANK_METRIC = "calibrated_refusal_score"


def _is_nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def ranked_models(metrics: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Models by calibrated refusal score, best first; undefined scores last, ties by name."""
    def key(model: str) -> tuple[int, float, str]:
        score = metrics[model].get(_RANK_METRIC, math.nan)
        return (1, 0.0, model) if _is_nan(score) else (0, -float(score), model)

    return sorted(metrics, key=key)


def _rounded(value: Any, digits: int = 4) -> float | None:
    return None if _is_nan(value) else round(float(value), digits)


def leaderboard_rows(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-safe dict per model, ranked (for a Prefect table artifact); NaN -> None."""
    intervals = intervals or {}
    rows = []
    for rank, model in enumerate(ranked_models(metrics), start=1):
        values = metrics[model]
        row: dict[str, Any] = {"rank": rank, "model": model}
        for name, _ in LEADERBOARD_METRICS:
            row[name] = _rounded(values.get(name))
        low, high = intervals.get(model, {}).get(_RANK_METRIC, (None, None))
        row["crs_ci_low"], row["crs_ci_high"] = _rounded(low), _rounded(high)
        row["n"] = int(values.get("n", 0))
        rows.append(row)
    return rows


def _fmt(value: Any, metric: str) -> str:
    if _is_nan(value):
        return "—"
    return f"{float(value):.3f}" if metric.startswith("ece") else f"{100 * float(value):.1f}%"


def _fmt_interval(interval: tuple[float, float] | None, metric: str) -> str:
    if not interval or _is_nan(interval[0]) or _is_nan(interval[1]):
        return ""
    low, high = interval
    if metric.startswith("ece"):
        return f"[{low:.3f}, {high:.3f}]"
    return f"[{100 * low:.1f}, {100 * high:.1f}]"


def _markdown_cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|").replace("`", "\\`").replace("\n", " ")


def leaderboard_markdown(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
) -> str:
    """The leaderboard as a markdown table (for a Prefect markdown artifact)."""
    intervals = intervals or {}
    header = ["#", "Model", *(label for _, label in LEADERBOARD_METRICS), "n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, model in enumerate(ranked_models(metrics), start=1):
        values = metrics[model]
        cells = [str(rank), _markdown_cell(model)]
        for name, _ in LEADERBOARD_METRICS:
            cell = _fmt(values.get(name), name)
            ci = _fmt_interval(intervals.get(model, {}).get(name), name)
            cells.append(f"{cell} {ci}".strip())
        cells.append(str(int(values.get("n", 0))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- plotting helpers

_PLOT_TEXT_LIMIT = 40


def _plot_text(text: Any) -> str:
    """Data text safe for matplotlib: no mathtext, bounded length."""
    value = str(text)
    if len(value) > _PLOT_TEXT_LIMIT:
        value = value[: _PLOT_TEXT_LIMIT - 1] + "…"
    return value.replace("$", r"\$")


def _short_code(code: str) -> str:
    return code.removeprefix("REFUSE_") if code.startswith("REFUSE_") else code


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(encoded: str, alt: str) -> str:
    return f'<img src="data:image/png;base64,{encoded}" alt="{html.escape(alt)}">'


def _label_positions(points: Sequence[tuple[float, float]], dx: float = 0.02,
                     height: float = 0.045, width: float = 0.3) -> list[tuple[float, float]]:
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


def _scatter(metrics: Mapping[str, Mapping[str, float]], x: str, y: str,
             title: str, xlabel: str, ylabel: str) -> str | None:
    points = [(m, v.get(x), v.get(y)) for m, v in metrics.items()]
    points = [(m, a, b) for m, a, b in points if not _is_nan(a) and not _is_nan(b)]
    if not points:
        return None
    fig = Figure(figsize=(6.5, 5))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], ls=":", color="#999", lw=1)
    for (model, a, b), (lx, ly) in zip(points, _label_positions([(a, b) for _, a, b in points])):
        ax.scatter([a], [b], s=60, zorder=3)
        moved = abs(ly - b) > 0.03
        ax.annotate(_plot_text(model), (a, b), xytext=(lx, ly), textcoords="data", fontsize=9,
                    va="center", arrowprops={"arrowstyle": "-", "color": "#888", "lw": 0.7} if moved else None)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _png(fig)


def _ordered(values: Sequence[str], preferred: Sequence[str]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [v for v in preferred if v in present] + sorted(v for v in present if v not in preferred)


def _heatmap(grid: pd.DataFrame, model: str) -> str:
    rows = _ordered(grid["perturbation_class"].astype(str).tolist(), PERTURBATION_CLASSES)
    cols = _ordered(grid["intensity"].astype(str).tolist(), INTENSITIES)
    table = grid.pivot_table(index="perturbation_class", columns="intensity", values="correct_rate",
                             aggfunc="mean").reindex(index=rows, columns=cols)
    counts = grid.pivot_table(index="perturbation_class", columns="intensity", values="n",
                              aggfunc="sum").reindex(index=rows, columns=cols)
    fig = Figure(figsize=(1.6 * len(cols) + 3.2, 0.55 * len(rows) + 1.6))
    ax = fig.add_subplot()
    data = np.ma.masked_invalid(table.to_numpy(dtype=float))
    image = ax.imshow(data, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            value = table.iat[i, j]
            if not _is_nan(value):
                ax.text(j, i, f"{100 * value:.0f}%\n(n={int(counts.iat[i, j])})", ha="center",
                        va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), [_plot_text(c) for c in cols])
    ax.set_yticks(range(len(rows)), [_plot_text(r) for r in rows])
    ax.set_xlabel("intensity")
    ax.set_ylabel("perturbation class")
    ax.set_title(f"Correct responses — {_plot_text(model)}")
    fig.colorbar(image, ax=ax, label="share correct")
    return _png(fig)


def _confusion_plot(table: pd.DataFrame, model: str) -> str:
    expected = _ordered(table["expected"].tolist(), [ANSWER_CORRECTLY, *REFUSAL_CODES])
    predicted = _ordered(table["predicted"].tolist(), [ANSWER, *REFUSAL_CODES])
    counts = table.pivot_table(index="expected", columns="predicted", values="count",
                               aggfunc="sum", fill_value=0).reindex(index=expected, columns=predicted,
                                                                   fill_value=0)
    matrix = counts.to_numpy(dtype=float)
    totals = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)
    fig = Figure(figsize=(0.9 * len(predicted) + 3, 0.6 * len(expected) + 2))
    ax = fig.add_subplot()
    image = ax.imshow(shares, vmin=0, vmax=1, cmap="Blues", aspect="auto")
    for i in range(len(expected)):
        for j in range(len(predicted)):
            if matrix[i, j]:
                ax.text(j, i, f"{int(matrix[i, j])}", ha="center", va="center", fontsize=8,
                        color="white" if shares[i, j] > 0.6 else "black")
    ax.set_xticks(range(len(predicted)), [_plot_text(_short_code(p)) for p in predicted],
                  rotation=40, ha="right")
    ax.set_yticks(range(len(expected)), [_plot_text(_short_code(e)) for e in expected])
    ax.set_xlabel("predicted (REFUSE_ prefix dropped)")
    ax.set_ylabel("expected")
    ax.set_title(f"Confusion matrix — {_plot_text(model)}\n(colour = row share, text = count)")
    fig.colorbar(image, ax=ax, label="share of row")
    return _png(fig)


def _intensity_curves(table: pd.DataFrame) -> str:
    order = _ordered(table["intensity"].astype(str).tolist(), INTENSITIES)
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    for model, part in table.groupby("model", sort=True):
        series = part.set_index("intensity")["refusal_rate"].reindex(order)
        ax.plot(range(len(order)), series.to_numpy(dtype=float), marker="o", label=_plot_text(model))
    ax.set_xticks(range(len(order)), [_plot_text(o) for o in order])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("perturbation intensity")
    ax.set_ylabel("refusal rate")
    ax.set_title("Refusal rate by intensity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def _reliability(calibration: pd.DataFrame, metrics: Mapping[str, Mapping[str, float]]) -> str:
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
                ax.scatter(sub["mean_confidence"], sub["accuracy"], s=sizes[part["kind"].to_numpy() == kind],
                           marker=marker, alpha=0.7, label=f"{kind} bins")
        ece = metrics.get(model, {}).get("ece", math.nan)
        ax.set_title(f"{_plot_text(model)}\nECE = {'—' if _is_nan(ece) else f'{ece:.3f}'}", fontsize=10)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("stated confidence")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Reliability diagrams (marker size = responses in bin)")
    fig.tight_layout()
    return _png(fig)


def _error_bars(metrics: Mapping[str, Mapping[str, float]], order: Sequence[str]) -> str | None:
    models = [m for m in order if not (_is_nan(metrics[m].get("false_refusal_rate"))
                                       and _is_nan(metrics[m].get("missed_refusal_rate")))]
    if not models:
        return None
    frr = [np.nan_to_num(float(metrics[m].get("false_refusal_rate", math.nan))) for m in models]
    mrr = [np.nan_to_num(float(metrics[m].get("missed_refusal_rate", math.nan))) for m in models]
    positions = np.arange(len(models))
    fig = Figure(figsize=(max(6.0, 0.9 * len(models) + 3), 4.5))
    ax = fig.add_subplot()
    ax.bar(positions - 0.2, frr, width=0.4, label="false refusal rate (refused answerable)", color="#e69f00")
    ax.bar(positions + 0.2, mrr, width=0.4, label="missed refusal rate (answered unanswerable)", color="#0072b2")
    ax.set_xticks(positions, [_plot_text(m) for m in models], rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rate")
    ax.set_title("False vs missed refusals (undefined rates drawn as 0)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _trend_plot(trend: pd.DataFrame) -> str | None:
    metric = next((m for m in ("calibrated_refusal_score", "refusal_accuracy", "answer_accuracy")
                   if m in trend.columns), None)
    if metric is None or "round" not in trend.columns or "model" not in trend.columns:
        return None
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    for model, part in trend.groupby("model", sort=True):
        part = part.sort_values("round")
        ax.plot(part["round"].astype(str), part[metric].astype(float), marker="o", label=_plot_text(model))
    ax.set_xlabel("round")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"{metric.replace('_', ' ').capitalize()} by round")
    ax.tick_params(axis="x", rotation=30)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


# ----------------------------------------------------------------- HTML helpers

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;
     padding:0 1rem;color:#222;line-height:1.45}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.3rem .55rem;text-align:right}
th{background:#f4f4f4} td.name,th.name{text-align:left}
tr:nth-child(even) td{background:#fafafa}
.ci{color:#777;font-size:.8em} .note{color:#555;font-style:italic}
.figs{display:flex;flex-wrap:wrap;gap:1rem} img{max-width:100%;height:auto}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:.85rem}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: Any) -> str:
    if _is_nan(value):
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return _e(json.dumps(value, default=str))
    return _e(value)


def _frame_table(frame: pd.DataFrame, max_rows: int = 200) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    body = []
    for record in frame.head(max_rows).itertuples(index=False):
        body.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in record) + "</tr>")
    extra = f'<p class="note">{len(frame) - max_rows} more rows not shown.</p>' if len(frame) > max_rows else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{extra}"


def _leaderboard_html(inputs: ReportInputs, order: Sequence[str]) -> str:
    head = "<tr><th>#</th><th class='name'>Model</th>" + "".join(
        f"<th>{_e(label)}</th>" for _, label in LEADERBOARD_METRICS) + "<th>n</th></tr>"
    rows = []
    for rank, model in enumerate(order, start=1):
        values = inputs.metrics[model]
        cells = [f"<td>{rank}</td>", f"<td class='name'>{_e(model)}</td>"]
        for name, _ in LEADERBOARD_METRICS:
            ci = _fmt_interval(inputs.intervals.get(model, {}).get(name), name)
            ci_html = f"<br><span class='ci'>{_e(ci)}</span>" if ci else ""
            cells.append(f"<td>{_e(_fmt(values.get(name), name))}{ci_html}</td>")
        cells.append(f"<td>{int(values.get('n', 0))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _section(title: str, body: str) -> str:
    return f"<section><h2>{_e(title)}</h2>{body}</section>"


def _figure(encoded: str | None, alt: str) -> str:
    return _img(encoded, alt) if encoded else f'<p class="note">Not enough data for: {_e(alt)}.</p>'


def _breakdown_tables(breakdown: pd.DataFrame) -> str:
    parts = []
    for dimension in ("perturbation_class", "intensity", "lever_id", "domain", "generator"):
        part = breakdown[breakdown["group"] == dimension]
        if part.empty:
            continue
        wide = part[part["metric"].isin(["answer_accuracy", "refusal_accuracy"])].pivot_table(
            index="value", columns=["model", "metric"], values="estimate", aggfunc="first", dropna=False)
        models = sorted(part["model"].unique())
        values = _ordered(part["value"].tolist(), [*PERTURBATION_CLASSES, *INTENSITIES])
        head = "<tr><th class='name'>" + _e(dimension) + "</th>" + "".join(
            f"<th>{_e(m)}<br><span class='ci'>answer / refusal acc.</span></th>" for m in models) + "</tr>"
        rows = []
        for value in values:
            cells = [f"<td class='name'>{_e(value)}</td>"]
            for model in models:
                def pick(metric: str) -> Any:
                    key = (model, metric)
                    return wide.at[value, key] if key in wide.columns and value in wide.index else math.nan
                cells.append(f"<td>{_fmt(pick('answer_accuracy'), 'answer_accuracy')} / "
                             f"{_fmt(pick('refusal_accuracy'), 'refusal_accuracy')}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        parts.append(f"<h3>By {_e(dimension.replace('_', ' '))}</h3><table>{head}{''.join(rows)}</table>")
    return "".join(parts)


def _mapping_html(data: Mapping[str, Any]) -> str:
    """A dict as tables: dict-of-dicts -> matrix, dict of scalars -> two columns, else JSON."""
    parts = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    if scalars:
        parts.append("<table>" + "".join(
            f"<tr><th class='name'>{_e(k)}</th><td class='name'>{_cell(v)}</td></tr>" for k, v in scalars.items())
            + "</table>")
    for key, value in data.items():
        if key in scalars:
            continue
        parts.append(f"<h3>{_e(key)}</h3>")
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            frame = pd.DataFrame.from_dict(value, orient="index")
            frame.insert(0, "", frame.index.astype(str))
            parts.append(_frame_table(frame))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            parts.append(_frame_table(pd.DataFrame.from_records(value)))
        else:
            parts.append(f"<pre>{_e(json.dumps(value, indent=2, default=str))}</pre>")
    return "".join(parts)


# ----------------------------------------------------------------- the page

def _non_empty(frame: pd.DataFrame | None) -> bool:
    return frame is not None and not frame.empty


def build_report(run: ReportInputs) -> str:
    """The whole report as one self-contained HTML string."""
    order = ranked_models(run.metrics)
    sections: list[str] = []

    lead = f"<p>{len(order)} model(s). Ranked by calibrated refusal score (CRS = mean of answer " \
           "accuracy and refusal accuracy); brackets are bootstrap 95% intervals; — = undefined.</p>"
    sections.append(_section("Leaderboard", lead + _leaderboard_html(run, order)))

    scatter_a = _scatter(run.metrics, "answer_accuracy", "refusal_accuracy", "Answer vs refusal accuracy",
                         "answer accuracy (answerable items)", "refusal accuracy (unanswerable items)")
    scatter_b = _scatter(run.metrics, "detection_f1", "category_accuracy", "Refusal detection vs categorisation",
                         "detection F1 (whether to refuse)", "category accuracy (why, given a correct refusal)")
    sections.append(_section("Answering vs refusing", "<div class='figs'>"
                             + _figure(scatter_a, "answer vs refusal accuracy scatter")
                             + _figure(scatter_b, "detection F1 vs category accuracy scatter") + "</div>"))

    sections.append(_section("False vs missed refusals",
                             _figure(_error_bars(run.metrics, order), "false and missed refusal rate bars")))

    if _non_empty(run.class_intensity):
        grid = run.class_intensity
        figures = [_img(_heatmap(grid[grid["model"] == m], m), f"class by intensity heatmap for {m}")
                   for m in sorted(grid["model"].unique())]
        body = "<p>Share of correct responses per class and intensity (LOW items are answerable).</p>"
        sections.append(_section("Perturbation class × intensity", body + "<div class='figs'>"
                                 + "".join(figures) + "</div>"))

    intensity = run.refusal_by_intensity
    if not _non_empty(intensity) and _non_empty(run.breakdown):
        part = run.breakdown[(run.breakdown["group"] == "intensity") & (run.breakdown["metric"] == "refusal_rate")]
        intensity = part.rename(columns={"value": "intensity", "estimate": "refusal_rate"})
    if _non_empty(intensity):
        sections.append(_section("Refusal rate by intensity",
                                 _img(_intensity_curves(intensity), "refusal rate by intensity curves")))

    if _non_empty(run.confusion):
        figures = [_img(_confusion_plot(run.confusion[run.confusion["model"] == m], m), f"confusion matrix for {m}")
                   for m in sorted(run.confusion["model"].unique())]
        sections.append(_section("Confusion matrices (expected × predicted)",
                                 "<div class='figs'>" + "".join(figures) + "</div>"))

    if _non_empty(run.calibration):
        ece_rows = "".join(
            f"<tr><td class='name'>{_e(m)}</td>"
            + "".join(f"<td>{_fmt(run.metrics[m].get(k), k)}</td>" for k in ("ece", "ece_answer", "ece_refusal"))
            + f"<td>{int(run.metrics[m].get('n_confidence', 0))}</td></tr>"
            for m in order)
        table = ("<table><tr><th class='name'>Model</th><th>ECE</th><th>ECE (answers)</th>"
                 f"<th>ECE (refusals)</th><th>n with confidence</th></tr>{ece_rows}</table>")
        sections.append(_section("Calibration", table + _img(_reliability(run.calibration, run.metrics),
                                                             "reliability diagrams")))
    else:
        sections.append(_section("Calibration", "<p class='note'>No confidences were elicited in this run, "
                                 "so there is no reliability diagram and ECE is undefined.</p>"))

    if _non_empty(run.breakdown):
        tables = _breakdown_tables(run.breakdown)
        if tables:
            sections.append(_section("Breakdowns", tables))

    if _non_empty(run.champions):
        sections.append(_section("Domain champions", _frame_table(run.champions)))

    if run.round_trend is not None and not run.round_trend.empty:
        trend_plot = _trend_plot(run.round_trend)
        body = (_img(trend_plot, "trend across rounds") if trend_plot else "") + _frame_table(run.round_trend)
        sections.append(_section("Trend across rounds", body))

    if run.gv_analysis:
        sections.append(_section("Generator × verifier analysis", _mapping_html(run.gv_analysis)))

    if run.manifest:
        sections.append(_section("Run metadata", _mapping_html(run.manifest)))

    stamp = f"<p class='note'>Generated {_e(run.generated_at)}</p>" if run.generated_at else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_e(run.title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{_e(run.title)}</h1>{stamp}"
        + "".join(sections)
        + "</body></html>\n"
    )
