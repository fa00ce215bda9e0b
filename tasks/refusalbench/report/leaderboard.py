"""The leaderboard: models ranked by calibrated refusal score, and how metric values print.

:func:`leaderboard_rows` (JSON-safe dicts) and :func:`leaderboard_markdown` feed the Prefect
table and markdown artifacts; the HTML page shows the same ranking. The columns and their
labels come from the metric declarations (``scoring.paper_metrics``: ``leaderboard=True``).
Percentages print with one decimal, a metric declared ``percent=False`` (ECE) as a plain
number with three; an undefined value prints as "—".

A model scored on less than ``min_coverage`` of its rows (``coverage`` in its metrics: the
scored share; the rest were truncated, blocked, too long, empty or failed) is *incomplete*: it
is listed after the ranked models with its coverage and no rank, never ranked silently beside
models scored on every item. Metrics without ``coverage`` (scored before outcomes were
recorded) count as complete.

Ranks alone overstate what the data can tell apart. Given metrics.json's ``pairwise`` block
(``scoring.pairwise``: paired cluster-bootstrap differences, Holm-corrected), every form also
shows each ranked model's *rank range* and whether it is in the leader's group ("tied with #1":
not significantly below #1) (:func:`significance`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.core.html_page import is_nan
from refusalbench.tasks.refusalbench.scoring.result import DEFAULT_MIN_COVERAGE
from refusalbench.tasks.refusalbench.scoring.specs import (
    METRIC_SPECS,
    metric_spec,
    multi_document_metrics,
    single_document_metrics,
)

RANK_METRIC = "calibrated_refusal_score"
INTERVAL_NOTE = (
    "95% cluster bootstrap: each resample draws base items with all of their benchmark items "
    "(items of one base item are not independent; paper App. G)."
)
COMPLETE, INCOMPLETE = "complete", "incomplete"


def incomplete_models(
    metrics: Mapping[str, Mapping[str, float]], min_coverage: float = DEFAULT_MIN_COVERAGE
) -> dict[str, float]:
    """{model: coverage} of the models scored on less than ``min_coverage`` of their rows."""
    out = {}
    for model, values in metrics.items():
        coverage = values.get("coverage")
        if coverage is not None and not is_nan(coverage) and float(coverage) < min_coverage:
            out[model] = float(coverage)
        elif coverage is not None and is_nan(coverage):
            out[model] = 0.0  # no row at all: nothing was scored
    return out


def incomplete_note(coverage: float) -> str:
    """How an incomplete model is marked beside its name."""
    return f"incomplete: {100 * coverage:.1f}% of rows scored"


def leaderboard_metrics(metrics: Mapping[str, Mapping[str, float]]) -> tuple[tuple[str, str], ...]:
    """The leaderboard's columns as (metric, label): :data:`RANK_METRIC`, then the other metrics
    declared ``leaderboard=True`` in declaration order; a multi-document (GaRAGe) one only when
    some model in ``metrics`` ({model: {metric: value}}) has a value for it."""
    single = [n for n in single_document_metrics() if metric_spec(n).leaderboard and n != RANK_METRIC]
    multi = [
        n
        for n in multi_document_metrics()
        if metric_spec(n).leaderboard and any(not is_nan(values.get(n)) for values in metrics.values())
    ]
    return tuple((name, metric_spec(name).label) for name in [RANK_METRIC, *single, *multi])


def shown_as_percent(name: str) -> bool:
    """Whether values of ``name`` print as percentages: a metric as declared; any other share
    (a pass rate, an agreement) does."""
    spec = METRIC_SPECS.get(name)
    return spec is None or spec.percent


def ranked_models(metrics: Mapping[str, Mapping[str, float]], min_coverage: float = DEFAULT_MIN_COVERAGE) -> list[str]:
    """Models by calibrated refusal score, best first; undefined scores last, ties by name; then
    the incomplete models (:func:`incomplete_models`), most covered first, which get no rank."""
    incomplete = incomplete_models(metrics, min_coverage)

    def key(model: str) -> tuple[int, float, str]:
        if model in incomplete:
            return (2, -incomplete[model], model)
        score = metrics[model].get(RANK_METRIC, math.nan)
        return (1, 0.0, model) if is_nan(score) else (0, -float(score), model)

    return sorted(metrics, key=key)


def model_ranks(
    metrics: Mapping[str, Mapping[str, float]], min_coverage: float = DEFAULT_MIN_COVERAGE
) -> list[tuple[str, int | None]]:
    """(model, rank) in :func:`ranked_models`' order; an incomplete model's rank is None."""
    incomplete = incomplete_models(metrics, min_coverage)
    ranked = [m for m in ranked_models(metrics, min_coverage) if m not in incomplete]
    return [(m, i) for i, m in enumerate(ranked, start=1)] + [
        (m, None) for m in ranked_models(metrics, min_coverage) if m in incomplete
    ]


def significance(
    metrics: Mapping[str, Mapping[str, float]],
    pairwise: Mapping[str, Any] | None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> dict[str, dict[str, Any]]:
    """Per ranked model, from the Holm-corrected pairwise CRS comparisons (``scoring.pairwise``):

    - ``rank_low``, ``rank_high``: its rank range: 1 + the models significantly above it, to the
      ranked count − the models significantly below it;
    - ``tied_with_leader``: not significantly below #1 (#1 itself included): the leader's group;
    - ``p_vs_leader``: the Holm-adjusted p-value of its difference from #1 (None for #1).

    Only models with a rank and a CRS take part; {} without pairwise comparisons.
    """
    comparisons = (pairwise or {}).get("comparisons") or []
    ranked = [
        m
        for m, rank in model_ranks(metrics, min_coverage)
        if rank is not None and not is_nan(metrics[m].get(RANK_METRIC))
    ]
    if not comparisons or not ranked:
        return {}
    above: dict[tuple[str, str], bool] = {}  # (a, b): a significantly above b
    adjusted: dict[frozenset[str], float] = {}
    for comparison in comparisons:
        a, b = comparison["model_a"], comparison["model_b"]
        entry = (comparison.get("metrics") or {}).get(RANK_METRIC) or {}
        adjusted[frozenset((a, b))] = entry.get("p_adjusted", math.nan)
        difference = entry.get("difference")
        if entry.get("significant") and difference is not None and not is_nan(difference):
            above[(a, b) if difference > 0 else (b, a)] = True
    leader = ranked[0]
    out = {}
    for model in ranked:
        better = sum(above.get((other, model), False) for other in ranked)
        worse = sum(above.get((model, other), False) for other in ranked)
        p_value = None if model == leader else adjusted.get(frozenset((leader, model)), math.nan)
        out[model] = {
            "rank_low": 1 + better,
            "rank_high": len(ranked) - worse,
            "tied_with_leader": not above.get((leader, model), False),
            "p_vs_leader": None if p_value is None else _rounded(p_value),
        }
    return out


def rank_range_text(entry: Mapping[str, Any] | None) -> str:
    """ "3" or "1–4": a model's rank range; "" without one."""
    if not entry:
        return ""
    low, high = entry["rank_low"], entry["rank_high"]
    return str(low) if low == high else f"{low}–{high}"


