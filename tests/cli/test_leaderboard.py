"""What ``evaluate`` prints when it ends: the leaderboard, where to look, and ``--fail-under``.

One evaluation of the scripted targets of tests/pipeline/test_evaluation_flow.py, run as a user
runs it in CI: a real process, its output piped, ``COLUMNS=80``, against the session's Prefect
API. The ``--fail-under`` runs go into the same run folder (every reply from the call cache),
their bars computed from that run's own metrics.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from tests.pipeline.test_evaluation_flow import ITEMS, oracle, write_config
from tests.scripted import by_model, judge_by_reference

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["refuser", "answerer", "oracle"]
FLOW_RUN = re.compile(r"^Prefect: +(http://\S+/runs/flow-run/([0-9a-f-]{36}))$", re.M)


@pytest.fixture(scope="module")
def llm() -> Iterator[Any]:
    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

    with ScriptedLLMServer() as server:
        server.responder = by_model(
            {
                "refuser": lambda request: "I cannot answer: **REFUSE_MISSING**",
                "answerer": lambda request: "I believe it is something.",
                "oracle": oracle,
                "judge": judge_by_reference,
            }
        )
        yield server


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, llm, prefect_harness) -> dict[str, Any]:
    """``evaluate`` run once in a process of its own, its output piped, 80 columns."""
    from prefect.settings import PREFECT_API_URL

    folder = tmp_path_factory.mktemp("leaderboard")
    benchmark = ArtifactStore(folder / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    config = write_config(folder, llm.url, TARGETS)
    out = folder / "eval"
    env = {**os.environ, "COLUMNS": "80", "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    done = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "evaluate", "--config", str(config)]
        + ["--benchmark", benchmark, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((out / "metrics.json").read_text())
    argv = ["evaluate", "--config", str(config), "--benchmark", benchmark, "--out", str(out)]
    return {"stdout": done.stdout, "out": out, "metrics": document["models"], "argv": argv}


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    from refusalbench.flows.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_evaluate_prints_the_leaderboard_of_every_target_and_where_to_look(evaluated):
    lines = evaluated["stdout"].splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))
    assert all(label in " ".join(lines[header - 1 : header + 1]) for label in ("CRS", "FRR", "MRR", "Coverage"))
    rows = {line.split()[1]: line.split() for line in lines if re.match(r"^\d+ ", line)}
    assert set(rows) == set(TARGETS)
    # Ranked by CRS as metrics.json has it: the oracle 50%, the refuser 25%, the answerer 0%.
    metrics = evaluated["metrics"]
    assert [rows[t][0] for t in ("oracle", "refuser", "answerer")] == ["1", "2", "3"]
    for target in TARGETS:
        assert rows[target][2] == f"{100 * metrics[target]['calibrated_refusal_score']:.1f}%"
        assert rows[target][-1] == f"{100 * metrics[target]['coverage']:.1f}%"
    out = evaluated["out"]
    assert f"report:    {out / 'report.html'}" in lines
    assert f"explore:   refusalbench view {out}" in lines
    assert FLOW_RUN.search(evaluated["stdout"]), evaluated["stdout"]
    # A handful of base items: the intervals give way to their count, as in the report.
    assert "(n = 4)" in evaluated["stdout"] and "[" not in evaluated["stdout"].split("\n\n")[0], evaluated["stdout"]


def test_piped_at_80_columns_no_line_is_longer_and_no_model_id_is_cut(evaluated):
    # The table and its note; the paths and links under them are never broken (they are pasted).
    table = evaluated["stdout"].split("\n\n")[0].splitlines()
    assert len(table) >= 2 + 2 * len(TARGETS) and max(len(line) for line in table) <= 80
    for target in TARGETS:
        assert any(re.search(rf"(^|\s){target}(\s|$)", line) for line in table), target
    assert "\x1b[" not in evaluated["stdout"]  # piped: plain text


def test_the_flow_runs_summary_in_the_prefect_ui_has_the_leaderboard_and_the_view_command(evaluated):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    (found,) = FLOW_RUN.findall(evaluated["stdout"])
    with get_client(sync_client=True) as client:
        artifacts = {
            a.key: a
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[found[1]]))
            )
        }
    summary = artifacts["run-summary"].data
    out = evaluated["out"]
    for target in TARGETS:
        assert f"| {target} |" in summary, summary
    assert "| CRS |" in summary
    assert f"refusalbench view {out}" in summary
    assert f"]({(out / 'report.html').as_uri()})" in summary


def _crs(metrics: dict[str, Any]) -> list[float]:
    return [v["calibrated_refusal_score"] for v in metrics.values() if v["calibrated_refusal_score"] is not None]


def test_fail_under_exits_1_below_the_bar_and_0_at_or_above_it(evaluated, capsys):
    metrics = evaluated["metrics"]
    scores = _crs(metrics)
    high, low = max(scores) + 0.05, min(scores)

    code, out, err = run_in_process([*evaluated["argv"], "--fail-under", f"crs={high}"], capsys)
    assert code == 1, err
    for target in TARGETS:
        value = metrics[target]["calibrated_refusal_score"]
        assert f"fail: {target}: calibrated_refusal_score = {value:.4g}, below the bar {high:g}" in err
    assert "--fail-under: 3 bar(s) not met" in err
    assert all(target in out for target in TARGETS)  # the leaderboard is printed first

    # Lower is better for the false refusal rate: a bar fails when a target is above it.
    frr = {t: v["false_refusal_rate"] for t, v in metrics.items()}
    bar = (max(frr.values()) + min(frr.values())) / 2
    code, _, err = run_in_process(
        [*evaluated["argv"], "--fail-under", f"crs={low}", "--fail-under", f"frr={bar}"], capsys
    )
    above = sorted(t for t, v in frr.items() if v > bar)
    assert code == 1 and above, err
    assert sorted(re.findall(r"fail: (\w+): false_refusal_rate = \S+, above the bar", err)) == above
    assert "calibrated_refusal_score" not in err

    code, _, err = run_in_process([*evaluated["argv"], "--fail-under", f"crs={low}"], capsys)
    assert code == 0, err
    assert "fail:" not in err


def test_an_unknown_metric_exits_2_before_any_model_call_with_the_list(evaluated, llm, tmp_path, capsys):
    calls = len(llm.calls)
    argv = [*evaluated["argv"][:-1], str(tmp_path / "never"), "--fail-under", "crss=0.5"]
    code, _, err = run_in_process(argv, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "--fail-under" in line and "unknown metric 'crss'" in line and "did you mean 'crs'?" in line
    assert "calibrated_refusal_score" in line and "false_refusal_rate" in line and "answer_accuracy" in line
    assert len(llm.calls) == calls and not (tmp_path / "never").exists()

    code, _, err = run_in_process([*argv[:-1], "crs=70"], capsys)
    assert code == 2 and "write 0.7 or 70%" in err
