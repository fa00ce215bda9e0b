"""Whole-run summaries beside the per-model metrics (paper App. F.5, F.8, F.9).

- :func:`response_distribution`: every row in exactly one of seven outcomes: the paper's six
  (Fig. 26: correct answer, wrong answer, correct refusal, wrong-category refusal, false
  refusal, missed refusal) and "no usable response" (truncated, blocked by the provider, too
  long, empty, or a failed call or judgment: left out of the six); with counts, fractions
  (summing to 1 per model) and Wilson intervals.
- :func:`outcome_counts_by_model`: how many rows came to each outcome (``tasks/llm/reply_outcomes.py``).
- :func:`frr_mrr_correlation`: Pearson and Spearman correlation of the false and the missed
  refusal rate across models (§4.2: "r = -0.78 on NQ").
- :func:`multi_document_counts`: the denominators of the multi-document metrics.

Decisions the contract leaves open:
- An answer attempt on an answerable item that the judge did not score is a wrong answer,
  as it is not correct for ``answer_accuracy`` either.
- The correlation uses the models whose two rates are both defined; it is NaN with fewer
  than three such models or when either rate is constant across them (no variation to
  correlate). Spearman ranks ties by their mean rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import wilson_interval
from refusalbench.tasks.llm.reply_outcomes import (
    CALL_ERROR,
    EMPTY,
    JUDGE_ERROR,
    OK,
    PARSE_ERROR,
    PROVIDER_BLOCKED,
    ROW_OUTCOMES,
    TOO_LONG,
    TRUNCATED,
)
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.metrics import model_stats
from refusalbench.tasks.refusalbench.scoring.row_statistics import STAT_INDEX

# outcome -> (stats added, stats subtracted): its count from the sufficient statistics.
OUTCOMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "correct_answer": (("answered_correctly",), ()),
    "wrong_answer": (("n_answerable",), ("answerable_refused", "answered_correctly")),
    "correct_refusal": (("right_code",), ()),
    "wrong_category_refusal": (("unanswerable_refused",), ("right_code",)),
    "false_refusal": (("answerable_refused",), ()),
    "missed_refusal": (("unanswerable_answered",), ()),
    # The seventh column: rows without a usable response, so the fractions cover every row.
    "no_usable_response": (("n_rows",), ("n",)),
}
# How the scoring treats each row outcome: the judged table's ``treatment`` and metrics.json's ``outcomes``.
OUTCOME_TREATMENT: dict[str, str] = {
    OK: "scored",
    TRUNCATED: "excluded from accuracy; counted in non_response_rate and truncated_rate",
    PROVIDER_BLOCKED: "excluded from accuracy; counted in non_response_rate and blocked_rate",
    TOO_LONG: "excluded from accuracy (not sent); counted in non_response_rate and too_long_rate",
    EMPTY: "excluded from accuracy; counted in non_response_rate",
    CALL_ERROR: "excluded from accuracy; counted in failed_rate",
    PARSE_ERROR: "excluded from accuracy; counted in failed_rate",
    JUDGE_ERROR: "excluded from accuracy; counted in failed_rate",
}
DISTRIBUTION_COLUMNS: tuple[str, ...] = ("model", "outcome", "count", "fraction", "ci_low", "ci_high", "n")
CORRELATED: tuple[str, str] = ("false_refusal_rate", "missed_refusal_rate")
MIN_MODELS_FOR_CORRELATION = 3


def outcome_counts(stats: np.ndarray) -> dict[str, np.ndarray]:
    """{outcome: count} from (..., _N_STATS) sufficient statistics; the seven add up to ``n_rows``."""

    def column(name: str) -> np.ndarray:
        return stats[..., STAT_INDEX[name]]

    return {
        outcome: sum((column(a) for a in added), np.zeros(stats.shape[:-1]))
        - sum((column(s) for s in subtracted), np.zeros(stats.shape[:-1]))
        for outcome, (added, subtracted) in OUTCOMES.items()
    }


def response_distribution(
    df: pd.DataFrame, level: float = 0.95, per_model: tuple[list[str], np.ndarray] | None = None
) -> pd.DataFrame:
    """One row per model × outcome: count, fraction of the model's rows, Wilson interval, n (all its rows).

    ``per_model``: the :func:`~.metrics.model_stats` of ``df`` when the caller has them already.
    """
    models, stats = per_model if per_model is not None else model_stats(ensure_prepared(df))
    if not models:
        return pd.DataFrame({c: [] for c in DISTRIBUTION_COLUMNS})
    n = stats[:, STAT_INDEX["n_rows"]]
    frames = []
    for outcome, count in outcome_counts(stats).items():
        low, high = wilson_interval(count, n, level)
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = np.where(n > 0, count / np.where(n > 0, n, 1), np.nan)
        frames.append(
            pd.DataFrame(
                {
                    "model": models,
                    "outcome": outcome,
                    "count": count.astype(np.int64),
                    "fraction": fraction,
                    "ci_low": low,
                    "ci_high": high,
                    "n": n.astype(np.int64),
                }
            )
        )
    return pd.concat(frames, ignore_index=True).sort_values(["model"], kind="stable").reset_index(drop=True)


def distribution_by_model(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{model: {outcome: fraction}} from a :func:`response_distribution` table (outcomes in order)."""
    out: dict[str, dict[str, float]] = {}
    for row in table.itertuples(index=False):
        out.setdefault(str(row.model), {})[str(row.outcome)] = float(row.fraction)
    return out


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks: np.ndarray = pd.Series(values).rank(method="average").to_numpy()
    return ranks


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    dx, dy = x - x.mean(), y - y.mean()
    scale = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / scale if scale > 0 else math.nan


