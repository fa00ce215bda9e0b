"""Refresh rounds: fresh seeds, one folder per round, trend across rounds, significant changes, and what the
refresh run shows (summary, trend table and plot, report link, stage lines; the report's trend section in a browser).

The statistics of the trend are tested on simulated rounds in tests/refusalbench/test_trend.py."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply


@pytest.mark.usefixtures("prefect_harness")
def test_two_rounds_trend_and_flag(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_refresh

    state = {"round": 1}

    def flipper(req):
        # Refuses with the wrong code in round 1, answers correctly-ish in round 2: its score moves.
        return "REFUSE_OTHER" if state["round"] == 1 else "REFUSE_INFO_MISSING"

    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "flip": flipper,
            "steady": lambda req: "REFUSE_INFO_MISSING",
            "judge": judge_by_reference,
        }
    )
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 2"
        for n in ["gen-a", "ver-a", "flip", "steady", "judge"]
    )
    config = tmp_path / "refresh.yaml"
    config.write_text(f"""
models:
{models}
cache:  # the target changes its mind between rounds: a refresh round asks the targets again (cache scope `round`)
  path: {json.dumps(str(tmp_path / "calls.sqlite"))}
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  base_sample: 3
  strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM, P-MissingInfo/HIGH]
evaluation:
  targets: [flip, steady]
  judge: judge
  bootstrap: 100
""")
    first = run_refresh(str(config), str(tmp_path / "rounds"), seed=11)
    state["round"] = 2
    crashed = tmp_path / "rounds" / "round-20000101T000000Z-s99"  # a round that failed: listed, not left out
    crashed.mkdir()
    (crashed / "round.json").write_text(
        json.dumps(
            {
                "round_id": crashed.name,
                "seed": 99,
                "flow_run_id": None,
                "started_at": "2000-01-01T00:00:00+00:00",
                "status": "failed",
            }
        )
    )
    second = run_refresh(str(config), str(tmp_path / "rounds"), seed=22)
    assert first.round != second.round and first.round.endswith("-s11")
    rounds = sorted(p.name for p in (tmp_path / "rounds").iterdir())
    assert len(rounds) == 3
    assert second.rounds == 2 and second.incomplete_rounds == [crashed.name]
    # Only flip changed (its refusals went from the wrong code to the right one); steady did not move.
    assert {flag.model for flag in second.flags} == {"flip"}
    (crs,) = [flag for flag in second.flags if flag.metric == "calibrated_refusal_score"]
    assert crs.direction == "up" and crs.better is True and crs.adjusted_p_value <= 0.05
    trend = pd.read_parquet(tmp_path / "rounds" / second.round / "round_trend.parquet")
    assert list(trend[trend["model"] == "flip"]["calibrated_refusal_score"]) == [0.0, 0.5]
    document = json.loads((tmp_path / "rounds" / second.round / "trend.json").read_text())
    assert document["fdr"] == 0.05 and document["comparisons"] > 0
    assert document["round_error"]["rounds"] == 52 and document["round_error"]["epsilon"] > 0.05  # 9 items: loose
    assert [r["round"] for r in document["incomplete_rounds"]] == [crashed.name]
    report = tmp_path / "rounds" / second.round / "report.html"
    assert "Trend across rounds" in report.read_text()
    look_at_the_refresh_run(second.round)
    look_at_the_trend_section(report, tmp_path / "trend.png", crashed.name)


def look_at_the_refresh_run(round_id: str) -> None:
    """The refresh run's own page: summary, readable trend table, trend plot, report link, stage lines."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.client.schemas.sorting import ArtifactSort
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        (summary,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["refresh-summary"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
        run_id = summary.flow_run_id
        artifacts = {
            a.key: a
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
        }
        logs = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))]
    assert {"refresh-summary", "refresh-trend", "refresh-report"} <= set(artifacts)
    assert "refresh-trend-plot" not in artifacts  # the report's trend chart draws in a browser, not in Prefect
    text = summary.data
    assert f"# Refresh round {round_id}" in text
    for heading in (
        "## Leaderboard",
        "## What changed since the last round",
        "## Items, calls and cost",
        "## Freshness",
        "## Incomplete rounds",
        "## Explore the items",
        "## Report",
    ):
        assert heading in text, heading
    (view,) = [line for line in text.splitlines() if line.startswith("refusalbench view ")]
    assert view.endswith(f"/rounds/{round_id}"), view
    leaderboard = text.split("## Leaderboard")[1].split("## What changed")[0]
    assert "| flip" in leaderboard and "| steady" in leaderboard
    assert "significant change(s)" in text and "flip: CRS 0.000 -> 0.500" in text
    assert "HTTP calls" in text and "benchmark items: " in text and "round-20000101T000000Z-s99" in text
    assert "items seen in earlier rounds" in text or "not recorded" in text
    table = artifacts["refresh-trend"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert len(rows) == 4 and {"round", "model", "n", "CRS"} <= set(rows[0])
    assert all(len(row["CRS"].split(" ")[0]) == 5 for row in rows)  # 0.500: rounded, with its [interval]
    assert "report.html" in artifacts["refresh-report"].data
    for line in (
        "stage main job (generate -> evaluate): started",
        "stage main job (generate -> evaluate): done in",
        "stage trend and report: done in",
    ):
        assert any(message.startswith(line) for message in logs), (line, logs)
    assert any(message.startswith("main job, generate stages: ") for message in logs), logs


def look_at_the_trend_section(report, shot, crashed: str) -> None:
    """The report's trend section in headless Chromium: the plot renders, the changes and incomplete rounds read."""
    from tests.browser import CHARTS_DRAWN, Browser

    script = """(() => {
      const section = Array.from(document.querySelectorAll('section'))
        .find(s => s.querySelector('h2') && s.querySelector('h2').innerText.trim() === 'Trend across rounds');
      if (!section) return null;
      const charts = Array.from(section.querySelectorAll('div.vl-chart'));
      return {images: charts.length, rendered: charts.filter(c => c.querySelector('svg, canvas')).length,
              text: section.innerText};
    })()"""
    with Browser() as browser:
        facts = browser.look(f"file://{report}", script=script, screenshot=shot, wait_for=CHARTS_DRAWN)
    assert facts is not None and facts["images"] == 1 and facts["rendered"] == 1
    assert "significant change(s) since the previous round" in facts["text"]
    assert "flip: CRS 0.000 -> 0.500" in facts["text"] and "steady" in facts["text"]
    assert f"{crashed}: round.json says failed" in facts["text"]
