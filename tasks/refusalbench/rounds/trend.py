"""The trend across refresh rounds: per-model metrics with intervals, and the changes that are not noise.

Each refresh round is a run folder ``round-<UTC time>-s<seed>/`` under one root. The trend
is one row per (round, model) with the estimates, 95% intervals and standard errors of
:data:`TREND_METRICS` from the round's ``metrics.json``. A round counts once it is complete:
its ``round.json`` (written by the refresh flow) says ``complete``, or it has none (a round of
an older version) and has ``metrics.json``. The others are listed as incomplete, with why.

What changed (:func:`compare_rounds`): for every model and metric, the latest round against
the model's previous complete round, as two independent samples (fresh rounds are): the
difference, its interval from the two rounds' own standard errors and a two-sided p-value
(``stats.independent_difference``). The p-values of all models x metrics are adjusted
together with Benjamini-Hochberg (``stats.bh_adjust``); a change is flagged only when its
adjusted p-value is at most the configured false-discovery rate (``refresh.fdr``).

A model is compared only on rounds where its coverage (the share of its rows scored) is at
least ``evaluation.min_coverage``: a model that lost rows to failed calls was scored on the
items that happened to get through, which is not the item set of its other rounds. In the
latest round such a model is listed as incomplete, not compared; an earlier incomplete round of
it is skipped (its previous complete round is compared instead). A round scored before coverage
was recorded counts as complete (every row of it was scored). A comparison is not tested (no
p-value, never flagged) when the standard error of the difference is zero (every bootstrap
resample gave the same value: nothing measures the noise) or when either round scored fewer
than :data:`MIN_SUPPORT` rows for the metric.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import bh_adjust, independent_difference, rounds_epsilon, z_value
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import (
    FreshnessDocument,
    IncompleteRound,
    RoundError,
    TrendDocument,
)
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec

TREND_METRICS = (
    "calibrated_refusal_score",
    "answer_accuracy",
    "refusal_accuracy",
    "false_refusal_rate",
    "missed_refusal_rate",
    "detection_f1",
)
HEADLINE_METRIC = "calibrated_refusal_score"
ROUND_PREFIX = "round-"
ROUND_RECORD = "round.json"  # the round's identity and status, written by the refresh flow
COMPLETE = "complete"
LEVEL = 0.95
TEST = (
    "latest round vs the model's previous complete round as two independent samples: difference, 95% interval "
    "from sqrt(se1^2 + se2^2), two-sided normal p-value; Benjamini-Hochberg across models x metrics; a model "
    "is compared only where its coverage reaches evaluation.min_coverage, and a difference whose standard "
    "error is 0 or whose rounds scored too few rows is not tested"
)
# The fewest scored rows (of a metric's denominator: answerable items for answer accuracy, ...) each round
# needs for its difference to be tested: below it the normal test and a bootstrap standard error mislead.
MIN_SUPPORT = 20
# The counts of metrics.json a trend row keeps: a metric's support is the one its denominator names.
COUNT_COLUMNS = ("n", "n_answerable", "n_unanswerable")
DEFAULT_MIN_COVERAGE = 0.95  # evaluation.min_coverage's default, for a round that recorded none


def round_name(now: dt.datetime, seed: int) -> str:
    return f"{ROUND_PREFIX}{now.strftime('%Y%m%dT%H%M%SZ')}-s{seed}"


def round_rows(round_id: str, metrics_doc: dict[str, Any], min_coverage: float | None = None) -> list[dict[str, Any]]:
    """One row per model: the round's estimates, intervals and standard errors of the trend metrics, its
    counts, its coverage and whether that is complete (at least ``min_coverage``; None: the threshold the
    round was scored with)."""
    rows = []
    intervals = metrics_doc.get("intervals") or {}
    errors = metrics_doc.get("standard_errors") or {}
    counts = metrics_doc.get("counts") or {}
    if min_coverage is None:
        min_coverage = float((metrics_doc.get("coverage") or {}).get("min_coverage") or DEFAULT_MIN_COVERAGE)
    for model, values in (metrics_doc.get("models") or {}).items():
        row: dict[str, Any] = {"round": round_id, "model": model}
        row |= {name: (counts.get(model) or {}).get(name) for name in COUNT_COLUMNS}
        coverage = _float(values.get("coverage"))
        row["coverage"] = None if math.isnan(coverage) else coverage
        row["complete"] = bool(math.isnan(coverage) or coverage >= min_coverage)  # unrecorded: every row scored
        for metric in TREND_METRICS:
            row[metric] = values.get(metric)
            low, high = intervals.get(model, {}).get(metric) or (None, None)
            row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = low, high
            row[f"{metric}_se"] = errors.get(model, {}).get(metric)
        rows.append(row)
    return rows


@dataclasses.dataclass
class Trend:
    """The last rounds under a root: the complete ones' rows, and the incomplete ones with why."""

    rows: pd.DataFrame
    incomplete: list[IncompleteRound]

    @property
    def rounds(self) -> list[str]:
        return sorted(self.rows["round"].unique().tolist()) if len(self.rows) else []


