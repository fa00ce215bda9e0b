"""The report's model-comparison figures (seed paper Figs. 9, 10, 31, 32).

- scaling curves: the compared metrics (declared ``compared=True`` in ``scoring.paper_metrics``:
  answer accuracy, refusal accuracy, CRS) against parameter count, one line per model family
  (and training variant) with at least two sizes (Fig. 9)
- SFT vs DPO: the two variants of one family at the same size, side by side, on the compared
  ratios (Fig. 10)
- thinking budget: the variants of one model by extended-thinking token budget (Fig. 32)
- domain difficulty: 1 - mean accuracy across models per domain, for answering, refusing and
  both (Fig. 31)

What a model is (family, ``parameters_b``, ``training``, ``thinking_budget``) comes from the
model registry (``configs/models.yaml``) as the run's manifest recorded it. A figure the run's
models cannot support is replaced by one line naming what it lacks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field
from refusalbench.tasks.core.html_page import escape, frame_table, is_nan
from refusalbench.tasks.refusalbench.scoring.specs import all_metrics, metric_spec

_LISTED = 6  # models named in a one-line reason before "…"


def compared_metrics() -> tuple[tuple[str, str], ...]:
    """(metric, title) of the metrics the comparison figures draw: those declared ``compared=True``."""
    return tuple((name, metric_spec(name).title) for name in all_metrics() if metric_spec(name).compared)


def aligned_metrics() -> tuple[tuple[str, str], ...]:
    """The SFT vs DPO bars: the compared ratios (a formula of them, such as CRS, adds no bar)."""
    return tuple((name, title) for name, title in compared_metrics() if metric_spec(name).is_ratio)


@dataclass(frozen=True)
class ModelFacts:
    """What the registry says a model is (None: not stated)."""

    name: str
    family: str | None = None
    parameters_b: float | None = None
    training: str | None = None
    thinking_budget: int | None = None
    model_id: str | None = None

    @property
    def line(self) -> str | None:
        """The scaling line the model belongs to: its family, split by training variant."""
        if not self.family:
            return None
        return f"{self.family} ({self.training.upper()})" if self.training else self.family

    @property
    def variant_of(self) -> str:
        """What the thinking-budget variants of one model share: family and size, else the model id."""
        if self.family:
            size = f" {_size(self.parameters_b)}" if self.parameters_b else ""
            return f"{self.family}{size}" + (f" ({self.training.upper()})" if self.training else "")
        return self.model_id or self.name


def model_facts(models: Sequence[str], registry: Mapping[str, Mapping[str, Any]] | None) -> dict[str, ModelFacts]:
    """Facts for each scored model from the registry entries (a run config's ``models`` section)."""
    registry = registry or {}
    out = {}
    for name in models:
        entry = registry.get(name) or {}
        out[name] = ModelFacts(
            name,
            entry.get("family"),
            entry.get("parameters_b"),
            entry.get("training"),
            entry.get("thinking_budget"),
            entry.get("model"),
        )
    return out


def _size(parameters_b: float | None) -> str:
    return "?" if parameters_b is None else f"{parameters_b:g}B"


def _value(metrics: Mapping[str, Mapping[str, float]], model: str, metric: str) -> float:
    value = metrics.get(model, {}).get(metric)
    return math.nan if value is None or is_nan(value) else float(value)


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LISTED])
    return shown + (f", … ({len(items)} in all)" if len(items) > _LISTED else "") if items else "none"


# ---------------------------------------------------------------- tables


def scaling_table(metrics: Mapping[str, Mapping[str, float]], facts: Mapping[str, ModelFacts]) -> pd.DataFrame:
    """One row per model on a scaling line with at least two sizes (thinking variants left out)."""
    compared = [name for name, _ in compared_metrics()]
    rows = [
        {
            "line": f.line,
            "model": m,
            "parameters_b": float(f.parameters_b),
            **{k: _value(metrics, m, k) for k in compared},
        }
        for m, f in facts.items()
        if f.line and f.parameters_b and not f.thinking_budget
    ]
    frame = pd.DataFrame(rows, columns=["line", "model", "parameters_b", *compared])
    sizes = frame.groupby("line")["parameters_b"].transform("nunique")
    return frame[sizes >= 2].sort_values(["line", "parameters_b", "model"]).reset_index(drop=True)


