"""Pure code's narration (``tasks/core/narration.py``): the module logger without a runtime, the
Prefect UI once the pipeline is loaded, and never a Prefect import in the kernel."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from refusalbench.tasks.core import narration


def test_without_a_runtime_the_story_goes_to_the_logger_and_artifacts_nowhere(caplog):
    previous = narration.install(narration.LoggerSink())
    try:
        with caplog.at_level(logging.INFO, logger="refusalbench"):
            narration.story("stage %s: done", "score")
            narration.story("note: %s", "odd", level=logging.WARNING)
            narration.publish_table("leaderboard", [{"model": "m"}])
            narration.publish_markdown("notes", "# notes")
            narration.publish_link("report", "file:///r.html", "report.html")
    finally:
        narration.install(previous)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("refusalbench", logging.INFO, "stage score: done"),
        ("refusalbench", logging.WARNING, "note: odd"),
    ]


def test_loading_the_pipeline_points_the_narration_at_the_prefect_ui():
    import refusalbench.tasks.pipeline  # noqa: F401
    from refusalbench.tasks.pipeline.ui import PrefectSink

    previous = narration.install(narration.LoggerSink())
    narration.install(previous)
    assert isinstance(previous, PrefectSink)


@pytest.mark.usefixtures("prefect_harness")
def test_pure_codes_narration_reaches_the_runs_logs_and_artifacts():
    """What provenance, the audit and KnowOrNot's report tell lands where the pipeline's own story does."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId
    from prefect.context import FlowRunContext
    from prefect.logging.handlers import APILogHandler

    import refusalbench.tasks.pipeline  # noqa: F401  (installs the Prefect sink)

    @flow
    def narrated() -> Any:
        narration.story("stage %s: done in %.1f s", "audit", 0.5)
        narration.publish_table("audit pass rates", [{"class": "P-Ambiguity", "pass_rate": float("nan")}])
        narration.publish_link("knowornot-report", "file:///tmp/report.html", "report.html")
        return FlowRunContext.get().flow_run.id

    run_id = narrated()
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    assert [log.message for log in logs if log.name == "refusalbench.story"] == ["stage audit: done in 0.5 s"]
    by_key = {a.key: a for a in artifacts}
    assert set(by_key) == {"audit-pass-rates", "knowornot-report"}
    assert by_key["audit-pass-rates"].type == "table" and by_key["knowornot-report"].type == "markdown"