def round_state(round_store: ArtifactStore, current: bool = False) -> tuple[str, str | None]:
    """(status, why it is incomplete or None) of one round folder.

    ``current``: the round the caller is finishing now, whose record still says running.
    """
    status = "unrecorded"
    if round_store.exists(ROUND_RECORD):
        try:
            status = str(json.loads(round_store.read_text(ROUND_RECORD)).get("status") or "unrecorded")
        except (ValueError, AttributeError):
            status = "unreadable"
    has_metrics = round_store.has(rb_files.METRICS)
    if status in ("running", "unrecorded") and current and has_metrics:
        return COMPLETE, None
    if status not in (COMPLETE, "unrecorded"):
        return status, f"{ROUND_RECORD} says {status}" + ("" if has_metrics else f"; no {rb_files.METRICS.name}")
    if not has_metrics:
        return status, f"no {rb_files.METRICS.name} (the evaluation did not finish)"
    return COMPLETE, None


def check_round_versions(root: ArtifactStore) -> None:
    """Refuse (InputError, exit 2) a root holding a round that a newer refusalbench wrote, before a new round
    starts: the trend could not read it."""
    for name in root.folders():
        if name.startswith(ROUND_PREFIX):
            root.child(name).check_schema_version()


def collect_trend(
    root: ArtifactStore, limit: int, current: str | None = None, min_coverage: float | None = None
) -> Trend:
    """The last ``limit`` rounds under ``root`` (``current`` among them when given): rows of the complete
    ones (each model's coverage judged against ``min_coverage``), and the incomplete ones listed."""
    rounds = [name for name in root.folders() if name.startswith(ROUND_PREFIX)]
    if current is not None and current not in rounds:
        rounds = sorted([*rounds, current])
    rows: list[dict[str, Any]] = []
    incomplete: list[IncompleteRound] = []
    for round_id in rounds[-limit:]:
        store = root.child(round_id)
        status, why = round_state(store, current=round_id == current)
        if why is not None:
            incomplete.append(IncompleteRound(round=round_id, status=status, reason=why))
            continue
        rows.extend(round_rows(round_id, store.load(rb_files.METRICS).model_dump(), min_coverage))
    return Trend(pd.DataFrame(rows), incomplete)


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats (NaN where absent or null)."""
    if name not in frame.columns:
        return np.full(len(frame), np.nan)
    values: np.ndarray = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
    return values


def _standard_errors(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """Each row's standard error of ``metric``; where metrics.json has none, the 95% interval's half-width / z."""
    from_interval = (_column(frame, f"{metric}_ci_high") - _column(frame, f"{metric}_ci_low")) / (2 * z_value(LEVEL))
    se = _column(frame, f"{metric}_se")
    return np.where(np.isnan(se), from_interval, se)


def _float(value: Any) -> float:
    return math.nan if value is None or pd.isna(value) else float(value)


def compare_rounds(
    rows: pd.DataFrame, fdr: float, metrics: tuple[str, ...] = TREND_METRICS, min_support: int = MIN_SUPPORT
) -> pd.DataFrame:
    """Every model x metric of the latest round against the model's previous complete round: one row each
    with the difference, its interval, p-value, BH-adjusted p-value and whether it is flagged (adjusted <= fdr).

    Only rounds where the model's coverage is complete take part (a row's ``complete``; rows without it
    are). ``tested`` is False, with no p-value, where the difference's standard error is 0 or either
    round scored fewer than ``min_support`` rows for the metric; ``untested`` says why."""
    columns = [
        "model",
        "metric",
        "previous_round",
        "round",
        "previous",
        "previous_interval",
        "latest",
        "difference",
        "difference_low",
        "difference_high",
        "p_value",
        "adjusted_p_value",
        "significant",
        "direction",
        "better",
        "tested",
        "untested",
    ]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    latest_round = rows["round"].max()
    if "complete" in rows.columns:
        rows = rows[rows["complete"].fillna(True).astype(bool)]  # incomplete coverage: not compared
    ordered = rows.sort_values(["model", "round"])
    last_two = ordered.groupby("model", sort=True).tail(2)
    counts = last_two.groupby("model")["round"].transform("size")
    latest = last_two[(counts == 2) & (last_two["round"] == latest_round)].set_index("model")
    if latest.empty:
        return pd.DataFrame(columns=columns)
    previous = last_two[last_two["model"].isin(latest.index)].groupby("model").head(1).set_index("model")
    previous = previous.loc[latest.index]
    models, k = latest.index.to_numpy(), len(metrics)
    table = pd.DataFrame(
        {
            "model": np.tile(models, k),
            "metric": np.repeat(metrics, len(models)),
            "previous_round": np.tile(previous["round"].to_numpy(), k),
            "round": latest_round,
            "previous": np.concatenate([_column(previous, m) for m in metrics]),
            "previous_low": np.concatenate([_column(previous, f"{m}_ci_low") for m in metrics]),
            "previous_high": np.concatenate([_column(previous, f"{m}_ci_high") for m in metrics]),
            "latest": np.concatenate([_column(latest, m) for m in metrics]),
            "se_previous": np.concatenate([_standard_errors(previous, m) for m in metrics]),
            "se_latest": np.concatenate([_standard_errors(latest, m) for m in metrics]),
            "support": np.concatenate(
                [np.fmin(_support(previous, m), _support(latest, m)) for m in metrics]
            ),  # the smaller round's
        }
    )
    table["previous_interval"] = [[low, high] for low, high in zip(table["previous_low"], table["previous_high"])]
    difference, low, high, p = independent_difference(
        table["previous"], table["se_previous"], table["latest"], table["se_latest"], LEVEL
    )
    se = np.hypot(table["se_previous"].to_numpy(), table["se_latest"].to_numpy())
    too_few = (table["support"] < min_support).to_numpy()  # NaN (no count recorded) compares False: tested
    untested = [
        f"fewer than {min_support} rows scored for it in a round"
        if few
        else "standard error 0: no resample varied, nothing measures the noise"
        if zero
        else None
        for few, zero in zip(too_few, se == 0)
    ]
    table["untested"] = pd.Series(untested, index=table.index, dtype=object)
    table["tested"] = pd.isna(table["untested"]) & ~np.isnan(p)
    p = np.where(table["tested"], p, np.nan)  # an untested difference is not in the family BH adjusts
    table["difference"], table["difference_low"], table["difference_high"], table["p_value"] = difference, low, high, p
    table["adjusted_p_value"] = bh_adjust(p.tolist())
    table["significant"] = table["adjusted_p_value"] <= fdr  # NaN (no comparison possible) compares False
    table["direction"] = np.where(table["difference"] > 0, "up", np.where(table["difference"] < 0, "down", "none"))
    table["better"] = pd.Series([_better(m, d) for m, d in zip(table["metric"], table["difference"])], dtype=object)
    return table[columns]


def _support(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """Each row's scored rows behind ``metric``: the count its denominator names (else all scored rows)."""
    names = [name for name in metric_spec(metric).denominator if name in COUNT_COLUMNS] or ["n"]
    support: np.ndarray = np.fmin.reduce([_column(frame, name) for name in names])
    return support


