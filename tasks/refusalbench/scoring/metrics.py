"""The per-model metrics of DESIGN.md §6 (the paper's Appendix D): declared once, computed from sufficient statistics.

Each metric is one :class:`MetricSpec` in :data:`METRIC_SPECS` (the declarations are below,
in metrics.json's order): its name, its labels, how it is computed and how it is shown.
Everything else is derived from the declarations: the scoring arrays and the bootstrap and
breakdown intervals (:mod:`.bootstrap`, :mod:`.intervals`), the leaderboard's columns
(``report.leaderboard``), the model-comparison figures (``report.comparison_figures``) and
the inspect task's metrics (``integrations.inspect``). Adding a ratio metric is one
declaration::

    declare(MetricSpec("unjudged_rate", label="Unjudged", numerator=("n_unjudged",),
                       denominator=("n_answerable",), higher_is_better=False))

How it stays fast at a million rows: every metric is a ratio of sums of per-row indicators
(ECE too, see :mod:`.calibration`), or a function of such ratios. So one vector of
*sufficient statistics* (:data:`STATISTICS`) per model (or per model × group, or per
bootstrap resample) is computed with ``np.bincount``, and :func:`metrics_from_stats` turns
any stack of such vectors into metrics.

A *ratio* metric is a count over a count, which lets the breakdowns give it Wilson
intervals; the rest are a *formula* of metrics declared before them (F1, the hierarchical
score, CRS) or of the statistics themselves (ECE).

Undefined ratios are NaN, never 0. ``detection_f1`` is NaN when precision or recall is NaN
and 0 when both are defined and 0; ``hierarchical_score`` and ``calibrated_refusal_score``
are NaN when either factor is.

Multi-document (GaRAGe) metrics, Appendix D: ``answer_quality_score`` = mean RAF over the
answerable multi-document items, a refusal or an unjudged answer scoring 0;
``hybrid_score`` = (Σ RAF over answerable + right codes over unanswerable) / all
multi-document items, i.e. RAF and refusal accuracy weighted by their shares of the items;
``eligibility_rate``, ``factuality_rate``, ``raf_rate`` = the judge's scores over the answer
attempts it judged (App. F.9). All five are NaN for single-document rows.

Rows without a usable response (``outcome`` not ok: truncated, blocked by the provider, too
long, empty, or a failed call or judgment) enter none of the metrics above: their statistics
count scored rows only. The *coverage* metrics (declared ``coverage=True``: ``coverage``,
``non_response_rate``, ``truncated_rate``, ``blocked_rate``, ``too_long_rate``, ``failed_rate``)
are ratios over every row (:data:`OUTCOME_STATISTICS`); they are in metrics.json beside the
others, without intervals or breakdown rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.llm.reply_outcomes import FAILURES, OK
from refusalbench.tasks.refusalbench.scoring.calibration import N_BINS, ece
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared

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
_N_BASE = len(ALL_STATISTICS)
_N_STATS = _N_BASE + 2 * N_BINS * 3


# ----------------------------------------------------------------- the declaration


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric of metrics.json, declared once: how it is computed and how it is shown.

    A ratio gives ``numerator`` and ``denominator`` (statistics of :data:`STATISTICS`, each
    side summed); anything else gives a ``formula`` of the metrics named in ``of`` (declared
    before it), or of the statistics array itself when ``of`` is empty.
    """

    name: str
    label: str  # the leaderboard's column header: short
    title: str = ""  # in words, for figure titles and tables (default: the label)
    numerator: tuple[str, ...] = ()
    denominator: tuple[str, ...] = ()
    formula: Callable[..., np.ndarray] | None = None
    of: tuple[str, ...] = ()
    higher_is_better: bool | None = True  # None: neither (a rate that describes behaviour)
    leaderboard: bool = False  # a column of the leaderboard
    compared: bool = False  # drawn in the model-comparison figures (scaling, SFT vs DPO, thinking budget)
    inspect_task: bool = False  # one of the inspect task's metrics
    multi_document: bool = False  # GaRAGe's: scored only on runs with multi-document rows (NaN elsewhere)
    # Describes which rows could be scored (coverage, non-response rates), not the behaviour scored:
    # in metrics.json beside the others, without bootstrap intervals or breakdown rows.
    coverage: bool = False
    percent: bool = True  # shown as a percentage; else as a number with three decimals (ECE)
    # Read from stated confidences: computed from the calibration pass's rows when a run has one
    # (``scoring.calibration``), from the scored rows' own confidences otherwise.
    calibration: bool = False

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.label)
        if self.formula is None and not (self.numerator and self.denominator):
            raise ValueError(f"metric {self.name!r}: give a numerator and a denominator, or a formula")
        if self.formula is not None and (self.numerator or self.denominator):
            raise ValueError(f"metric {self.name!r}: a ratio or a formula, not both")
        if self.of and self.formula is None:
            raise ValueError(f"metric {self.name!r}: 'of' names the inputs of a formula")
        unknown = [s for s in self.numerator + self.denominator if s not in ALL_STATISTICS]
        if unknown:
            raise ValueError(f"metric {self.name!r}: unknown statistic {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(ALL_STATISTICS)})")

    @property
    def is_ratio(self) -> bool:
        """A count over a count (its breakdown intervals are Wilson's)."""
        return self.formula is None

    def values(self, stats: np.ndarray, earlier: Mapping[str, np.ndarray]) -> np.ndarray:
        """The metric from (..., _N_STATS) statistics; ``earlier``: the metrics declared before it."""
        if self.formula is None:
            return _ratio(_sum(stats, self.numerator), _sum(stats, self.denominator))
        if not self.of:
            return self.formula(stats)
        return self.formula(*(earlier[name] for name in self.of))


