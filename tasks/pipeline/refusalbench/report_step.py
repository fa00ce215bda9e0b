"""Stage: report. ``report.html`` in the run folder, and the leaderboard in the Prefect UI.

The ``run-summary`` markdown is what to read first on the flow run's page: the leaderboard, the
``refusalbench view`` command for the run folder and a link to the report.
"""

from __future__ import annotations

import json
from pathlib import Path

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.pipeline.ui import publish_link, publish_markdown, publish_table, story
from refusalbench.tasks.refusalbench.report.run_outputs import write_report
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
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
    publish_run_summary(run.store, report_uri)
    story("report: %s", _link(report_uri))
    return report_uri


def publish_run_summary(store: ArtifactStore, report_uri: str) -> None:
    """The ``run-summary`` markdown of the running flow, from the run folder's metrics.json."""
    from refusalbench.tasks.refusalbench.report.terminal_leaderboard import run_summary_markdown

    document = json.loads(store.read_bytes(rb_files.METRICS.name))
    publish_markdown(
        "run-summary",
        run_summary_markdown(document, report_uri, store.root),
        "Leaderboard, the command that explores the items, the report",
    )


def _link(uri: str) -> str:
    return uri if "://" in uri else Path(uri).resolve().as_uri()