def alignment_table(metrics: Mapping[str, Mapping[str, float]], facts: Mapping[str, ModelFacts]) -> pd.DataFrame:
    """One row per family and size that has both an SFT and a DPO model: their metrics side by side."""
    by_key: dict[tuple[str, float], dict[str, str]] = {}
    for model, f in facts.items():
        if f.family and f.parameters_b and f.training in ("sft", "dpo") and not f.thinking_budget:
            by_key.setdefault((f.family, float(f.parameters_b)), {}).setdefault(f.training, model)
    aligned = [name for name, _ in aligned_metrics()]
    rows = []
    for (family, size), pair in sorted(by_key.items()):
        if {"sft", "dpo"} <= set(pair):
            row: dict[str, Any] = {
                "family": family,
                "parameters_b": size,
                "sft_model": pair["sft"],
                "dpo_model": pair["dpo"],
            }
            for key in aligned:
                row[f"{key}_sft"] = _value(metrics, pair["sft"], key)
                row[f"{key}_dpo"] = _value(metrics, pair["dpo"], key)
            rows.append(row)
    columns = ["family", "parameters_b", "sft_model", "dpo_model"] + [
        f"{k}_{t}" for k in aligned for t in ("sft", "dpo")
    ]
    return pd.DataFrame(rows, columns=columns)


def thinking_table(metrics: Mapping[str, Mapping[str, float]], facts: Mapping[str, ModelFacts]) -> pd.DataFrame:
    """One row per model with a thinking budget, in groups (one model) of at least two budgets."""
    compared = [name for name, _ in compared_metrics()]
    rows = [
        {
            "group": f.variant_of,
            "model": m,
            "thinking_budget": int(f.thinking_budget),
            **{k: _value(metrics, m, k) for k in compared},
        }
        for m, f in facts.items()
        if f.thinking_budget is not None
    ]
    frame = pd.DataFrame(rows, columns=["group", "model", "thinking_budget", *compared])
    budgets = frame.groupby("group")["thinking_budget"].transform("nunique")
    frame = frame[budgets >= 2].sort_values(["group", "thinking_budget", "model"])
    # Each group is named after its variant with the smallest budget (the model without thinking).
    frame["group"] = frame["group"].map(frame.groupby("group")["model"].first())
    return frame.reset_index(drop=True)


def domain_difficulty(breakdown: pd.DataFrame | None) -> pd.DataFrame:
    """Per domain: mean answer and refusal accuracy across models, and difficulty = 1 - mean.

    ``difficulty`` averages the answer and refusal difficulties (the paper's overall score);
    rows run from the hardest domain to the easiest.
    """
    columns = [
        "domain",
        "models",
        "answer_accuracy",
        "refusal_accuracy",
        "answer_difficulty",
        "refusal_difficulty",
        "difficulty",
    ]
    if breakdown is None or breakdown.empty:
        return pd.DataFrame(columns=columns)
    part = breakdown[
        (breakdown["group"] == "domain") & breakdown["metric"].isin(["answer_accuracy", "refusal_accuracy"])
    ].copy()
    part["estimate"] = pd.to_numeric(part["estimate"], errors="coerce")
    if part.empty:
        return pd.DataFrame(columns=columns)
    means = part.pivot_table(index="value", columns="metric", values="estimate", aggfunc="mean")
    means = means.reindex(columns=["answer_accuracy", "refusal_accuracy"])
    table = pd.DataFrame(
        {
            "domain": means.index.astype(str),
            "models": part.groupby("value")["model"].nunique().reindex(means.index).to_numpy(),
            "answer_accuracy": means["answer_accuracy"].to_numpy(),
            "refusal_accuracy": means["refusal_accuracy"].to_numpy(),
        }
    )
    table["answer_difficulty"] = 1 - table["answer_accuracy"]
    table["refusal_difficulty"] = 1 - table["refusal_accuracy"]
    table["difficulty"] = table[["answer_difficulty", "refusal_difficulty"]].mean(axis=1, skipna=True)
    return table.sort_values(["difficulty", "domain"], ascending=[False, True]).reset_index(drop=True)[columns]