METRIC_SPECS: Registry[MetricSpec] = Registry("metric")

F = TypeVar("F", bound=Callable[..., np.ndarray])


def declare(spec: MetricSpec, *, replace: bool = False) -> MetricSpec:
    """Register ``spec`` under its name; a formula's inputs must be declared before it."""
    declared = list(METRIC_SPECS)
    before = declared[:declared.index(spec.name)] if spec.name in declared else declared
    missing = [name for name in spec.of if name not in before]
    if missing:
        raise ValueError(f"metric {spec.name!r} is a function of {', '.join(map(repr, missing))}, "
                         "which must be declared before it")
    return METRIC_SPECS.add(spec.name, spec, replace=replace)


def formula_metric(name: str, *, replace: bool = False, **fields: Any) -> Callable[[F], F]:
    """Decorator: declare the decorated function as the formula of metric ``name``.

    ``fields`` are the other :class:`MetricSpec` fields (``label``, ``of``, ...).
    """
    def decorate(formula: F) -> F:
        declare(MetricSpec(name, formula=formula, **fields), replace=replace)
        return formula

    return decorate


def metric_spec(name: str) -> MetricSpec:
    """The declaration of metric ``name`` (ValueError listing the declared ones if none)."""
    return METRIC_SPECS.lookup(name)


def single_document_metrics() -> tuple[str, ...]:
    """The metrics every run is scored on (§6's), in declaration order."""
    return tuple(name for name, spec in METRIC_SPECS.items() if not spec.multi_document and not spec.coverage)


def coverage_metrics() -> tuple[str, ...]:
    """The rates of what became of the rows (scored share, truncated, blocked, ...), in declaration order."""
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.coverage)


def multi_document_metrics() -> tuple[str, ...]:
    """GaRAGe's metrics (App. D, F.9): they need a multi-document judge, NaN on single-document rows."""
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.multi_document)


def calibration_metrics() -> tuple[str, ...]:
    """The metrics of stated confidences (ECE): a run's calibration pass feeds them when it has one."""
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.calibration)


