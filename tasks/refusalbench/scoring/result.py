"""The whole score of a run: :class:`ScoreResult` and :func:`score_frame`, which builds it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.config_sections import EvaluationConfig
from refusalbench.tasks.refusalbench.scoring.bootstrap import CLUSTER, IID, Errors, Intervals, bootstrap_figures
from refusalbench.tasks.refusalbench.scoring.breakdowns import (
    breakdown,
    calibration_table,
    class_intensity_grid,
    confusion,
    domain_champions,
    empty_breakdown,
    overall_rows,
    refusal_rate_by_intensity,
)
from refusalbench.tasks.refusalbench.scoring.calibration import (
    FROM_CALIBRATION_PASS,
    FROM_RESPONSES,
    max_confidence_summary,
)
from refusalbench.tasks.refusalbench.scoring.inputs import BREAKDOWN_DIMENSIONS, ensure_prepared
from refusalbench.tasks.refusalbench.scoring.metrics import compute_metrics, model_stats, run_metrics
from refusalbench.tasks.refusalbench.scoring.pairwise import pairwise_comparisons
from refusalbench.tasks.refusalbench.scoring.row_statistics import COUNTS
from refusalbench.tasks.refusalbench.scoring.specs import all_metrics, calibration_metrics, coverage_metrics
from refusalbench.tasks.refusalbench.scoring.summary import (
    frr_mrr_correlation,
    multi_document_counts,
    outcome_counts_by_model,
    response_distribution,
)

# The scored share of rows below which a model is incomplete: evaluation.min_coverage's default.
DEFAULT_MIN_COVERAGE: float = EvaluationConfig.model_fields["min_coverage"].default


@dataclasses.dataclass
class ScoreResult:
    """Everything ``score`` produces; :func:`render_score_outputs` turns it into files."""

    metrics: dict[str, dict[str, float]]
    intervals: dict[str, dict[str, tuple[float, float]]]
    breakdown: pd.DataFrame
    confusion: pd.DataFrame
    calibration: pd.DataFrame
    class_intensity: pd.DataFrame
    refusal_by_intensity: pd.DataFrame
    champions: pd.DataFrame
    n_resamples: int
    seed: int
    generated_at: str
    standard_errors: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    response_distribution: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    frr_mrr_correlation: dict[str, Any] = dataclasses.field(default_factory=dict)
    multi_document: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # Per model, how many rows came to each outcome (ok, truncated, provider_blocked, ...).
    outcomes: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # A model whose scored share of rows (``coverage``) is below this is incomplete.
    min_coverage: float = DEFAULT_MIN_COVERAGE
    # ``intervals`` and ``standard_errors`` resample base items (clusters); these resample each
    # model's rows as if independent, kept beside them so the difference shows.
    intervals_iid: dict[str, dict[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)
    standard_errors_iid: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # Every pair of models on the same items: paired differences, intervals, Holm-corrected p-values
    # (``scoring.pairwise``); empty without resamples.
    pairwise: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Where ECE and the reliability table came from: the run's calibration pass, or the scored
    # rows' own confidences (``scoring.calibration``); per model, the share of confidences at
    # maximum and their accuracy.
    calibration_source: str = FROM_RESPONSES
    max_confidence: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        return {m: {c: int(v[c]) for c in COUNTS} for m, v in self.metrics.items()}

    def coverage(self, model: str) -> float:
        """The scored share of ``model``'s rows (1.0 for scores made before outcomes were recorded)."""
        value = self.metrics.get(model, {}).get("coverage")
        return 1.0 if value is None or (isinstance(value, float) and np.isnan(value)) else float(value)

    @property
    def incomplete(self) -> dict[str, float]:
        """{model: coverage} of the models scored on less than ``min_coverage`` of their rows."""
        return {m: self.coverage(m) for m in self.metrics if self.coverage(m) < self.min_coverage}

    @property
    def unscorable(self) -> list[str]:
        """The models with no scored row at all (listed, never dropped)."""
        return [m for m, values in self.metrics.items() if not values.get("n")]

    @property
    def models(self) -> list[str]:
        return list(self.metrics)


