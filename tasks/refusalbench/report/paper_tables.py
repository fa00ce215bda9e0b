"""The tables behind the report's paper figures (seed paper Figs. 8, 11, 13, 16, 23, 24–25):
pure functions of the run folder's files, tested by hand.

- :func:`aggregate_confusion`, :func:`prediction_shares`: expected × predicted counts summed over
  the models, and each prediction's share of all predictions (Fig. 8)
- :func:`confusion_by_intensity`: the same counts per intensity, from the judged rows (scored
  rows only, counted by ``scoring.breakdowns.confusion`` as the per-model matrices are)
- :func:`model_domain_grid`: one metric per model × domain from the breakdown (Fig. 11)
- :func:`domain_distribution`: benchmark items per domain (Fig. 13)
- :func:`class_difficulty`: refusal accuracy per class across models, hardest first, with its
  spread (Fig. 16's ranking of classes, for the targets), and :func:`generation_class_ranking`:
  the generation pass rate per class from ``gv_analysis.json`` (Fig. 16 as the paper draws it)
- :func:`refusal_ranking`: refusal accuracy and the hierarchical score per model (Fig. 23)
- :func:`dashboard_panels`: the metric pairs of the per-model dashboards (Figs. 24–25)

Every metric value is read from metrics.json or the breakdown (both made by ``scoring``); the
tables here only count, select, order and average across models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core.charts import ordered
from refusalbench.tasks.core.html_page import is_nan
from refusalbench.tasks.refusalbench.decisions import ANSWER
from refusalbench.tasks.refusalbench.scoring.breakdowns import confusion
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec, multi_document_metrics
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, INTENSITIES, PERTURBATION_CLASSES, REFUSAL_CODES

# The dashboards' panels (Figs. 24–25): the skills the paper sets side by side per model.
DASHBOARD_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Overall", ("calibrated_refusal_score", "hierarchical_score")),
    ("Answering vs refusing", ("answer_accuracy", "refusal_accuracy")),
    ("Detecting vs categorising", ("correct_refusal_rate", "category_accuracy")),
    ("Errors", ("false_refusal_rate", "missed_refusal_rate")),
    ("Multi-document answers", ("answer_quality_score", "hybrid_score")),
)
# Fig. 11's panels: answering and refusing per domain (GaRAGe's answer quality where it is scored).
DOMAIN_METRICS: tuple[str, ...] = ("answer_accuracy", "answer_quality_score", "refusal_accuracy")


def _counts_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """``expected``/``predicted``/``count`` rows as a matrix, rows and columns in taxonomy order."""
    expected = ordered(table["expected"].astype(str).tolist(), [ANSWER_CORRECTLY, *REFUSAL_CODES])
    predicted = ordered(table["predicted"].astype(str).tolist(), [ANSWER, *REFUSAL_CODES])
    return (
        table.pivot_table(index="expected", columns="predicted", values="count", aggfunc="sum", fill_value=0)
        .reindex(index=expected, columns=predicted, fill_value=0)
        .astype(int)
    )


def aggregate_confusion(table: pd.DataFrame | None) -> pd.DataFrame:
    """Expected (rows) × predicted (columns) counts summed over every model of ``confusion``."""
    if table is None or table.empty:
        return pd.DataFrame()
    return _counts_matrix(table)


def prediction_shares(matrix: pd.DataFrame) -> pd.Series:
    """Each predicted decision's share of all predictions (the columns of :func:`aggregate_confusion`)."""
    total = int(matrix.to_numpy().sum()) if not matrix.empty else 0
    if not total:
        return pd.Series(dtype=float)
    return matrix.sum(axis=0) / total