def correlation(metrics: Mapping[str, Mapping[str, Any]], x: str, y: str) -> dict[str, Any]:
    """Pearson and Spearman correlation of metrics ``x`` and ``y`` across models, with n and the models."""
    pairs = [(model, values.get(x), values.get(y)) for model, values in sorted(metrics.items())]
    pairs = [
        (m, float(a), float(b))
        for m, a, b in pairs
        if a is not None and b is not None and not math.isnan(a) and not math.isnan(b)
    ]
    result: dict[str, Any] = {
        "x": x,
        "y": y,
        "pearson": math.nan,
        "spearman": math.nan,
        "n": len(pairs),
        "models": [m for m, _, _ in pairs],
    }
    xs = np.array([a for _, a, _ in pairs])
    ys = np.array([b for _, _, b in pairs])
    # A constant side has no variation to correlate (its mean-centred values are only rounding).
    if len(pairs) >= MIN_MODELS_FOR_CORRELATION and np.ptp(xs) > 0 and np.ptp(ys) > 0:
        result["pearson"] = _pearson(xs, ys)
        result["spearman"] = _pearson(_ranks(xs), _ranks(ys))
    return result


def frr_mrr_correlation(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The false- vs missed-refusal-rate correlation across models (NaN with fewer than 3)."""
    return correlation(metrics, *CORRELATED)


def multi_document_counts(
    df: pd.DataFrame, per_model: tuple[list[str], np.ndarray] | None = None
) -> dict[str, dict[str, int]]:
    """Per model with multi-document rows: items, answerable items and judged answer attempts."""
    models, stats = per_model if per_model is not None else model_stats(ensure_prepared(df))

    def count(i: int, name: str) -> int:
        return int(stats[i, STAT_INDEX[name]])

    out = {}
    for i, model in enumerate(models):
        items = count(i, "multi_answerable") + count(i, "multi_unanswerable")
        if items:
            out[model] = {
                "n_items": items,
                "n_answerable": count(i, "multi_answerable"),
                "n_answer_attempts_judged": count(i, "raf_n"),
                "n_eligibility": count(i, "eligibility_n"),
                "n_factuality": count(i, "factuality_n"),
            }
    return out


def outcome_counts_by_model(df: pd.DataFrame) -> dict[str, dict[str, int]]:
    """{model: {outcome: rows}} over every outcome of ``tasks/llm/reply_outcomes.py`` (zeros included),
    from a prepared frame (one without outcomes: all ``ok``)."""
    df = ensure_prepared(df)
    table = pd.crosstab(df["model"], df["outcome"], dropna=False)
    return {
        str(model): {
            outcome: int(table.at[model, outcome]) if outcome in table.columns else 0 for outcome in ROW_OUTCOMES
        }
        for model in table.index
    }