# ---------------------------------------------------------------- charts


def _metric_rows(table: pd.DataFrame, keys: Sequence[str], metrics: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """One record per row of ``table`` and compared metric: ``keys``, the metric's title and its value."""
    return [
        {**{k: record[k] for k in keys}, "metric": title, "value": record[name]}
        for record in table.to_dict(orient="records")
        for name, title in metrics
    ]


def _per_metric(inner: dict[str, Any], metrics: Sequence[tuple[str, str]], title: str) -> dict[str, Any]:
    return charts.facetted(
        inner, "metric", order=[t for _, t in metrics], columns=len(metrics), title=charts.titled(title)
    )


def scaling_plot(table: pd.DataFrame) -> str:
    compared = compared_metrics()
    sizes = sorted(table["parameters_b"].unique())
    inner = {
        "width": 220,
        "height": 200,
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": field(
                "parameters_b",
                "quantitative",
                "parameters (billions, log scale)",
                scale={"type": "log"},
                axis={"values": [float(v) for v in sizes]},
            ),
            "y": field("value", "quantitative", "score", scale={"domain": [0, 1]}),
            "color": field("line", title="family"),
            "tooltip": [
                field("model"),
                field("line", title="family"),
                field("parameters_b", "quantitative", "parameters (B)"),
                field("metric"),
                field("value", "quantitative", "score", format=".3f"),
            ],
        },
    }
    data = _metric_rows(table, ["line", "model", "parameters_b"], compared)
    return charts.chart(_per_metric(inner, compared, "Scaling by model family"), data, "scaling curves by model family")


def alignment_plot(table: pd.DataFrame) -> str:
    aligned = aligned_metrics()
    data = [
        {
            "pair": f"{record['family']} {_size(record['parameters_b'])}",
            "variant": variant.upper(),
            "model": record[f"{variant}_model"],
            "metric": title,
            "value": record[f"{name}_{variant}"],
        }
        for record in table.to_dict(orient="records")
        for name, title in aligned
        for variant in ("sft", "dpo")
    ]
    inner = {
        "width": {"step": 40},
        "height": 200,
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": field("pair", title=None, axis={"labelAngle": -30}),
            "xOffset": field("variant"),
            "y": field("value", "quantitative", "score (no bar: undefined)", scale={"domain": [0, 1]}),
            "color": field("variant", title=None, scale={"domain": ["SFT", "DPO"], "range": ["#999999", "#0072b2"]}),
            "tooltip": [
                field("model"),
                field("variant"),
                field("metric"),
                field("value", "quantitative", "score", format=".3f"),
            ],
        },
    }
    return charts.chart(_per_metric(inner, aligned, "SFT vs DPO at each size"), data, "SFT vs DPO bars")


def thinking_plot(table: pd.DataFrame) -> str:
    compared = compared_metrics()
    inner = {
        "width": 220,
        "height": 200,
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": field("thinking_budget", "ordinal", "thinking budget (tokens)"),
            "y": field("value", "quantitative", "score", scale={"domain": [0, 1]}),
            "color": field("group", title="model"),
            "tooltip": [
                field("model"),
                field("thinking_budget", "quantitative", "thinking budget"),
                field("metric"),
                field("value", "quantitative", "score", format=".3f"),
            ],
        },
    }
    data = _metric_rows(table, ["group", "model", "thinking_budget"], compared)
    return charts.chart(
        _per_metric(inner, compared, "Effect of the thinking budget"), data, "metrics by thinking budget"
    )