def confusion_by_intensity(judged: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """{intensity: expected × predicted counts over every model}, from the scored judged rows."""
    if judged is None or judged.empty or "intensity" not in judged.columns or judged["intensity"].isna().all():
        return {}
    rows = ensure_prepared(judged)
    rows = rows[rows["scored"].to_numpy(dtype=bool)]
    intensities = ordered(rows["intensity"].dropna().astype(str).unique().tolist(), INTENSITIES)
    out = {}
    for intensity in intensities:
        part = confusion(rows[rows["intensity"].astype(str) == intensity])
        if not part.empty:
            out[intensity] = _counts_matrix(part)
    return out


def model_domain_grid(breakdown: pd.DataFrame | None, metric: str, models: Sequence[str]) -> pd.DataFrame:
    """``metric`` per model (rows, in ``models`` order) × domain (columns), from the breakdown; NaN undefined."""
    if breakdown is None or breakdown.empty:
        return pd.DataFrame()
    part = breakdown[(breakdown["group"] == "domain") & (breakdown["metric"] == metric)]
    if part.empty:
        return pd.DataFrame()
    grid = part.pivot_table(index="model", columns="value", values="estimate", aggfunc="first", dropna=False)
    rows = [m for m in models if m in grid.index] + sorted(m for m in grid.index if m not in models)
    grid = grid.reindex(index=rows, columns=sorted(grid.columns, key=str)).astype(float)
    return grid if grid.notna().to_numpy().any() else pd.DataFrame()


def domain_distribution(benchmark: pd.DataFrame | None) -> pd.DataFrame:
    """Benchmark items per domain (domain, items, share), largest first; empty where no item has one."""
    if benchmark is None or "domain" not in benchmark.columns:
        return pd.DataFrame(columns=["domain", "items", "share"])
    domains = benchmark["domain"].dropna().astype(str)
    counts = domains.value_counts()
    table = pd.DataFrame({"domain": counts.index.astype(str), "items": counts.to_numpy(dtype=int)})
    table["share"] = table["items"] / len(benchmark)
    return table.sort_values(["items", "domain"], ascending=[False, True]).reset_index(drop=True)


def class_difficulty(breakdown: pd.DataFrame | None, metric: str = "refusal_accuracy") -> pd.DataFrame:
    """Per perturbation class: ``metric`` across models (mean, std, min, max, models), hardest first."""
    columns = ["perturbation_class", "mean", "std", "min", "max", "models"]
    if breakdown is None or breakdown.empty:
        return pd.DataFrame(columns=columns)
    part = breakdown[(breakdown["group"] == "perturbation_class") & (breakdown["metric"] == metric)]
    part = part[pd.to_numeric(part["estimate"], errors="coerce").notna()]
    if part.empty:
        return pd.DataFrame(columns=columns)
    stats = part.groupby("value")["estimate"].agg(["mean", "std", "min", "max", "count"]).reset_index()
    stats = stats.rename(columns={"value": "perturbation_class", "count": "models"})
    stats["std"] = stats["std"].fillna(0.0)  # one model: no spread
    rank = {c: i for i, c in enumerate(PERTURBATION_CLASSES)}
    stats["_order"] = stats["perturbation_class"].map(lambda c: rank.get(c, len(rank)))
    return stats.sort_values(["mean", "_order"]).reset_index(drop=True)[columns]


def class_values(breakdown: pd.DataFrame, metric: str = "refusal_accuracy") -> pd.DataFrame:
    """The per-model points behind :func:`class_difficulty`: perturbation_class, model, estimate."""
    part = breakdown[(breakdown["group"] == "perturbation_class") & (breakdown["metric"] == metric)]
    part = part[pd.to_numeric(part["estimate"], errors="coerce").notna()]
    return part[["value", "model", "estimate"]].rename(columns={"value": "perturbation_class"})


def generation_class_ranking(analysis: Mapping[str, Any] | None) -> pd.Series:
    """The generation pass rate per class (all generator × verifier pairs), hardest first."""
    rates = {str(k): float(v) for k, v in ((analysis or {}).get("pass_rate_by_class") or {}).items() if not is_nan(v)}
    return pd.Series(rates, dtype=float).sort_values(kind="stable")


def refusal_ranking(metrics: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """Models with a refusal accuracy: it and the hierarchical score, lowest refusal accuracy first."""
    rows = [
        {
            "model": m,
            "refusal_accuracy": float(v["refusal_accuracy"]),
            "hierarchical_score": math.nan if is_nan(v.get("hierarchical_score")) else float(v["hierarchical_score"]),
        }
        for m, v in metrics.items()
        if not is_nan(v.get("refusal_accuracy"))
    ]
    frame = pd.DataFrame(rows, columns=["model", "refusal_accuracy", "hierarchical_score"])
    return frame.sort_values(["refusal_accuracy", "model"]).reset_index(drop=True)


def dashboard_panels(metrics: Mapping[str, Mapping[str, float]]) -> list[tuple[str, tuple[str, ...]]]:
    """The dashboard panels some model has a value for (the multi-document one only on GaRAGe runs)."""
    multi = set(multi_document_metrics())
    panels = []
    for title, names in DASHBOARD_PANELS:
        kept = tuple(n for n in names if n not in multi or any(not is_nan(v.get(n)) for v in metrics.values()))
        if kept and any(not is_nan(v.get(n)) for v in metrics.values() for n in kept):
            panels.append((title, kept))
    return panels


def metric_title(name: str) -> str:
    """A metric's words, as declared (``scoring.metrics``)."""
    return metric_spec(name).title