def group_text(entry: Mapping[str, Any] | None) -> str:
    """The leader's group, as the leaderboard marks it: "tied with #1" (the leader: "#1"); "" otherwise."""
    if not entry or not entry["tied_with_leader"]:
        return ""
    return "#1" if entry["p_vs_leader"] is None else "tied with #1"


SIGNIFICANCE_NOTE = (
    "Rank range and group from every pair's paired cluster-bootstrap difference in CRS, "
    "Holm-corrected over all pairs (family-wise 5%): models in the leader's group are not "
    "significantly below #1; a rank range spans the ranks a model could hold given the "
    "pairs that are significantly different."
)


def _rounded(value: Any, digits: int = 4) -> float | None:
    return None if is_nan(value) else round(float(value), digits)


def leaderboard_rows(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
    standard_errors: Mapping[str, Mapping[str, float]] | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
    pairwise: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-safe dict per model, ranked (for a Prefect table artifact); NaN -> None.

    With ``standard_errors``, each row also carries the CRS's bootstrap standard error. Each
    row says its ``status`` (complete | incomplete) and ``coverage``; an incomplete model comes
    after the ranked ones with ``rank`` None. With ``pairwise`` (metrics.json's block), each row
    also says its ``rank_range``, ``group`` ("tied with #1" where not significantly below the
    leader) and ``p_vs_leader`` (:func:`significance`; empty for an unranked model).
    """
    intervals = intervals or {}
    incomplete = incomplete_models(metrics, min_coverage)
    groups = significance(metrics, pairwise, min_coverage) if pairwise else {}
    rows = []
    for model, rank in model_ranks(metrics, min_coverage):
        values = metrics[model]
        row: dict[str, Any] = {
            "rank": rank,
            "model": model,
            "status": INCOMPLETE if model in incomplete else COMPLETE,
            "coverage": _rounded(values.get("coverage", 1.0)),
        }
        if pairwise:
            entry = groups.get(model)
            row.update(
                rank_range=rank_range_text(entry),
                group=group_text(entry),
                p_vs_leader=entry["p_vs_leader"] if entry else None,
            )
        for name, _ in leaderboard_metrics(metrics):
            row[name] = _rounded(values.get(name))
        low, high = intervals.get(model, {}).get(RANK_METRIC, (None, None))
        row["crs_ci_low"], row["crs_ci_high"] = _rounded(low), _rounded(high)
        if standard_errors is not None:
            row["crs_se"] = _rounded(standard_errors.get(model, {}).get(RANK_METRIC))
        row["n"] = int(values.get("n", 0))
        rows.append(row)
    return rows


def format_value(value: Any, metric: str) -> str:
    """A metric value for a table cell: a percentage, or three decimals for ECE; "—" if undefined."""
    if is_nan(value):
        return "—"
    return f"{100 * float(value):.1f}%" if shown_as_percent(metric) else f"{float(value):.3f}"


def format_interval(interval: tuple[float, float] | None, metric: str) -> str:
    """An interval in the same units as :func:`format_value`; "" if absent or undefined."""
    if not interval or is_nan(interval[0]) or is_nan(interval[1]):
        return ""
    low, high = interval
    if not shown_as_percent(metric):
        return f"[{low:.3f}, {high:.3f}]"
    return f"[{100 * low:.1f}, {100 * high:.1f}]"


def _markdown_cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|").replace("`", "\\`").replace("\n", " ")


def leaderboard_markdown(
    metrics: Mapping[str, Mapping[str, float]],
    intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
    pairwise: Mapping[str, Any] | None = None,
) -> str:
    """The leaderboard as a markdown table (for a Prefect markdown artifact); incomplete models
    last, unranked ("—"), marked with their coverage. With ``pairwise``: a rank-range and a group
    column (:func:`significance`) and a note saying how they were made."""
    intervals = intervals or {}
    columns = leaderboard_metrics(metrics)
    incomplete = incomplete_models(metrics, min_coverage)
    groups = significance(metrics, pairwise, min_coverage) if pairwise else {}
    header = ["#", "Model", *(["Rank range", "Group"] if pairwise else []), *(label for _, label in columns), "n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, rank in model_ranks(metrics, min_coverage):
        values = metrics[model]
        name = _markdown_cell(model)
        if model in incomplete:
            name += f" **({incomplete_note(incomplete[model])})**"
        cells = ["—" if rank is None else str(rank), name]
        if pairwise:
            cells += [rank_range_text(groups.get(model)), group_text(groups.get(model))]
        for name, _ in columns:
            cell = format_value(values.get(name), name)
            ci = format_interval(intervals.get(model, {}).get(name), name)
            cells.append(f"{cell} {ci}".strip())
        cells.append(str(int(values.get("n", 0))))
        lines.append("| " + " | ".join(cells) + " |")
    note = f"\n{SIGNIFICANCE_NOTE} Intervals: {INTERVAL_NOTE}\n" if pairwise else ""
    return "\n".join(lines) + "\n" + note
