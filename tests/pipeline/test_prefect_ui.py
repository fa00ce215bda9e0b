"""The Prefect UI as a person sees it: a real ``prefect server``, a scripted main run from the
command line, then the flow-run pages, their Logs and Task Runs tabs and the artifacts in
headless Chromium (slow). A quick test checks the mechanism on Prefect's test harness: the
run's story reaches the API at INFO while Prefect logs at WARNING, and not the terminal.

The flow runs through the CLI with Prefect's API pointed at the server (server mode) and the
CLI's own logging defaults, as a user runs it. The API finds the run and artifact ids; what
is asserted about the UI comes from the rendered pages. The terminal must not gain the lines
the Logs tab shows. Set ``REFUSALBENCH_SCREENSHOTS=DIR`` to keep the screenshots.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from refusalbench.tasks.pipeline.fanout import shard_run_name
from refusalbench.tasks.pipeline.ui import story
from tests.browser import Browser
from tests.deployments.test_deployments import running_prefect_server
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, intensity_of, judge_by_reference, run_config, verifier_reply

MODELS = ["gen-a", "gen-b", "ver-a", "ver-b", "answerer", "cautious", "judge"]

# Visible text of the page (the UI renders logs and tables as text), and the rows of its tables.
TEXT = "document.body.innerText"
TABLE_ROWS = "({rows: document.querySelectorAll('table tr').length, text: document.body.innerText})"


def has_text(*needles: str) -> str:
    """A JS condition: the page shows every one of ``needles``."""
    return " && ".join(f"{TEXT}.includes({json.dumps(n)})" for n in needles)


def open_tab(name: str, showing: str) -> str:
    """A JS script: click the page's tab ``name``, wait until it shows ``showing`` and no log line, return the text."""
    return f"""(async () => {{
  const tab = Array.from(document.querySelectorAll('[role=tab], .p-tab, button, a'))
    .find(e => e.innerText.trim() === {json.dumps(name)});
  if (!tab) return 'no tab ' + {json.dumps(name)};
  tab.click();
  const shown = () => {TEXT}.includes({json.dumps(showing)}) && !{TEXT}.includes('refusalbench.story');
  for (let i = 0; i < 150 && !shown(); i++) await new Promise(r => setTimeout(r, 200));
  return {TEXT};
}})()"""


def write_config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    return run_config(
        tmp_path,
        url,
        MODELS,
        """
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [ver-a, ver-b]
  seed: 7
  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]
  shard_size: 4
evaluation:
  targets: [answerer, cautious]
  judge: judge
  bootstrap: 50
  shard_size: 5
""",
        max_attempts=3,
    )


def script(fake_llm) -> None:
    failed_once = threading.Event()

    def answerer(request: dict) -> str:
        if not failed_once.is_set():  # the first answer fails once (a 500), and the gateway retries it
            failed_once.set()
            raise RuntimeError("a passing outage")
        return "The answer is Perturbed context."

    fake_llm.responder = by_model(
        {
            "gen-a": lambda r: generator_reply(r, "a"),
            "gen-b": lambda r: generator_reply(r, "b"),
            "ver-a": lambda r: verifier_reply("PASS"),
            "ver-b": lambda r: verifier_reply(
                "FAIL" if intensity_of(r) == "HIGH" and "b?" in json.dumps(r) else "PASS"
            ),
            "answerer": answerer,
            "cautious": lambda r: "REFUSE_AMBIGUOUS",
            "judge": judge_by_reference,
        }
    )


def api_post(api_url: str, path: str, body: dict) -> list[dict]:
    reply = httpx.post(f"{api_url}{path}", json=body, timeout=10)
    reply.raise_for_status()
    return reply.json()


def flow_run_of(api_url: str, flow_name: str) -> dict:
    (run,) = api_post(api_url, "/flow_runs/filter", {"flows": {"name": {"any_": [flow_name]}}})
    return run