def all_metrics() -> tuple[str, ...]:
    """Every declared metric, in metrics.json's order: the single-document ones, then GaRAGe's."""
    return single_document_metrics() + multi_document_metrics()


# ----------------------------------------------------------------- the metrics (DESIGN.md §6)

declare(MetricSpec("answer_accuracy", label="Answer acc.", title="Answer accuracy",
                   numerator=("answered_correctly",), denominator=("n_answerable",),
                   leaderboard=True, compared=True))
declare(MetricSpec("refusal_accuracy", label="Refusal acc.", title="Refusal accuracy",
                   numerator=("right_code",), denominator=("n_unanswerable",), leaderboard=True, compared=True))
declare(MetricSpec("false_refusal_rate", label="FRR", title="False refusal rate",
                   numerator=("answerable_refused",), denominator=("n_answerable",),
                   higher_is_better=False, leaderboard=True, inspect_task=True))
declare(MetricSpec("missed_refusal_rate", label="MRR", title="Missed refusal rate",
                   numerator=("unanswerable_answered",), denominator=("n_unanswerable",),
                   higher_is_better=False, leaderboard=True, inspect_task=True))
declare(MetricSpec("refusal_rate", label="Refusal rate", numerator=("refused",), denominator=("n",),
                   higher_is_better=None, inspect_task=True))
declare(MetricSpec("correct_refusal_rate", label="Correct refusal rate",
                   numerator=("unanswerable_refused",), denominator=("n_unanswerable",)))
declare(MetricSpec("detection_precision", label="Detection precision",
                   numerator=("unanswerable_refused",), denominator=("refused",)))
declare(MetricSpec("detection_recall", label="Detection recall",
                   numerator=("unanswerable_refused",), denominator=("n_unanswerable",)))


@formula_metric("detection_f1", label="Detection F1", of=("detection_precision", "detection_recall"),
                leaderboard=True)
