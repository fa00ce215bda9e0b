"""The sufficient statistics every RefusalBench metric is computed from.

Every metric is a ratio of sums of per-row indicators (ECE too, see :mod:`.calibration`), or a
function of such ratios. So one vector of statistics per model (or per model x group, or per
bootstrap resample) is summed with ``np.bincount``: :data:`STATISTICS` over the scored rows,
:data:`OUTCOME_STATISTICS` over every row, then the confidence block (scope x bin x [count, sum
correct, sum confidence]). :mod:`.specs` declares metrics over these names and
:mod:`.metrics` turns any stack of vectors into metric values.

Rows without a usable response (``outcome`` not ok: truncated, blocked by the provider, too long,
empty, or a failed call or judgment) enter only the outcome statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from refusalbench.tasks.llm.reply_outcomes import FAILURES, OK
from refusalbench.tasks.refusalbench.scoring.calibration import N_BINS

COUNTS: tuple[str, ...] = ("n", "n_answerable", "n_unanswerable", "n_confidence", "n_unjudged")

Rows = Mapping[str, np.ndarray]  # the per-row indicators of :func:`row_arrays`


def _flag(rows: Rows, name: str) -> np.ndarray:
    """An optional per-row flag (the outcome flags; a bootstrap row type may leave them out)."""
    flag = rows.get(name)
    return np.zeros(len(rows["answerable"]), dtype=bool) if flag is None else flag


def _attempt(rows: Rows) -> np.ndarray:
    """Answer attempts on answerable items: what the judge scores."""
    return rows["answerable"] & ~rows["refused"]


# The sufficient statistics, in this order: name -> the per-row indicator summed into it.
# Then comes the confidence block [scope (0 answer attempts, 1 refusals)][bin][count, sum
# correct, sum confidence]. A ratio metric names its numerator and denominator in these.
STATISTICS: dict[str, Callable[[Rows], np.ndarray]] = {
    "n": lambda r: np.ones(len(r["answerable"]), dtype=bool),
    "n_answerable": lambda r: r["answerable"],
    "n_unanswerable": lambda r: ~r["answerable"],
    "answered_correctly": lambda r: r["answered_correctly"],
    "right_code": lambda r: r["right_code"],
    "refused": lambda r: r["refused"],
    "answerable_refused": lambda r: r["answerable"] & r["refused"],
    "unanswerable_refused": lambda r: ~r["answerable"] & r["refused"],
    "unanswerable_answered": lambda r: ~r["answerable"] & ~r["refused"],
    "n_unjudged": lambda r: r["unjudged"],
    # multi-document rows (GaRAGe): items, Σ RAF on answerable (refusals 0), right codes
    "multi_answerable": lambda r: r["multi"] & r["answerable"],
    "multi_unanswerable": lambda r: r["multi"] & ~r["answerable"],
    "multi_raf": lambda r: r["multi"] & r["answered_correctly"],
    "multi_right_code": lambda r: r["multi"] & r["right_code"],
    # the judge's 0/1 scores over judged answer attempts: how many judged, how many 1
    "eligibility_n": lambda r: _attempt(r) & r["eligibility_has"],
    "eligibility_1": lambda r: _attempt(r) & r["eligibility"],
    "factuality_n": lambda r: _attempt(r) & r["factuality_has"],
    "factuality_1": lambda r: _attempt(r) & r["factuality"],
    "raf_n": lambda r: _attempt(r) & r["raf_has"],
    "raf_1": lambda r: _attempt(r) & r["raf"],
}
# What became of every row, scored or not (``outcome``, ``tasks/llm/reply_outcomes.py``): summed over
# all rows, where the statistics above count only the scored ones.
OUTCOME_STATISTICS: dict[str, Callable[[Rows], np.ndarray]] = {
    "n_rows": lambda r: np.ones(len(r["answerable"]), dtype=bool),
    "truncated": lambda r: _flag(r, "truncated"),
    "provider_blocked": lambda r: _flag(r, "provider_blocked"),
    "too_long": lambda r: _flag(r, "too_long"),
    "empty": lambda r: _flag(r, "empty"),
    "failed": lambda r: _flag(r, "failed"),
}
# The per-row outcome flags the statistics above read (besides ``scored``).
OUTCOME_FLAGS: tuple[str, ...] = ("truncated", "provider_blocked", "too_long", "empty", "failed")
# Every statistic a metric may name: the scored rows' first, then the outcomes'.
ALL_STATISTICS: dict[str, Callable[[Rows], np.ndarray]] = {**STATISTICS, **OUTCOME_STATISTICS}
STAT_INDEX: dict[str, int] = {name: i for i, name in enumerate(ALL_STATISTICS)}
N_BASE = len(ALL_STATISTICS)
N_STATS = N_BASE + 2 * N_BINS * 3


def _score_flags(df: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(judged, score is 1) of an optional 0/1 judge column (NaN = not judged)."""
    if column not in df:
        return np.zeros(len(df), dtype=bool), np.zeros(len(df), dtype=bool)
    values = df[column].to_numpy(dtype=np.float64)
    return ~np.isnan(values), values == 1