def not_compared(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """The models of the latest round whose coverage is incomplete: listed, not compared."""
    if rows.empty or "complete" not in rows.columns:
        return []
    latest = rows[rows["round"] == rows["round"].max()]
    out = []
    for row in latest[~latest["complete"].fillna(True).astype(bool)].sort_values("model").itertuples(index=False):
        coverage = _float(row.coverage)
        out.append(
            {
                "model": row.model,
                "round": row.round,
                "coverage": None if math.isnan(coverage) else coverage,
                "reason": f"incomplete: {100 * coverage:.1f}% of its rows scored, not compared",
            }
        )
    return out


def _better(metric: str, difference: float) -> bool | None:
    """Whether a change of ``metric`` by ``difference`` is for the better; None: no change or no direction."""
    higher_is_better = metric_spec(metric).higher_is_better
    if higher_is_better is None or difference == 0 or pd.isna(difference):
        return None
    return bool((difference > 0) == higher_is_better)


def flags(comparisons: pd.DataFrame) -> list[dict[str, Any]]:
    """The significant changes, as ``trend.json`` lists them."""
    out = []
    for row in comparisons[comparisons["significant"].astype(bool)].itertuples(index=False):
        out.append(
            {
                "model": row.model,
                "metric": row.metric,
                "previous_round": row.previous_round,
                "round": row.round,
                "previous": row.previous,
                "previous_interval": row.previous_interval,
                "latest": row.latest,
                "direction": row.direction,
                "better": row.better,
                "difference": row.difference,
                "difference_interval": [row.difference_low, row.difference_high],
                "p_value": row.p_value,
                "adjusted_p_value": row.adjusted_p_value,
            }
        )
    return out


def round_error(rows: pd.DataFrame, round_id: str, rounds: int, delta: float) -> RoundError | None:
    """The epsilon the round's size achieves under Theorem 3.1 (its largest scored n across models)."""
    part = rows[rows["round"] == round_id] if len(rows) else rows
    if part.empty or "n" not in part or part["n"].isna().all():
        return None
    n = int(part["n"].max())
    return RoundError(items=n, rounds=rounds, delta=delta, epsilon=rounds_epsilon(n, delta, rounds))


def save_trend(
    round_store: ArtifactStore,
    trend: Trend,
    comparisons: pd.DataFrame,
    fdr: float,
    error: RoundError | None,
    freshness: FreshnessDocument | None = None,
    fingerprint_changes: list[dict[str, Any]] | None = None,
) -> TrendDocument:
    """``round_trend.parquet`` and ``trend.json`` into the round's run folder (with the round's freshness
    and fingerprint changes, so the report shows them beside the trend)."""
    document = TrendDocument(
        rounds=trend.rounds,
        flags=flags(comparisons),
        metric=HEADLINE_METRIC,
        metrics=list(TREND_METRICS),
        test=TEST,
        fdr=fdr,
        comparisons=int(comparisons["p_value"].notna().sum()) if len(comparisons) else 0,
        untested=int((~comparisons["tested"].astype(bool)).sum()) if len(comparisons) else 0,
        not_compared=not_compared(trend.rows),
        incomplete_rounds=trend.incomplete,
        round_error=error,
        freshness=freshness,
        fingerprint_changes=fingerprint_changes or [],
    )
    round_store.save(rb_files.ROUND_TREND, trend.rows)
    round_store.save(rb_files.TREND, document)
    return document


def readable_trend(
    rows: pd.DataFrame, metrics: tuple[str, ...] = (HEADLINE_METRIC, "answer_accuracy", "refusal_accuracy")
) -> list[dict[str, Any]]:
    """The trend a person reads: round, model, n and a few metrics as ``0.612 [0.571, 0.650]``."""
    out: list[dict[str, Any]] = []
    if rows.empty:
        return out
    for row in rows.sort_values(["model", "round"]).itertuples(index=False):
        record = row._asdict()
        shown: dict[str, Any] = {
            "round": record["round"],
            "model": record["model"],
            "n": None if pd.isna(record.get("n")) else int(record["n"]),
            "coverage": _coverage_text(record),
        }
        for metric in metrics:
            value, low, high = (_float(record.get(k)) for k in (metric, f"{metric}_ci_low", f"{metric}_ci_high"))
            text = "—" if math.isnan(value) else f"{value:.3f}"
            if not math.isnan(low) and not math.isnan(high):
                text += f" [{low:.3f}, {high:.3f}]"
            shown[metric_spec(metric).label] = text
        out.append(shown)
    return out


def _coverage_text(record: dict[str, Any]) -> str:
    """``100.0%``, or ``61.5%: incomplete, not compared`` below the threshold; ``—`` where not recorded."""
    coverage = _float(record.get("coverage"))
    if math.isnan(coverage):
        return "—"
    complete = record.get("complete")
    return f"{100 * coverage:.1f}%" + ("" if complete is None or bool(complete) else ": incomplete, not compared")


def change_line(flag: dict[str, Any]) -> str:
    """One significant change in words: ``m: CRS 0.500 -> 0.700 (+0.200 [+0.10, +0.30], adjusted p 0.001, better)``."""
    moved = f"{flag['model']}: {metric_spec(flag['metric']).label} {flag['previous']:.3f} -> {flag['latest']:.3f}"
    if flag.get("difference") is None:  # a trend.json of an older version: the move, without a test
        return f"{moved} ({flag['direction']})"
    low, high = flag["difference_interval"]
    verdict = "" if flag.get("better") is None else (", better" if flag["better"] else ", worse")
    p_text = _p_text(flag["adjusted_p_value"])
    return f"{moved} ({flag['difference']:+.3f} [{low:+.3f}, {high:+.3f}], adjusted p {p_text}{verdict})"


def _p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def changes_markdown(document: TrendDocument) -> str:
    """What changed since the previous round, or an explicit "no model moved", with the test used."""
    if len(document.rounds) < 2:
        return "Only one complete round so far: nothing to compare yet."
    if document.fdr is None:  # a trend.json written before the FDR-controlled test
        return "\n".join(f"- {change_line(flag.model_dump())}" for flag in document.flags) or "No flags recorded."
    if not document.flags:
        text = (
            f"**No model moved**: none of {document.comparisons} comparisons (models x metrics) is significant "
            f"at a false-discovery rate of {document.fdr:g}."
        )
    else:
        lines = [f"- {change_line(flag.model_dump())}" for flag in document.flags]
        text = (
            f"**{len(document.flags)} significant change(s)** of {document.comparisons} comparisons "
            f"(false-discovery rate {document.fdr:g}):\n\n" + "\n".join(lines)
        )
    return text + "".join(f"\n\n{line}" for line in not_compared_lines(document))


def not_compared_lines(document: TrendDocument) -> list[str]:
    """What the trend left out of its test: the incomplete models, the untested differences."""
    lines = []
    if document.not_compared:
        listed = ", ".join(f"{entry.model} ({entry.reason})" for entry in document.not_compared)
        lines.append(f"Incomplete in this round, not compared: {listed}.")
    if document.untested:
        lines.append(
            f"{document.untested} difference(s) not tested: standard error 0 or fewer than {MIN_SUPPORT} rows "
            "scored for the metric in a round."
        )
    return lines