@pytest.mark.usefixtures("prefect_harness")
def test_the_story_reaches_the_runs_log_at_info_and_not_the_terminal(capfd):
    """The tests' Prefect logs at WARNING, as the CLI does: the story's INFO lines still reach the API."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.context import FlowRunContext
    from prefect.logging.handlers import APILogHandler

    @flow
    def told() -> Any:
        story("stage score: done in 0.1 s")
        return FlowRunContext.get().flow_run.id

    run_id = told()
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    assert [log.message for log in logs if log.name == "refusalbench.story"] == ["stage score: done in 0.1 s"]
    assert "stage score" not in "".join(capfd.readouterr())
    assert shard_run_name("respond-shard", "answerer", 2, 8) == "respond | answerer | shard 3/8"


@pytest.mark.slow
def test_the_prefect_ui_shows_the_runs_story(tmp_path, fake_llm):
    script(fake_llm)
    config = write_config(tmp_path, fake_llm.url)
    out = tmp_path / "run"
    keep = os.environ.get("REFUSALBENCH_SCREENSHOTS")
    with running_prefect_server(tmp_path, ui=True, ready_s=180) as (api_url, env):
        ui = api_url.removesuffix("/api")
        # The CLI's own logging defaults (a quiet terminal), as a user runs it.
        cli_env = {k: v for k, v in env.items() if k != "PREFECT_LOGGING_LEVEL"}
        done = subprocess.run(
            [sys.executable, "-m", "refusalbench.flows.cli", "run", "--config", str(config), "--out", str(out)],
            env=cli_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        # The terminal keeps what it showed before: the story goes to the UI only.
        assert "stage " not in done.stderr and "shard 1/" not in done.stderr, done.stderr[-3000:]

        generate = flow_run_of(api_url, "refusalbench-generate")
        evaluate = flow_run_of(api_url, "refusalbench-evaluate")
        task_names = {
            t["name"] for t in api_post(api_url, "/task_runs/filter", {"flow_runs": {"id": {"any_": [evaluate["id"]]}}})
        }
        assert {"respond | answerer | shard 1/2", "judge | cautious | shard 2/2"} <= task_names, task_names
        artifacts = api_post(
            api_url, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [generate["id"], evaluate["id"]]}}}
        )
        by_key = {a["key"]: a for a in artifacts if a.get("key")}
        assert {
            "leaderboard",
            "report",
            "gv-pass-rate-matrix",
            "gv-acceptance-funnel",
            "answerer-responds-progress",
        } <= set(by_key), sorted(by_key)

        with Browser() as browser:

            def look(path: str, *needles: str, shot: str, script: str = TEXT) -> Any:
                return browser.look(
                    f"{ui}{path}",
                    script=script,
                    wait_for=has_text(*needles),
                    settle_s=1.0,
                    timeout_s=60,
                    screenshot=Path(keep, shot) if keep else None,
                )

            # The evaluation run's Logs tab tells its story: stages, shard summaries, the report.
            logs = look(
                f"/runs/flow-run/{evaluate['id']}",
                "stage score: done",
                "report: file://",
                shot="prefect-evaluate-logs.png",
            )
            assert "This run didn't generate logs" not in logs
            assert "respond: 4 task(s)" in logs and "stage judge: done" in logs
            # The answerer's first call failed once: its shard's summary says it was retried.
            assert re.search(
                r"respond \| answerer \| shard [12]/2: \d+ rows, \d+ calls[^,]*, [1-9]\d* retried, "
                r"0 failed",
                logs,
            ), logs
            assert "model calls: answerer" in logs and "evaluate run " in logs
            # The generation run's: every stage with its counts.
            logs = look(
                f"/runs/flow-run/{generate['id']}",
                "stage verify: done",
                "stage analyse: done",
                shot="prefect-generate-logs.png",
            )
            assert "candidates=12" in logs and "verifications=24" in logs and "sampled=" in logs
            # Task runs are named for people: stage, model, shard i/n (the Task Runs tab, clicked).
            tasks = look(
                f"/runs/flow-run/{evaluate['id']}",
                "Task Runs",
                shot="prefect-evaluate-tasks.png",
                script=open_tab("Task Runs", "judge | cautious | shard 2/2"),
            )
            assert "respond | answerer | shard 1/2" in tasks and "judge | cautious | shard 2/2" in tasks, tasks
            assert "_work/" not in tasks
            # The artifacts page lists the leaderboard, the G-V tables and the report link ...
            listed = look(
                "/artifacts",
                "leaderboard",
                "gv-pass-rate-matrix",
                "gv-acceptance-funnel",
                "report",
                shot="prefect-artifacts.png",
            )
            assert "gv-summary" in listed and "answerer-responds-progress" in listed
            # ... and each renders: the leaderboard's models, the G-V tables' generators and stages.
            for key, needles in {
                "leaderboard": ("answerer", "cautious"),
                "gv-pass-rate-matrix": ("gen-a", "ver-b"),
                "gv-acceptance-funnel": ("attempted", "sampled"),
            }.items():
                page = look(
                    f"/artifacts/artifact/{by_key[key]['id']}", *needles, shot=f"prefect-{key}.png", script=TABLE_ROWS
                )
                assert page["rows"] >= 2, (key, page)
            # The report link points at the run's report.html.
            links = look(
                f"/artifacts/artifact/{by_key['report']['id']}",
                "report.html",
                shot="prefect-report-link.png",
                script="Array.from(document.querySelectorAll('a')).map(a => a.href)",
            )
            assert (out / "report.html").resolve().as_uri() in links, links
