"""What a stage's rows came to, per model, told to the user when the stage ends.

Every model-calling stage (generate, verify, respond, score) ends with one story line per
model that lost rows, saying how many of its rows failed, were truncated, blocked by the
provider, too long for its window or empty, and how many are left out (excluded) in all; a
table of the same goes to the run's viewers. A model that lost nothing is named in one line
for all of them. Lines about lost rows are warnings, so the terminal shows them too
(``core.narration``: the Prefect runtime also puts them in the run's Logs tab).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from refusalbench.tasks.core.narration import publish_table, story
from refusalbench.tasks.llm.reply_outcomes import (
    CALL_ERROR,
    EMPTY,
    FAILURES,
    OK,
    PARSE_ERROR,
    PROVIDER_BLOCKED,
    TOO_LONG,
    TRUNCATED,
)

# The columns of a stage's outcome summary, per model.
SUMMARY_COLUMNS: tuple[str, ...] = ("rows", "failed", "truncated", "blocked", "too_long", "empty", "excluded")


def row_outcome(row: Any) -> str:
    """A record's outcome; rows written before outcomes were recorded: ``call_error`` when they
    carry an error, else ``ok``."""
    outcome = getattr(row, "outcome", None)
    if outcome:
        return str(outcome)
    return CALL_ERROR if getattr(row, "error", None) is not None else OK


def outcome_summary(rows: Iterable[Any], by: str = "model") -> dict[str, dict[str, int]]:
    """{model: {rows, failed, truncated, blocked, too_long, empty, excluded}} of ``rows``, the
    model read from each row's ``by`` field (``generator`` for candidates, ``verifier`` ...)."""
    counts: dict[str, Counter[str]] = {}
    for row in rows:
        counts.setdefault(str(getattr(row, by)), Counter())[row_outcome(row)] += 1
    summary = {}
    for model, outcomes in sorted(counts.items()):
        summary[model] = {
            "rows": sum(outcomes.values()),
            "failed": sum(outcomes[o] for o in FAILURES),
            "truncated": outcomes[TRUNCATED],
            "blocked": outcomes[PROVIDER_BLOCKED],
            "too_long": outcomes[TOO_LONG],
            "empty": outcomes[EMPTY],
            "excluded": sum(n for o, n in outcomes.items() if o != OK),
        }
    return summary


def summary_line(stage: str, model: str, counts: dict[str, int]) -> str:
    """``respond: t1: 3 of 10 rows excluded (1 failed, 2 truncated, 0 blocked, 0 too long, 0 empty)``."""
    return (
        f"{stage}: {model}: {counts['excluded']} of {counts['rows']} rows excluded ({counts['failed']} failed, "
        f"{counts['truncated']} truncated, {counts['blocked']} blocked, {counts['too_long']} too long, "
        f"{counts['empty']} empty)"
    )


def tell_outcomes(stage: str, summary: dict[str, dict[str, int]]) -> None:
    """The stage's outcome summary as story lines (a warning per model that lost rows) and a table."""
    if not summary:
        return
    whole = [model for model, counts in summary.items() if not counts["excluded"]]
    for model, counts in summary.items():
        if counts["excluded"]:
            story("%s", summary_line(stage, model, counts), level=logging.WARNING, terminal=True)
    if whole:
        story("%s: every row usable for %s", stage, ", ".join(whole))
    publish_table(
        f"{stage}-outcomes",
        [{"model": model, **counts} for model, counts in summary.items()],
        f"{stage}: rows per model that failed or came back without a usable reply",
    )


def failed_calls(candidates: Iterable[Any], verifications: Iterable[Any]) -> dict[str, Counter[str]]:
    """{"generate": outcomes, "verify": outcomes} of the calls that brought no usable reply
    (failed, truncated, blocked, too long, empty; a reply that did not parse is the model's)."""

    def lost(rows: Iterable[Any]) -> Counter[str]:
        return Counter(o for o in map(row_outcome, rows) if o not in (OK, PARSE_ERROR))

    return {
        "generate": lost(candidates),
        "verify": lost(v for v in verifications if getattr(v, "verdict", None) != "SKIPPED"),
    }


def empty_benchmark_reason(candidates: list[Any], verifications: list[Any]) -> str | None:
    """Why a benchmark is empty when model calls failed, in one line; None when no call failed
    (then the verifiers rejected every candidate, which the G-V analysis shows)."""
    failed = failed_calls(candidates, verifications)
    if not any(failed.values()):
        return None
    parts = []
    for stage, total in (
        ("generator", len(candidates)),
        ("verifier", sum(getattr(v, "verdict", None) != "SKIPPED" for v in verifications)),
    ):
        lost = failed["generate" if stage == "generator" else "verify"]
        if lost:
            kinds = ", ".join(f"{n} {outcome}" for outcome, n in lost.most_common())
            parts.append(f"{sum(lost.values())} of {total} {stage} calls brought no usable reply ({kinds})")
    return "the benchmark is empty: " + "; ".join(parts) + " (see counts in manifest.json and the stage warnings)"


def tell_coverage(incomplete: dict[str, float], unscorable: list[str], min_coverage: float) -> None:
    """A warning per target scored on less than ``min_coverage`` of its rows, and the targets
    with no scored row at all (listed on the leaderboard, never dropped)."""
    for model, coverage in sorted(incomplete.items()):
        story(
            "score: %s is incomplete: %.1f%% of its rows scored (min_coverage %.0f%%); the leaderboard lists it "
            "apart, unranked",
            model,
            100 * coverage,
            100 * min_coverage,
            level=logging.WARNING,
            terminal=True,
        )
    if unscorable:
        story(
            "score: no row could be scored for %s", ", ".join(sorted(unscorable)), level=logging.WARNING, terminal=True
        )
