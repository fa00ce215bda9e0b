"""Refresh rounds: fresh seeds, one folder per round, trend across rounds, significant changes, and what the
refresh run shows (summary, trend table and plot, report link, stage lines; the report's trend section in a browser).

The statistics of the trend are tested on simulated rounds and rounds the scoring code scored in
tests/refusalbench/test_trend.py."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from refusalbench.tasks.llm.scripted_server import last_user_text
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply

# Eight single-document base items: with three strata, 24 benchmark items a round (enough rows for a test).
BASE = [
    {"id": f"b{i}", "question": f"Which year is number {i}?", "answers": [str(1900 + i)],
     "context": f"Number {i} is the year {1900 + i}.", "domain": "history"}
    for i in range(8)
]  # fmt: skip


def digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    from refusalbench.flows.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def write_config(tmp_path, url: str, targets: list[str]):
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {url}\n    max_attempts: 2"
        for n in ["gen-a", "ver-a", *targets, "judge"]
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
  base_sample: 8
  strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM, P-MissingInfo/HIGH]
evaluation:
  targets: [{", ".join(targets)}]
  judge: judge
  bootstrap: 400
""")
    return config


@pytest.mark.usefixtures("prefect_harness")
def test_refresh_refuses_a_root_holding_a_round_of_a_newer_schema(tmp_path, fake_llm, capsys):
    from refusalbench.tasks.core import runfolder

    config = write_config(tmp_path, fake_llm.url, ["steady"])
    newer = tmp_path / "rounds" / "round-20260101T000000Z-s7"
    newer.mkdir(parents=True)
    (newer / "manifest.json").write_text(json.dumps({"schema_version": "99.0"}))
    code, err = run_cli(["refresh", "--config", str(config), "--out", str(tmp_path / "rounds")], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"schema_version: 99.0 is newer than this refusalbench reads ({runfolder.SCHEMA_VERSION})" in err
    assert [p.name for p in (tmp_path / "rounds").iterdir()] == [newer.name] and not fake_llm.calls


@pytest.mark.usefixtures("prefect_harness")
def test_two_rounds_trend_and_flag(tmp_path, fake_llm, capsys):
    from refusalbench.flows.launch import run_refresh

    state = {"round": 1}

    def item(req) -> int:
        return digest(last_user_text(req).split("Perturbed question ")[-1][:20])

    def flip(req):
        # Round 1: the wrong code on about three items in four (which ones depends on the item, so the
        # bootstrap sees the spread); round 2: the right code everywhere. Its score moves.
        return "REFUSE_OTHER" if state["round"] == 1 and item(req) % 4 else "REFUSE_INFO_MISSING"

    def constant(req):
        # The wrong code on every item, then the right one on every item: every resample of a round is the
        # same, its standard error 0, and no test can say how noisy the move is.
        return "REFUSE_OTHER" if state["round"] == 1 else "REFUSE_INFO_MISSING"

    def flaky(req):
        # flip's behaviour, but in round 2 the calls of about half the items fail: scored on the rest only.
        if state["round"] == 2 and item(req) % 2:
            raise RuntimeError("scripted outage")
        return flip(req)

    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, f"{digest(last_user_text(req)):08x}"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "flip": flip,
            "constant": constant,
            "flaky": flaky,
            "steady": lambda req: "REFUSE_INFO_MISSING",
            "judge": judge_by_reference,
        }
    )
    targets = ["flip", "constant", "flaky", "steady"]
    config = write_config(tmp_path, fake_llm.url, targets)
    root = tmp_path / "rounds"
    first = run_refresh(str(config), str(root), seed=11)
    assert first.incomplete == {}
    state["round"] = 2
    crashed = root / "round-20000101T000000Z-s99"  # a round that failed: listed, not left out
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
    # The second round through the CLI with --strict: flaky is incomplete, so the command exits 1 naming it.
    code, err = run_cli(["refresh", "--config", str(config), "--out", str(root), "--seed", "22", "--strict"], capsys)
    assert code == 1 and "--strict: 1 incomplete target(s): flaky (" in err, err
    (second,) = [p.name for p in root.iterdir() if p.name.endswith("-s22")]
    assert first.round != second and first.round.endswith("-s11")
    assert len(list(root.iterdir())) == 3
    assert json.loads((root / second / "round.json").read_text())["status"] == "complete"  # the round itself ran
    document = json.loads((root / second / "trend.json").read_text())
    assert len(document["rounds"]) == 2 and [r["round"] for r in document["incomplete_rounds"]] == [crashed.name]
    # Only flip changed; flaky (scored on part of its items) is not compared; constant's move has a standard
    # error of 0 and is not tested; steady did not move.
    assert {flag["model"] for flag in document["flags"]} == {"flip"}
    (crs,) = [flag for flag in document["flags"] if flag["metric"] == "calibrated_refusal_score"]
    assert crs["direction"] == "up" and crs["better"] is True and 0 < crs["adjusted_p_value"] <= 0.05
    assert crs["difference_interval"][0] > 0 and crs["difference_interval"][1] > crs["difference_interval"][0]
    assert [(m["model"], m["round"]) for m in document["not_compared"]] == [("flaky", second)]
    assert document["untested"] > 0 and document["fdr"] == 0.05 and document["comparisons"] > 0
    trend = pd.read_parquet(root / second / "round_trend.parquet").set_index(["model", "round"])
    flip_crs = trend.loc["flip", "calibrated_refusal_score"]
    assert flip_crs[first.round] < 0.4 and flip_crs[second] == 0.5
    assert trend.loc[("flip", first.round), "calibrated_refusal_score_se"] > 0  # the pipeline's own bootstrap
    assert (trend.loc["constant", "calibrated_refusal_score_se"] == 0).all()
    assert list(trend.loc["constant", "calibrated_refusal_score"]) == [0.0, 0.5]
    assert not trend.loc[("flaky", second), "complete"] and trend.loc[("flaky", first.round), "complete"]
    assert document["round_error"]["rounds"] == 52 and document["round_error"]["epsilon"] > 0.05  # 24 items: loose
    report = root / second / "report.html"
    assert "Trend across rounds" in report.read_text()
    look_at_the_refresh_run(second)
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
    assert "significant change(s)" in text and "flip: CRS 0." in text and "-> 0.500" in text
    assert "Incomplete in this round, not compared: flaky" in text
    assert "HTTP calls" in text and "benchmark items: " in text and "round-20000101T000000Z-s99" in text
    assert "items seen in earlier rounds" in text or "not recorded" in text
    table = artifacts["refresh-trend"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert len(rows) == 8 and {"round", "model", "n", "coverage", "CRS"} <= set(rows[0])
    assert any(row["model"] == "flaky" and row["coverage"].endswith("incomplete, not compared") for row in rows)
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
    assert "flip: CRS 0." in facts["text"] and "-> 0.500" in facts["text"] and "steady" in facts["text"]
    assert "incomplete, not compared" in facts["text"]
    assert f"{crashed}: round.json says failed" in facts["text"]
