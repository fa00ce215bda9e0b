"""Stage: report. ``report.html`` in the run folder, and the leaderboard in the Prefect UI."""

from __future__ import annotations

from pathlib import Path

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.pipeline.ui import publish_link, publish_markdown, publish_table, story
from refusalbench.tasks.refusalbench.report.run_outputs import write_report
from refusalbench.tasks.refusalbench.scoring import ScoreResult


def report_results(run: StageRun, result: ScoreResult) -> str:
    """Write the report (after the manifest is saved: the report shows it); returns its URI."""
    from refusalbench.tasks.refusalbench.report import (  # the report package: only for a report
        leaderboard_markdown,
        leaderboard_rows,
    )

    run.recorder.save()
    with run.recorder.stage("report"):
        report_uri = write_report(run.store, result)
        run.recorder.artifact(runfolder.REPORT)
    publish_table(
        "leaderboard",
        leaderboard_rows(
            result.metrics,
            result.intervals,
            result.standard_errors,
            min_coverage=result.min_coverage,
            pairwise=result.pairwise or None,
        ),
        "Models ranked by calibrated refusal score; incomplete models (coverage below min_coverage) "
        "last, unranked. rank_range and group (tied with #1: not significantly below the leader) come "
        "from paired cluster-bootstrap comparisons, Holm-corrected; intervals resample base items",
    )
    publish_markdown(
        "leaderboard-md",
        leaderboard_markdown(
            result.metrics, result.intervals, min_coverage=result.min_coverage, pairwise=result.pairwise or None
        ),
        "Leaderboard",
    )
    publish_link("report", _link(report_uri), runfolder.REPORT.name, "Self-contained HTML report")
    story("report: %s", _link(report_uri))
    return report_uri


def _link(uri: str) -> str:
    return uri if "://" in uri else Path(uri).resolve().as_uri()
