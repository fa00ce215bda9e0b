"""The KnowOrNot report's charts: rates per retrieval x prompt x target with 95% intervals.

Vega-Lite specs drawn in the reader's browser, like the RefusalBench report's (``core.charts``:
data inlined, a tooltip on every mark). The paper reports abstention and factuality per target
under each retrieval strategy (its Tables 5-6); here each target is a panel, retrieval strategies
run along the axis and each system prompt is a bar with its interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core import charts
from refusalbench.tasks.core.charts import count, field, ordered, percent

RETRIEVAL_ORDER = ("direct", "long_context", "basic_rag", "hyde_rag")
PROMPT_ORDER = ("basic", "conservative", "opinion")
_COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")


def _count_column(rate: str) -> str:
    """The column counting what ``rate`` is a share of (``n_abstention_judged`` for ``abstention_rate``)."""
    return f"n_{rate.removesuffix('_rate')}_judged"


def rate_bars(metrics: pd.DataFrame, rate: str, low: str, high: str, title: str, ylabel: str) -> str | None:
    """One panel per target: a bar per retrieval x prompt with its interval; None if no rate is defined."""
    if metrics.empty or rate not in metrics.columns or not np.isfinite(metrics[rate].astype(float)).any():
        return None
    targets = ordered(metrics["target"].astype(str).tolist(), [])
    strategies = ordered(metrics["retrieval"].astype(str).tolist(), RETRIEVAL_ORDER)
    prompts = ordered(metrics["prompt"].astype(str).tolist(), PROMPT_ORDER)
    n = _count_column(rate) if _count_column(rate) in metrics.columns else "n"
    data = pd.DataFrame(
        {
            "target": metrics["target"].astype(str),
            "retrieval": metrics["retrieval"].astype(str),
            "prompt": metrics["prompt"].astype(str),
            "rate": metrics[rate].astype(float),
            "low": metrics[low].astype(float),
            "high": metrics[high].astype(float),
            "n": metrics[n],
        }
    )
    tooltip = [
        field("target"),
        field("retrieval"),
        field("prompt"),
        percent("rate", ylabel),
        percent("low", "95% low"),
        percent("high", "95% high"),
        count(),
    ]
    inner = {
        "width": {"step": 24 * len(prompts)},
        "height": 200,
        "encoding": {
            "x": field("retrieval", title=None, sort=strategies, axis={"labelAngle": -20}),
            "xOffset": field("prompt", sort=prompts),
            "tooltip": tooltip,
        },
        "layer": [
            {
                "mark": "bar",
                "encoding": {
                    "y": field("rate", "quantitative", ylabel, scale={"domain": [0, 1]}),
                    "color": field(
                        "prompt",
                        title="system prompt",
                        sort=prompts,
                        scale={"domain": prompts, "range": [_COLOURS[i % len(_COLOURS)] for i in range(len(prompts))]},
                    ),
                },
            },
            {
                "mark": {"type": "rule", "color": "#333"},
                "encoding": {"y": field("low", "quantitative"), "y2": {"field": "high"}},
            },
        ],
    }
    spec = charts.facetted(
        inner,
        "target",
        order=targets,
        columns=3,
        title=charts.titled(title, "whiskers: 95% bootstrap intervals; no bar: nothing to rate"),
    )
    return charts.chart(spec, charts.rows(data), f"{ylabel} per retrieval x prompt x target")


def outcome_shares(spec_rates: pd.DataFrame, spec: str, outcomes: Sequence[str]) -> str | None:
    """Stacked shares of one spec's outcomes per configuration; None if the spec judged nothing."""
    part = spec_rates[(spec_rates["spec"] == spec) & (spec_rates["n_judged"] > 0)]
    if part.empty:
        return None
    keys = ["target", "retrieval", "prompt"]
    configurations = part[keys].drop_duplicates().astype(str)
    configurations = configurations.assign(
        _r=configurations["retrieval"].map(lambda v: RETRIEVAL_ORDER.index(v) if v in RETRIEVAL_ORDER else 99)
    ).sort_values(["target", "_r", "prompt"])
    labels = [" · ".join(row) for row in configurations[keys].itertuples(index=False)]
    part = part[part["outcome"].isin(list(outcomes))]
    data: list[dict[str, Any]] = [
        {
            "configuration": " · ".join(str(v) for v in (t, r, p)),
            "outcome": str(o),
            "k": list(outcomes).index(o),
            "rate": rate,
            "n": n,
        }
        for t, r, p, o, rate, n in zip(
            part["target"], part["retrieval"], part["prompt"], part["outcome"], part["rate"], part["n_judged"]
        )
    ]
    spec_dict = {
        "title": charts.titled(f"Outcomes of the {spec} evaluation per target · retrieval · prompt"),
        "width": 460,
        "height": {"step": 18},
        "mark": "bar",
        "encoding": {
            "y": field("configuration", title=None, sort=labels),
            "x": field("rate", "quantitative", "share of judged responses", stack="zero", scale={"domain": [0, 1]}),
            "color": field(
                "outcome",
                sort=list(outcomes),
                scale={"domain": list(outcomes), "range": [_COLOURS[i % len(_COLOURS)] for i in range(len(outcomes))]},
            ),
            "order": field("k", "quantitative"),
            "tooltip": [field("configuration"), field("outcome"), percent("rate", "share"), count("n", "n judged")],
        },
    }
    return charts.chart(spec_dict, data, f"outcomes of {spec}")


def overlap_histogram(similarities: dict[str, Sequence[float]], thresholds: dict[str, Sequence[float]]) -> str | None:
    """Each kept question's highest similarity to another, per measure, with the audit thresholds marked."""
    measures = [m for m, values in similarities.items() if len(values)]
    if not measures:
        return None
    # Counted here into 20 bins of [0, 1]: the page holds 20 numbers per measure, not one per question.
    data: list[dict[str, Any]] = []
    for measure in measures:
        counts, edges = np.histogram(
            np.clip(np.asarray(similarities[measure], dtype=float), 0, 1), bins=20, range=(0, 1)
        )
        data += [
            {"measure": measure, "start": float(a), "end": float(b), "questions": int(c)}
            for a, b, c in zip(edges[:-1], edges[1:], counts)
        ]
        data += [{"measure": measure, "threshold": float(t)} for t in thresholds.get(measure, ())]
    x: dict[str, Any] = {"scale": {"domain": [0, 1]}}
    inner = {
        "width": 260,
        "height": 160,
        "layer": [
            {
                "transform": [{"filter": "isValid(datum.questions)"}],
                "mark": {"type": "bar", "color": "#56b4e9"},
                "encoding": {
                    "x": field("start", "quantitative", "highest cosine to another question", **x),
                    "x2": {"field": "end"},
                    "y": field("questions", "quantitative", "questions"),
                    "tooltip": [
                        field("measure"),
                        field("start", "quantitative", "from", format=".2f"),
                        field("end", "quantitative", "to", format=".2f"),
                        count("questions", "questions"),
                    ],
                },
            },
            {
                "transform": [{"filter": "isValid(datum.threshold)"}],
                "mark": {"type": "rule", "color": "#d55e00", "strokeDash": [4, 3]},
                "encoding": {
                    "x": field("threshold", "quantitative"),
                    "tooltip": [field("measure"), field("threshold", "quantitative", "audit threshold")],
                },
            },
        ],
    }
    spec = charts.facetted(
        inner,
        "measure",
        order=measures,
        columns=3,
        title=charts.titled("Nearest-neighbour similarity of the kept questions", "dashed: audit thresholds"),
    )
    return charts.chart(spec, data, "nearest-neighbour similarity of the kept questions")
