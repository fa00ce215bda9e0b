"""Steps of the refresh flow around its main job: stage lines, the trend, and what the run shows.

On the refresh run's own page in the Prefect UI (its main job is a sub-flow with a page of its own):

- Logs: a line as each stage starts and ends (:func:`stage`), and the main job's stages with their
  times, items, calls and cost (:func:`main_job_lines`);
- Artifacts: ``refresh-summary`` (the round's leaderboard, what changed since the last round or
  "no model moved", items, calls and cost, freshness, the round's error bound, incomplete rounds,
  the ``refusalbench view`` command for the round's folder, the report), ``refresh-trend`` (a
  readable table: rounded, the few columns that matter) and ``refresh-report`` (a link to the
  report, whose trend chart shows each model over the rounds: an HTTP link signed for
  :data:`REPORT_LINK_EXPIRY_S` where the store is S3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.core.where_to_look import view_command
from refusalbench.tasks.pipeline.ui import publish_link, publish_markdown, publish_table, story
from refusalbench.tasks.refusalbench.report.run_outputs import build_report_for
from refusalbench.tasks.refusalbench.rounds.freshness import (
    fingerprint_changes,
    fingerprint_lines,
    freshness_lines,
    previous_fingerprints,
)
from refusalbench.tasks.refusalbench.rounds.trend import (
    Trend,
    changes_markdown,
    collect_trend,
    compare_rounds,
    readable_trend,
    round_error,
    save_trend,
)
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import TrendDocument

REPORT_LINK_EXPIRY_S = 7 * 24 * 3600  # a week: until the next weekly round's report replaces it


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """``stage NAME: started`` and ``stage NAME: done in S s`` (or ``failed``) in the run's Logs tab."""
    story("stage %s: started", name)
    started = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        story("stage %s: failed after %.1f s: %s", name, time.perf_counter() - started, exc, level=logging.ERROR)
        raise
    story("stage %s: done in %.1f s", name, time.perf_counter() - started)


def _manifests(round_store: ArtifactStore) -> list[runfolder.RunManifest]:
    """The round's generate and evaluate manifests (a main job keeps generate's beside evaluate's)."""
    return [round_store.load(a) for a in (rb_files.GENERATION_MANIFEST, runfolder.MANIFEST) if round_store.has(a)]


def calls_and_cost(round_store: ArtifactStore) -> dict[str, float]:
    """The round's calls summed over its stages and models: HTTP calls, cache hits, tokens, cost in USD."""
    total: dict[str, float] = {"http_calls": 0, "cache_hits": 0, "deduplicated": 0, "tokens": 0, "cost_usd": 0.0}
    for manifest in _manifests(round_store):
        for counters in manifest.calls.values():
            if not isinstance(counters, Mapping):
                continue
            for key in ("http_calls", "cache_hits", "deduplicated", "cost_usd"):
                total[key] += float(counters.get(key) or 0)
            total["tokens"] += float(counters.get("prompt_tokens") or 0) + float(counters.get("completion_tokens") or 0)
    return total


def _calls_text(calls: Mapping[str, float]) -> str:
    return (
        f"{int(calls['http_calls']):,} HTTP calls, {int(calls['cache_hits']):,} cache hits, "
        f"{int(calls['deduplicated']):,} deduplicated, {int(calls['tokens']):,} tokens, ${calls['cost_usd']:.2f}"
    )


def main_job_lines(round_store: ArtifactStore) -> None:
    """The main job's stages with their times, and its items, calls and cost, in the run's Logs tab."""
    for manifest in _manifests(round_store):
        timings = " · ".join(f"{name} {seconds:.1f} s" for name, seconds in manifest.timings_s.items())
        story("main job, %s stages: %s", manifest.kind, timings or "none recorded")
    counts = next((m.counts for m in _manifests(round_store) if m.kind == "generate"), {})
    story(
        "benchmark: %s items (%s accepted of %s candidates); calls: %s",
        counts.get("sampled", "?"),
        counts.get("accepted", "?"),
        counts.get("candidates", "?"),
        _calls_text(calls_and_cost(round_store)),
    )


@dataclasses.dataclass
class RoundTrend:
    """A round compared with the earlier ones: the trend, its document and the rebuilt report."""

    trend: Trend
    document: TrendDocument
    report: str


