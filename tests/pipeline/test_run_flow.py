"""The main job (``refusalbench run``) and refresh rounds: generate then evaluate in one process."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.cli.test_bad_input import run_in_process
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply

pytestmark = pytest.mark.usefixtures("prefect_harness")

GENERATING = ["gen-a", "ver-a"]
EVALUATING = ["answerer", "judge"]


def write_config(tmp_path, url, *, judge_fields=None):
    """A run of every model on the scripted server; ``judge_fields`` are added to the judge's entry."""
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    entries = {
        name: {"model": f"openai/{name}", "api_base": url, "max_attempts": 2} for name in GENERATING + EVALUATING
    }
    entries["judge"].update(judge_fields or {})
    config = tmp_path / "run.yaml"
    config.write_text(
        "models:\n"
        + "".join(f"  {name}: {json.dumps(entry)}\n" for name, entry in entries.items())
        + f"cache:\n  path: {json.dumps(str(tmp_path / 'calls.sqlite'))}\n"
        + """
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH]
evaluation:
  targets: [answerer]
  judge: judge
  bootstrap: 50
"""
    )
    return config


def script(fake_llm):
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "answerer": lambda req: "It is 1932.",
            "judge": judge_by_reference,
        }
    )


def http_calls(manifest: dict, model: str) -> int:
    return int(manifest["calls"].get(model, {}).get("http_calls", 0))


def test_each_manifest_counts_only_its_own_calls(tmp_path, fake_llm):
    """The gateway's counters live as long as the process: the evaluation run that follows a
    generation run in the same process must not count the generation's calls again."""
    from refusalbench.flows.launch import run_main

    script(fake_llm)
    out = tmp_path / "run"
    run_main(str(write_config(tmp_path, fake_llm.url)), str(out))
    generation = json.loads((out / "generation_manifest.json").read_text())
    evaluation = json.loads((out / "manifest.json").read_text())
    assert (generation["kind"], evaluation["kind"]) == ("generate", "evaluate")
    received = Counter(call["model"] for call in fake_llm.calls)
    assert set(received) == set(GENERATING + EVALUATING)
    assert set(generation["calls"]) == set(GENERATING) and set(evaluation["calls"]) == set(EVALUATING)
    for model, count in received.items():
        assert http_calls(generation, model) + http_calls(evaluation, model) == count, model
    assert sum(http_calls(m, model) for m in (generation, evaluation) for model in received) == len(fake_llm.calls)


@pytest.mark.parametrize("command", ["run", "refresh"])
def test_a_judge_that_cannot_run_stops_the_job_before_any_call(command, tmp_path, fake_llm, monkeypatch, capsys):
    """Every model of both stages is checked first: a missing judge key is not found after the
    whole generation budget is spent."""
    monkeypatch.delenv("REFUSALBENCH_TEST_JUDGE_KEY", raising=False)
    script(fake_llm)
    config = write_config(tmp_path, fake_llm.url, judge_fields={"api_key_env": "REFUSALBENCH_TEST_JUDGE_KEY"})
    out = tmp_path / "out"
    code, stdout, stderr = run_in_process([command, "--config", str(config), "--out", str(out)], capsys)
    assert code == 2, stderr
    assert fake_llm.calls == []
    assert not out.exists()
    (line,) = stderr.splitlines()
    assert line.startswith(f"{config}: models: cannot run judge: ") and "REFUSALBENCH_TEST_JUDGE_KEY is not set" in line


CHART = 'class="vl-chart"'


def test_the_run_shows_the_generation_charts_in_its_final_report(tmp_path, fake_llm):
    """``run`` writes no generation-only report: the final report shows the generation charts, built from
    gv_analysis.json when the report is written (nothing drawn aside, nothing stored beside the run's files)."""
    from refusalbench.flows.launch import run_main
    from refusalbench.tasks.refusalbench.report.generation_figures import generation_figures_html

    script(fake_llm)
    out = tmp_path / "run"
    run_main(str(write_config(tmp_path, fake_llm.url)), str(out))
    generation = json.loads((out / "generation_manifest.json").read_text())
    assert "analyse" in generation["timings_s"] and "report" not in generation["timings_s"]
    assert "report.html" not in generation["artifacts"]
    assert not list(out.glob("_work/generation-figures-*"))
    drawn_here = generation_figures_html(json.loads((out / "gv_analysis.json").read_text()))
    assert drawn_here.count(CHART) >= 4
    page = (out / "report.html").read_text()
    assert "(generation only" not in page and "Leaderboard" in page
    assert drawn_here in page.split("<h2>Benchmark generation</h2>")[1]


def test_a_failed_evaluation_leaves_the_generation_report(tmp_path, fake_llm, monkeypatch):
    """The run skipped the generation-only report; an evaluation that fails before its own report leaves
    that one instead, showing the generation's manifest (not the failed evaluation's)."""
    from refusalbench.flows import evaluation
    from refusalbench.flows.launch import run_main

    def broken(*args, **kwargs):
        raise RuntimeError("scoring broke")

    monkeypatch.setattr(evaluation, "score_judgments", broken)
    script(fake_llm)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="scoring broke"):
        run_main(str(write_config(tmp_path, fake_llm.url)), str(out))
    assert json.loads((out / "manifest.json").read_text())["status"] == "failed"
    page = (out / "report.html").read_text()
    assert "<title>RefusalBench report (generation only)</title>" in page
    generation = json.loads((out / "generation_manifest.json").read_text())
    assert generation["run_id"] in page


def test_run_prints_the_leaderboard_and_its_flow_run_page_has_the_summary(tmp_path, fake_llm, capsys):
    """``run`` ends with the leaderboard and where to look; the page it names (the main job's own flow
    run, not only its evaluation's) carries the run's summary: the leaderboard, the viewer command, the report."""
    import re

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    script(fake_llm)
    out = tmp_path / "run"
    code, stdout, stderr = run_in_process(
        ["run", "--config", str(write_config(tmp_path, fake_llm.url)), "--out", str(out)], capsys
    )
    assert code == 0, stderr
    assert re.search(r"^1 +answerer +\d+\.\d%", stdout, re.M), stdout
    assert f"explore:   refusalbench view {out}" in stdout.splitlines()
    (run_id,) = re.findall(r"^Prefect: +http://\S+/runs/flow-run/([0-9a-f-]{36})$", stdout, re.M)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(run_id)
        artifacts = {
            a.key: a.data
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
        }
    assert flow_run.name and flow_run.parent_task_run_id is None
    summary = artifacts["run-summary"]
    assert "| 1 | answerer |" in summary and f"refusalbench view {out}" in summary
    assert f"({(out / 'report.html').as_uri()})" in summary