def row_arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The per-row indicators of a prepared frame that the statistics are summed from."""
    eligibility_has, eligibility = _score_flags(df, "eligibility")
    factuality_has, factuality = _score_flags(df, "factuality")
    raf_has, raf = _score_flags(df, "raf")
    return {
        **outcome_flags(df),
        "multi": df["multi"].to_numpy(dtype=bool) if "multi" in df else np.zeros(len(df), dtype=bool),
        "eligibility_has": eligibility_has,
        "eligibility": eligibility,
        "factuality_has": factuality_has,
        "factuality": factuality,
        "raf_has": raf_has,
        "raf": raf,
        "answerable": df["answerable"].to_numpy(dtype=bool),
        "refused": df["refused"].to_numpy(dtype=bool),
        "answered_correctly": df["answered_correctly"].to_numpy(dtype=bool),
        "right_code": df["right_code"].to_numpy(dtype=bool),
        "correct": df["correct"].to_numpy(dtype=bool),
        "unjudged": df["answer_unjudged"].to_numpy(dtype=bool)
        if "answer_unjudged" in df
        else np.zeros(len(df), dtype=bool),
        "conf_value": df["confidence_value"].to_numpy(dtype=np.float64),
        "conf_bin": df["confidence_bin"].to_numpy(dtype=np.int64),
    }


def outcome_flags(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per row: ``scored`` and one flag per outcome statistic (a frame without ``outcome``: all scored)."""
    n = len(df)
    if "outcome" not in df:
        return {"scored": np.ones(n, dtype=bool), **{name: np.zeros(n, dtype=bool) for name in OUTCOME_FLAGS}}
    outcome = df["outcome"].astype(object).to_numpy()
    flags = {name: outcome == name for name in ("truncated", "provider_blocked", "too_long", "empty")}
    flags["failed"] = np.isin(outcome, FAILURES)
    scored = df["scored"].to_numpy(dtype=bool) if "scored" in df else outcome == OK
    return {"scored": scored, **flags}


def sufficient_stats(
    groups: np.ndarray, n_groups: int, rows: Mapping[str, np.ndarray], weights: np.ndarray | None = None
) -> np.ndarray:
    """(n_groups × N_STATS) sums of the row indicators per group.

    ``weights`` (one per row) lets the same code build per-type statistics.
    """
    w = np.ones(len(groups)) if weights is None else weights

    def total(mask: np.ndarray) -> np.ndarray:
        if not mask.any():  # the multi-document sums are all zero on single-document runs
            return np.zeros(n_groups)
        return np.bincount(groups, weights=w * mask, minlength=n_groups)

    # The statistics of scored rows see only those; the outcome statistics see every row.
    scored = rows.get("scored")
    scored = np.ones(len(groups), dtype=bool) if scored is None else scored
    stats = np.zeros((n_groups, N_STATS))
    if n_groups:
        stats[:, :N_BASE] = np.stack(
            [total(indicator(rows) & scored) for indicator in STATISTICS.values()]
            + [total(indicator(rows)) for indicator in OUTCOME_STATISTICS.values()],
            axis=1,
        )
    refused = rows["refused"]
    has = (rows["conf_bin"] >= 0) & scored
    if has.any():
        cell = refused[has].astype(np.int64) * N_BINS + rows["conf_bin"][has]
        key = groups[has] * (2 * N_BINS) + cell
        size = n_groups * 2 * N_BINS
        wh = w[has]
        block = np.stack(
            [
                np.bincount(key, weights=wh, minlength=size),
                np.bincount(key, weights=wh * rows["correct"][has], minlength=size),
                np.bincount(key, weights=wh * rows["conf_value"][has], minlength=size),
            ],
            axis=1,
        )  # (size × 3), row = group*30 + scope*15 + bin
        stats[:, N_BASE:] = block.reshape(n_groups, 2 * N_BINS * 3)
    return stats


def confidence_block(stats: np.ndarray) -> np.ndarray:
    """The confidence part of (..., N_STATS) statistics as (..., scope, bin, [count, correct, conf])."""
    return stats[..., N_BASE:].reshape(*stats.shape[:-1], 2, N_BINS, 3)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def stat_sum(stats: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    total = stats[..., STAT_INDEX[names[0]]]  # no 0 + first: the same sums without a copy (counts are >= 0)
    for name in names[1:]:
        total = total + stats[..., STAT_INDEX[name]]
    return total