def compare_and_report(cfg: RunConfig, root: ArtifactStore, round_id: str, rounds_to_compare: int) -> RoundTrend:
    """Trend of the last rounds, significant changes (FDR ``refresh.fdr``), the round's error bound, saved
    into the round folder; the report rebuilt so it shows them."""
    min_coverage = cfg.evaluation.min_coverage if cfg.evaluation else None  # one bar for every round compared
    trend = collect_trend(root, rounds_to_compare, current=round_id, min_coverage=min_coverage)
    comparisons = compare_rounds(trend.rows, cfg.refresh.fdr)
    error = round_error(trend.rows, round_id, cfg.refresh.rounds, cfg.refresh.delta)
    round_store = root.child(round_id)
    freshness = round_store.load(rb_files.FRESHNESS) if round_store.has(rb_files.FRESHNESS) else None
    changes = (
        fingerprint_changes(previous_fingerprints(root, round_id), freshness.fingerprints)
        if freshness is not None
        else []
    )
    document = save_trend(round_store, trend, comparisons, cfg.refresh.fdr, error, freshness, changes)
    report = build_report_for(root.child(round_id).uri(""))
    story(
        "trend: %d rounds, %d comparisons, %d significant change(s) at FDR %g; %d incomplete round(s)",
        len(trend.rounds),
        document.comparisons,
        len(document.flags),
        cfg.refresh.fdr,
        len(trend.incomplete),
    )
    return RoundTrend(trend, document, report)


def report_link(round_store: ArtifactStore) -> tuple[str, str]:
    """(link, words) for the round's report: a signed HTTP link where the store can sign one, else its path."""
    name = runfolder.REPORT.name
    url = round_store.presigned_url(name, REPORT_LINK_EXPIRY_S, content_type="text/html")
    if url:
        return url, f"{name} (signed link, valid {REPORT_LINK_EXPIRY_S // 86400} days)"
    return round_store.uri(name), name


def _freshness_markdown(document: TrendDocument) -> str:
    lines = [f"- {line}" for line in freshness_lines(document.freshness)] or ["not recorded"]
    changes = fingerprint_lines([c.model_dump() for c in document.fingerprint_changes])
    lines += [f"- model fingerprint changed: {line}" for line in changes]
    return "\n".join(lines)


def _leaderboard_markdown(cfg: RunConfig, round_store: ArtifactStore) -> str:
    from refusalbench.tasks.refusalbench.report.leaderboard import leaderboard_markdown
    from refusalbench.tasks.refusalbench.scoring.io import read_metrics_json

    metrics = read_metrics_json(round_store.read_bytes(rb_files.METRICS.name))
    counts = metrics.get("counts") or {}
    models = {
        model: {**values, "n": (counts.get(model) or {}).get("n", 0)} for model, values in metrics["models"].items()
    }
    min_coverage = cfg.evaluation.min_coverage if cfg.evaluation else 0.95
    return leaderboard_markdown(models, metrics["intervals"], min_coverage=min_coverage)


def summary_markdown(
    cfg: RunConfig, root: ArtifactStore, round_id: str, seed: int, outcome: RoundTrend, link: tuple[str, str]
) -> str:
    """The refresh run's summary: what a person watching the schedule wants to know about the round."""
    round_store = root.child(round_id)
    document = outcome.document
    counts = next((m.counts for m in _manifests(round_store) if m.kind == "generate"), {})
    error = document.round_error
    bound = (
        "not recorded"
        if error is None
        else f"±{error.epsilon:.3f} for every one of {error.rounds} rounds of {error.items:,} items, with probability "
        f"{1 - error.delta:g} (Theorem 3.1; `refusalbench plan --rounds` sizes a round)"
    )
    incomplete = "\n".join(f"- {r.round}: {r.reason}" for r in document.incomplete_rounds) or "none"
    return "\n".join(
        [
            f"# Refresh round {round_id}",
            "",
            f"Seed {seed}; the trend covers {len(document.rounds)} complete round(s).",
            "",
            "## Leaderboard",
            "",
            _leaderboard_markdown(cfg, round_store),
            "## What changed since the last round",
            "",
            changes_markdown(document),
            "",
            "## Items, calls and cost",
            "",
            f"- benchmark items: {counts.get('sampled', '?')} ({counts.get('accepted', '?')} accepted of "
            f"{counts.get('candidates', '?')} candidates)",
            f"- calls: {_calls_text(calls_and_cost(round_store))}",
            f"- error bound of this round: {bound}",
            "",
            "## Freshness",
            "",
            _freshness_markdown(document),
            "",
            "## Incomplete rounds",
            "",
            incomplete,
            "",
            "## Explore the items",
            "",
            "```",
            view_command(round_store.root),
            "```",
            "",
            "## Report",
            "",
            f"[{link[1]}]({link[0]})",
            "",
        ]
    )


def publish_round(cfg: RunConfig, root: ArtifactStore, round_id: str, seed: int, outcome: RoundTrend) -> None:
    """The refresh run's artifacts: summary, readable trend table, report link (the report charts the trend)."""
    link = report_link(root.child(round_id))
    publish_markdown(
        "refresh-summary", summary_markdown(cfg, root, round_id, seed, outcome, link), f"Refresh round {round_id}"
    )
    publish_table("refresh-trend", readable_trend(outcome.trend.rows), "Per model and round: estimate [95% interval]")
    publish_link("refresh-report", link[0], link[1], f"The report of round {round_id}")
    story("report: %s", link[0] if not link[0].startswith("http") else f"{link[1]}: {link[0]}")