def score_frame(
    df: pd.DataFrame,
    n_resamples: int = 1000,
    seed: int = 0,
    generated_at: str | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
    calibration: pd.DataFrame | None = None,
) -> ScoreResult:
    """Metrics, intervals and standard errors, breakdowns (overall + each present dimension) and tables.

    Intervals and standard errors resample base items (``base_id``; :mod:`.clusters`), with the
    i.i.d. figures beside them; every pair of models is compared (:mod:`.pairwise`).

    Every model carries the multi-document metrics (NaN on a single-document run); intervals,
    standard errors and breakdown rows cover them only when the run has multi-document rows.
    Rows without a usable response (``outcome`` not ok) enter the outcome rates and the response
    distribution's "no usable response"; the other tables are made of the scored rows.

    ``calibration``: the judged rows of the run's calibration pass (paper App. F.2). When given,
    the metrics declared ``calibration=True`` (ECE), their intervals and breakdown rows,
    ``n_confidence``, the reliability table and the max-confidence summary come from it alone
    (NaN for a model it lacks); everything else from ``df``.
    """
    df = ensure_prepared(df)
    scored = _scored(df)
    confidences = df if calibration is None else ensure_prepared(calibration)
    fed = calibration_metrics() if calibration is not None else ()
    names = run_metrics(df)
    own = [name for name in names if name not in fed]  # the metrics df itself feeds
    per_model = model_stats(df)
    metrics = compute_metrics(df, all_metrics() + coverage_metrics(), per_model)
    figures = (
        bootstrap_figures(df, own, n_resamples=n_resamples, seed=seed)
        if n_resamples > 0
        else {CLUSTER: ({}, {}), IID: ({}, {})}
    )
    if fed:
        _feed_calibration(metrics, figures, confidences, fed, n_resamples, seed)
    intervals, errors = figures[CLUSTER]
    parts = (
        [overall_rows(metrics, intervals, names)]
        + [breakdown(df, by, own, n_resamples=n_resamples, seed=seed) for by in BREAKDOWN_DIMENSIONS]
        + [breakdown(confidences, by, fed, n_resamples=n_resamples, seed=seed) for by in BREAKDOWN_DIMENSIONS if fed]
    )
    parts = [p for p in parts if not p.empty]
    table = pd.concat(parts, ignore_index=True) if parts else empty_breakdown()
    table["n"] = table["n"].astype(np.int64)
    return ScoreResult(
        metrics=metrics,
        intervals=intervals,
        standard_errors=errors,
        intervals_iid=figures[IID][0],
        standard_errors_iid=figures[IID][1],
        pairwise=pairwise_comparisons(df, n_resamples=n_resamples, seed=seed) if n_resamples > 0 else {},
        breakdown=table,
        confusion=confusion(scored),
        calibration=calibration_table(_scored(confidences)),
        calibration_source=FROM_CALIBRATION_PASS if calibration is not None else FROM_RESPONSES,
        max_confidence=max_confidence_summary(confidences),
        class_intensity=class_intensity_grid(scored),
        refusal_by_intensity=refusal_rate_by_intensity(scored),
        champions=domain_champions(scored),
        response_distribution=response_distribution(df, per_model=per_model),
        frr_mrr_correlation=frr_mrr_correlation(metrics),
        multi_document=multi_document_counts(df, per_model),
        outcomes=outcome_counts_by_model(df),
        min_coverage=min_coverage,
        n_resamples=n_resamples,
        seed=seed,
        generated_at=generated_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def _scored(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a prepared frame that have a usable response."""
    return df[df["scored"].to_numpy(dtype=bool)] if not df["scored"].all() else df


def _feed_calibration(
    metrics: dict[str, dict[str, float]],
    figures: dict[str, tuple[Intervals, Errors]],
    rows: pd.DataFrame,
    names: tuple[str, ...],
    n_resamples: int,
    seed: int,
) -> None:
    """Set every model's calibration metrics, ``n_confidence`` and their intervals and standard
    errors (both kinds) from the calibration pass's ``rows``; NaN (0) for a model it lacks."""
    values = compute_metrics(rows, names) if len(rows) else {}
    theirs = bootstrap_figures(rows, names, n_resamples=n_resamples, seed=seed) if n_resamples > 0 and len(rows) else {}
    for model, row in metrics.items():
        given = values.get(model, {})
        row.update({name: given.get(name, math.nan) for name in names})
        row["n_confidence"] = int(given.get("n_confidence", 0))
        for kind, (intervals, errors) in figures.items():
            their_intervals, their_errors = theirs.get(kind, ({}, {}))
            if not their_intervals and not intervals:
                continue  # no resamples: no intervals on either side
            for name in names:
                intervals.setdefault(model, {})[name] = their_intervals.get(model, {}).get(name, (math.nan, math.nan))
                errors.setdefault(model, {})[name] = their_errors.get(model, {}).get(name, math.nan)