def detection_f1(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    """Harmonic mean of detection precision and recall: 0 when both are 0, NaN when either is."""
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return np.where(np.isnan(precision) | np.isnan(recall), np.nan, f1)


declare(MetricSpec("category_accuracy", label="Category acc.", title="Category accuracy",
                   numerator=("right_code",), denominator=("unanswerable_refused",), leaderboard=True))
declare(MetricSpec("hierarchical_score", label="Hierarchical", title="Hierarchical score",
                   formula=lambda f1, category: f1 * category, of=("detection_f1", "category_accuracy"),
                   leaderboard=True))
declare(MetricSpec("calibrated_refusal_score", label="CRS", title="Calibrated refusal score",
                   formula=lambda answer, refusal: (answer + refusal) / 2, of=("answer_accuracy", "refusal_accuracy"),
                   leaderboard=True, compared=True))
def _stated_ece(stats: np.ndarray, scope: int | None = None) -> np.ndarray:
    """ECE of (..., _N_STATS) statistics over both scopes (None), answer attempts (0) or refusals (1)."""
    block = confidence_block(stats)
    if not block[..., 0].any():  # no stated confidence in any stack (a run without them): NaN, no arithmetic
        return np.full(stats.shape[:-1], np.nan)
    return ece(block.sum(axis=-3) if scope is None else block[..., scope, :, :])


declare(MetricSpec("ece", label="ECE", title="Expected calibration error",
                   formula=_stated_ece,
                   higher_is_better=False, leaderboard=True, percent=False, calibration=True))
declare(MetricSpec("ece_answer", label="ECE (answers)", title="ECE over answer attempts",
                   formula=lambda stats: _stated_ece(stats, 0),
                   higher_is_better=False, percent=False, calibration=True))
declare(MetricSpec("ece_refusal", label="ECE (refusals)", title="ECE over refusals",
                   formula=lambda stats: _stated_ece(stats, 1),
                   higher_is_better=False, percent=False, calibration=True))

# ----------------------------------------------------------------- outcomes (issue 24)
# What became of all the rows, scored or not: a row without a usable response (truncated,
# blocked by the provider, too long for the model, empty) is left out of every metric above and
# counted in non_response_rate; a failed call or judgment in failed_rate. Coverage is the
# scored share, which the leaderboard compares with evaluation.min_coverage.

declare(MetricSpec("coverage", label="Coverage", title="Scored share of rows", numerator=("n",),
                   denominator=("n_rows",), coverage=True))
declare(MetricSpec("non_response_rate", label="No response", title="Non-response rate",
                   numerator=("truncated", "provider_blocked", "too_long", "empty"), denominator=("n_rows",),
                   higher_is_better=False, coverage=True))
declare(MetricSpec("truncated_rate", label="Truncated", title="Truncated rate", numerator=("truncated",),
                   denominator=("n_rows",), higher_is_better=False, coverage=True))
declare(MetricSpec("blocked_rate", label="Blocked", title="Provider-blocked rate", numerator=("provider_blocked",),
                   denominator=("n_rows",), higher_is_better=False, coverage=True))
declare(MetricSpec("too_long_rate", label="Too long", title="Too-long rate", numerator=("too_long",),
                   denominator=("n_rows",), higher_is_better=False, coverage=True))
declare(MetricSpec("failed_rate", label="Failed", title="Failed rate (call or judge)", numerator=("failed",),
                   denominator=("n_rows",), higher_is_better=False, coverage=True))

declare(MetricSpec("answer_quality_score", label="Answer quality", title="Answer quality (mean RAF)",
                   numerator=("multi_raf",), denominator=("multi_answerable",),
                   leaderboard=True, multi_document=True))
declare(MetricSpec("hybrid_score", label="Hybrid", title="Hybrid score",
                   numerator=("multi_raf", "multi_right_code"), denominator=("multi_answerable", "multi_unanswerable"),
                   leaderboard=True, multi_document=True))
declare(MetricSpec("eligibility_rate", label="Eligibility", numerator=("eligibility_1",),
                   denominator=("eligibility_n",), multi_document=True))
declare(MetricSpec("factuality_rate", label="Factuality", numerator=("factuality_1",),
                   denominator=("factuality_n",), multi_document=True))
declare(MetricSpec("raf_rate", label="RAF (answers)", numerator=("raf_1",), denominator=("raf_n",),
                   multi_document=True))


# ----------------------------------------------------------------- computing them


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
        "eligibility_has": eligibility_has, "eligibility": eligibility,
        "factuality_has": factuality_has, "factuality": factuality,
        "raf_has": raf_has, "raf": raf,
        "answerable": df["answerable"].to_numpy(dtype=bool),
        "refused": df["refused"].to_numpy(dtype=bool),
        "answered_correctly": df["answered_correctly"].to_numpy(dtype=bool),
        "right_code": df["right_code"].to_numpy(dtype=bool),
        "correct": df["correct"].to_numpy(dtype=bool),
        "unjudged": df["answer_unjudged"].to_numpy(dtype=bool) if "answer_unjudged" in df
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


def sufficient_stats(groups: np.ndarray, n_groups: int, rows: Mapping[str, np.ndarray],
                     weights: np.ndarray | None = None) -> np.ndarray:
    """(n_groups × _N_STATS) sums of the row indicators per group.

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
    stats = np.zeros((n_groups, _N_STATS))
    if n_groups:
        stats[:, :_N_BASE] = np.stack([total(indicator(rows) & scored) for indicator in STATISTICS.values()]
                                      + [total(indicator(rows)) for indicator in OUTCOME_STATISTICS.values()], axis=1)
    refused = rows["refused"]
    has = (rows["conf_bin"] >= 0) & scored
    if has.any():
        cell = (refused[has].astype(np.int64) * N_BINS + rows["conf_bin"][has])
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
        stats[:, _N_BASE:] = block.reshape(n_groups, 2 * N_BINS * 3)
    return stats


def confidence_block(stats: np.ndarray) -> np.ndarray:
    """The confidence part of (..., _N_STATS) statistics as (..., scope, bin, [count, correct, conf])."""
    return stats[..., _N_BASE:].reshape(*stats.shape[:-1], 2, N_BINS, 3)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _sum(stats: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    total = stats[..., STAT_INDEX[names[0]]]  # no 0 + first: the same sums without a copy (counts are >= 0)
    for name in names[1:]:
        total = total + stats[..., STAT_INDEX[name]]
    return total


def proportion_parts(stats: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) of a ratio metric from (..., _N_STATS) statistics."""
    spec = metric_spec(metric)
    return _sum(stats, spec.numerator), _sum(stats, spec.denominator)


def metrics_from_stats(stats: np.ndarray, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Every declared metric (:func:`all_metrics`, then :func:`coverage_metrics`) from a stack
    (..., _N_STATS) of sufficient statistics; with ``names``, only those (and what they are made of):
    the bootstrap asks for the few it summarises, on stacks of a million resampled rows."""
    wanted = all_metrics() + coverage_metrics() if names is None else tuple(names)
    needed = set(wanted)
    for name in reversed(list(METRIC_SPECS)):  # a formula's inputs are declared before it
        if name in needed:
            needed.update(METRIC_SPECS[name].of)
    values: dict[str, np.ndarray] = {}
    for name, spec in METRIC_SPECS.items():  # declaration order: a formula's inputs come before it
        if name in needed:
            values[name] = spec.values(stats, values)
    return {name: values[name] for name in wanted}


def _counts_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "n": stats[..., STAT_INDEX["n"]],
        "n_answerable": stats[..., STAT_INDEX["n_answerable"]],
        "n_unanswerable": stats[..., STAT_INDEX["n_unanswerable"]],
        "n_confidence": confidence_block(stats)[..., 0].sum(axis=(-1, -2)),
        "n_unjudged": stats[..., STAT_INDEX["n_unjudged"]],
    }


def model_codes(df: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """(row -> model index, model names sorted): the grouping key of every per-model result."""
    codes, models = pd.factorize(df["model"], sort=True)
    return codes.astype(np.int64), [str(m) for m in models]


def run_metrics(df: pd.DataFrame) -> tuple[str, ...]:
    """The metrics a prepared frame is scored on: §6's, plus GaRAGe's when it has multi-document rows."""
    has_multi = "multi" in df and bool(df["multi"].to_numpy(dtype=bool).any())
    return all_metrics() if has_multi else single_document_metrics()


def model_stats(df: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """(models sorted, their sufficient statistics (models × _N_STATS)) of a prepared frame."""
    codes, models = model_codes(df)
    return models, sufficient_stats(codes, len(models), row_arrays(df))


def compute_metrics(df: pd.DataFrame, names: Sequence[str] | None = None,
                    per_model: tuple[list[str], np.ndarray] | None = None) -> dict[str, dict[str, float]]:
    """{model: {metric: value}} (NaN where undefined) plus counts.

    ``names`` defaults to :func:`run_metrics`; ask for :func:`all_metrics` to have the
    multi-document metrics (NaN) on a single-document run too. ``per_model``: the
    :func:`model_stats` of ``df`` when the caller has them already.
    """
    df = ensure_prepared(df)
    names = tuple(names) if names is not None else run_metrics(df)
    models, stats = per_model if per_model is not None else model_stats(df)
    values = metrics_from_stats(stats)
    counts = _counts_from_stats(stats)
    result: dict[str, dict[str, float]] = {}
    for i, model in enumerate(models):
        row: dict[str, Any] = {name: float(values[name][i]) for name in names}
        row.update({name: int(counts[name][i]) for name in COUNTS})
        result[model] = row
    return result