def difficulty_plot(table: pd.DataFrame) -> str:
    kinds = (("answer_difficulty", "answering"), ("refusal_difficulty", "refusing"), ("difficulty", "overall"))
    data = [
        {"domain": record["domain"], "kind": label, "value": record[key], "n": record["models"]}
        for record in table.to_dict(orient="records")
        for key, label in kinds
    ]
    spec = {
        "title": charts.titled("Domain difficulty", "hardest on top"),
        "width": 420,
        "height": {"step": 9},
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "y": field("domain", title=None, sort=[str(d) for d in table["domain"]]),
            "yOffset": field("kind", sort=[label for _, label in kinds]),
            "x": field(
                "value", "quantitative", "difficulty = 1 - mean accuracy across models", scale={"domain": [0, 1]}
            ),
            "color": field("kind", title=None, sort=[label for _, label in kinds]),
            "tooltip": [
                field("domain"),
                field("kind"),
                field("value", "quantitative", "difficulty", format=".3f"),
                count("n", "models"),
            ],
        },
    }
    return charts.chart(spec, data, "domain difficulty bars")


# ---------------------------------------------------------------- the section


def _reason(title: str, why: str) -> str:
    return f"<p class='note'>{escape(title)}: {escape(why)}.</p>"


def comparison_figures_html(
    metrics: Mapping[str, Mapping[str, float]],
    breakdown: pd.DataFrame | None,
    registry: Mapping[str, Mapping[str, Any]] | None,
) -> str:
    """Each model-comparison figure the run supports, each else one line naming what it lacks."""
    models = sorted(metrics)
    facts = model_facts(models, registry)
    parts: list[str] = []

    scaling = scaling_table(metrics, facts)
    if not scaling.empty:
        parts.append(scaling_plot(scaling))
    else:
        sized = [f"{m} ({f.family}, {_size(f.parameters_b)})" for m, f in facts.items() if f.family and f.parameters_b]
        bare = sum(1 for f in facts.values() if not (f.family and f.parameters_b))
        parts.append(
            _reason(
                "Scaling curves",
                "needs at least two sizes of one model family (this run: "
                f"{_listed(sized)}; {bare} model(s) without family and parameters_b in the registry)",
            )
        )

    alignment = alignment_table(metrics, facts)
    if not alignment.empty:
        parts.append(alignment_plot(alignment))
    else:
        marked = [
            f"{m} ({f.training.upper()}, {f.family or 'no family'}, {_size(f.parameters_b)})"
            for m, f in facts.items()
            if f.training
        ]
        parts.append(
            _reason(
                "SFT vs DPO",
                "needs an SFT and a DPO model of one family at the same size "
                f"(this run, models marked sft/dpo: {_listed(marked)})",
            )
        )

    thinking = thinking_table(metrics, facts)
    if not thinking.empty:
        parts.append(thinking_plot(thinking))
    else:
        budgets = [f"{m} ({f.thinking_budget})" for m, f in facts.items() if f.thinking_budget is not None]
        parts.append(
            _reason(
                "Thinking budget",
                "needs at least two thinking budgets of one model "
                f"(this run, models with thinking_budget: {_listed(budgets)})",
            )
        )

    difficulty = domain_difficulty(breakdown)
    if len(difficulty) >= 2:
        parts.append(difficulty_plot(difficulty))
    else:
        domains = difficulty["domain"].tolist()
        parts.append(
            _reason(
                "Domain difficulty", f"needs items from at least two domains (this run's domains: {_listed(domains)})"
            )
        )

    images = "".join(p for p in parts if charts.has_chart(p))
    notes = "".join(p for p in parts if not charts.has_chart(p))
    tables = "".join(
        f"<h3>{escape(title)}</h3>" + frame_table(table)
        for title, table in (
            ("Scaling", scaling),
            ("SFT vs DPO", alignment),
            ("Thinking budget", thinking),
            ("Domain difficulty", difficulty if len(difficulty) >= 2 else difficulty.iloc[0:0]),
        )
        if not table.empty
    )
    return (f"<div class='figs'>{images}</div>" if images else "") + notes + tables
