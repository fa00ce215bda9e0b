"""The KnowOrNot report's plots: rates per retrieval x prompt x target with 95% intervals.

Drawn like the RefusalBench report's (``core.plotting``: Agg canvas, base64 PNG, data
text made safe by ``plot_text``). The paper reports abstention and factuality per
target under each retrieval strategy (its Tables 5-6); here each target is a panel,
retrieval strategies run along the axis and each system prompt is a bar with its interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from refusalbench.tasks.core.plotting import ordered, plot_text, png_base64

RETRIEVAL_ORDER = ("direct", "long_context", "basic_rag", "hyde_rag")
PROMPT_ORDER = ("basic", "conservative", "opinion")
_COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")


def _panels(count: int, width: float, height: float) -> tuple[Figure, int, int]:
    columns = min(3, count)
    rows = math.ceil(count / columns)
    return Figure(figsize=(width * columns, height * rows)), rows, columns


def rate_bars(metrics: pd.DataFrame, rate: str, low: str, high: str, title: str, ylabel: str) -> str | None:
    """One panel per target: a bar per retrieval x prompt with its interval; None if no rate is defined."""
    if metrics.empty or rate not in metrics.columns or not np.isfinite(metrics[rate].astype(float)).any():
        return None
    targets = ordered(metrics["target"].astype(str).tolist(), [])
    strategies = ordered(metrics["retrieval"].astype(str).tolist(), RETRIEVAL_ORDER)
    prompts = ordered(metrics["prompt"].astype(str).tolist(), PROMPT_ORDER)
    fig, rows, columns = _panels(len(targets), max(4.5, 1.3 * len(strategies) + 1.5), 4.0)
    width = 0.8 / len(prompts)
    for index, target in enumerate(targets):
        ax = fig.add_subplot(rows, columns, index + 1)
        part = metrics[metrics["target"].astype(str) == target]
        for p, prompt in enumerate(prompts):
            cells = part[part["prompt"].astype(str) == prompt].set_index("retrieval").reindex(strategies)
            values = cells[rate].to_numpy(dtype=float)
            below = np.clip(values - cells[low].to_numpy(dtype=float), 0, None)
            above = np.clip(cells[high].to_numpy(dtype=float) - values, 0, None)
            positions = np.arange(len(strategies)) - 0.4 + width * (p + 0.5)
            defined = np.isfinite(values)
            ax.bar(
                positions[defined],
                values[defined],
                width=width * 0.95,
                color=_COLOURS[p % len(_COLOURS)],
                label=plot_text(prompt),
                yerr=[np.nan_to_num(below[defined]), np.nan_to_num(above[defined])],
                capsize=3,
                error_kw={"elinewidth": 1, "ecolor": "#333"},
            )
            tops = values + np.nan_to_num(above)
            for x, value, top in zip(positions[defined], values[defined], tops[defined]):
                ax.text(x, min(top + 0.02, 1.08), f"{100 * value:.0f}%", ha="center", va="bottom", fontsize=7)
            for x in positions[~defined]:
                ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90, color="#777")
        ax.set_xticks(range(len(strategies)), [plot_text(s) for s in strategies], rotation=20, ha="right")
        ax.set_ylim(0, 1.15)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.set_ylabel(ylabel)
        ax.set_title(plot_text(target), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        if index == 0:
            ax.legend(title="system prompt", fontsize=8, title_fontsize=8, loc="upper left")
    fig.suptitle(f"{title} (whiskers: 95% bootstrap intervals; n/a: nothing to rate)")
    fig.tight_layout()
    return png_base64(fig)


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
    labels = [" · ".join(plot_text(v) for v in row) for row in configurations[keys].itertuples(index=False)]
    fig = Figure(figsize=(8, 0.35 * len(labels) + 1.8))
    ax = fig.add_subplot()
    left = np.zeros(len(labels))
    for o, outcome in enumerate(outcomes):
        shares = []
        for row in configurations[keys].itertuples(index=False):
            match = part[
                (part["target"].astype(str) == row[0])
                & (part["retrieval"].astype(str) == row[1])
                & (part["prompt"].astype(str) == row[2])
                & (part["outcome"] == outcome)
            ]
            shares.append(float(match["rate"].iloc[0]) if len(match) else 0.0)
        values = np.nan_to_num(np.asarray(shares))
        ax.barh(range(len(labels)), values, left=left, color=_COLOURS[o % len(_COLOURS)], label=plot_text(outcome))
        left += values
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of judged responses")
    ax.set_title(f"Outcomes of the {plot_text(spec)} evaluation per target · retrieval · prompt")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return png_base64(fig)


def overlap_histogram(similarities: dict[str, Sequence[float]], thresholds: dict[str, Sequence[float]]) -> str | None:
    """Each kept question's highest similarity to another, per measure, with the audit thresholds marked."""
    measures = [m for m, values in similarities.items() if len(values)]
    if not measures:
        return None
    fig, rows, columns = _panels(len(measures), 4.5, 3.4)
    for index, measure in enumerate(measures):
        ax = fig.add_subplot(rows, columns, index + 1)
        ax.hist(np.clip(np.asarray(similarities[measure], dtype=float), 0, 1), bins=20, range=(0, 1), color="#56b4e9")
        for threshold in thresholds.get(measure, ()):
            ax.axvline(threshold, color="#d55e00", ls="--", lw=1)
        ax.set_xlabel(f"highest {plot_text(measure)} cosine to another question")
        ax.set_ylabel("questions")
        # The stubs type the locator as the base Locator; the default one is a MaxNLocator, which takes integer.
        ax.yaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]
    fig.suptitle("Nearest-neighbour similarity of the kept questions (dashed: audit thresholds)")
    fig.tight_layout()
    return png_base64(fig)
