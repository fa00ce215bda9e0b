"""RefusalBench inside inspect_ai: an inspect eval of scripted targets, scored by ``refusalbench score``,
gives the same metrics as the project's own ``evaluate`` on the same replies (issue 18, part 2).

Real HTTP throughout: inspect's model API calls the scripted OpenAI-compatible server (targets and
judge), inspect writes real eval logs, and the CLI reads them back.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, judge_by_reference, last_user_text

inspect_ai = pytest.importorskip("inspect_ai", reason="the inspect extra: pip install -e '.[inspect]'")

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["refuser", "answerer", "oracle", "hedger"]


def _item_number(request) -> int:
    return int(re.search(r"What is item (\d+)\?", last_user_text(request)).group(1))


def hedger(request) -> str:
    """Refuses the even items, answers the odd ones, states a confidence; item 5 gets an empty reply."""
    number = _item_number(request)
    if number == 5:
        return ""  # a failed call on both paths: counted, left out of the metrics
    if number % 2 == 0:
        return "REFUSE_MISSING\nCONFIDENCE: UNCERTAIN"
    return f"{oracle(request)}\nCONFIDENCE: {'VERY_CONFIDENT' if number < 4 else 'SOMEWHAT_CONFIDENT'}"


RESPONDERS = {
    "refuser": lambda req: "I cannot answer: **REFUSE_MISSING**\nCONFIDENCE: CONFIDENT",
    "answerer": lambda req: "I believe it is something.\nCONFIDENCE: 0.7",
    "oracle": oracle,
    "hedger": hedger,
    "judge": judge_by_reference,
}


@pytest.fixture
def benchmark(tmp_path) -> str:
    return ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)


@pytest.fixture
def inspect_env(tmp_path, monkeypatch):
    """inspect's logs and its own files under tmp_path."""
    monkeypatch.setenv("INSPECT_LOG_DIR", str(tmp_path / "inspect-logs"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("INSPECT_DISPLAY", "none")
    return tmp_path / "inspect-logs"


def run_evaluate(tmp_path: Path, url: str, benchmark: str) -> Path:
    from refusalbench.flows.launch import run_evaluation

    models = "\n".join(f"  {n}:\n    model: openai/{n}\n    api_base: {url}\n    max_attempts: 2" for n in RESPONDERS)
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"models:\n{models}\ncache:\n  path: {tmp_path / 'calls.sqlite'}\nevaluation:\n"
        f"  targets: [{', '.join(TARGETS)}]\n  judge: judge\n  confidence: true\n  bootstrap: 200\n"
    )
    out = tmp_path / "evaluate"
    run_evaluation(str(config), benchmark, str(out))
    return out


def cli(*argv: str, capsys) -> tuple[int, str, str]:
    from refusalbench.flows.cli import main

    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def openai_provider_usable() -> bool:
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("openai")) >= Version("3.4.0")


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("provider", ["refusalbench/openai", "openai"])
def test_inspect_run_scores_like_evaluate(tmp_path, fake_llm, benchmark, inspect_env, capsys, monkeypatch, provider):
    if provider == "openai" and not openai_provider_usable():
        pytest.skip(
            "inspect's openai/ provider needs openai>=3.4; litellm==1.100.0 pins openai<3 "
            "(the refusalbench/openai/ provider stands in)"
        )
    from inspect_ai import eval as inspect_eval

    from refusalbench.tasks.integrations.inspect.task import refusalbench

    fake_llm.responder = by_model(RESPONDERS)
    evaluated = run_evaluate(tmp_path, fake_llm.url, benchmark)
    evaluate_calls = len(fake_llm.calls)

    monkeypatch.setenv("OPENAI_API_KEY", "dummy-key")  # read by inspect's openai/ provider only
    task = refusalbench(benchmark=benchmark, judge=f"{provider}/judge", judge_base_url=fake_llm.url, confidence=True)
    logs = inspect_eval(
        task, model=[f"{provider}/{t}" for t in TARGETS], model_base_url=fake_llm.url, display="none", max_retries=2
    )
    assert [log.status for log in logs] == ["success"] * len(TARGETS)
    log_files = sorted(inspect_env.glob("*.eval"))
    assert len(log_files) == len(TARGETS)
    # Same requests as evaluate: 4 targets x 10 items, plus the judge classifying every reply that is not
    # only a refusal code (decision: judge): refuser 10 (its code comes with prose), answerer 10, oracle 10,
    # hedger 4 (its even items are bare codes); the empty reply is not re-asked (inspect keeps it as it is).
    inspect_calls = fake_llm.calls[evaluate_calls:]
    assert len(inspect_calls) == 40 + 34
    assert all(
        c["response_format"]["json_schema"]["name"] in ("JudgeSingleOutput", "JudgeMultiOutput", "JudgeDecisionOutput")
        for c in inspect_calls
        if c["model"] == "judge"
    )

    out = tmp_path / "from-inspect"
    code, stdout, stderr = cli("score", *map(str, log_files), "--out", str(out), "--bootstrap", "200", capsys=capsys)
    assert code == 0, stderr
    assert f"note: {provider}/hedger: 1 sample(s) left out" in stderr
    assert (out / "report.html").exists() and f"{provider}/oracle" in (out / "report.html").read_text()

    # The done-criterion: the same metrics, model by model.
    ours = json.loads((evaluated / "metrics.json").read_text())["models"]
    theirs = json.loads((out / "metrics.json").read_text())["models"]
    assert set(theirs) == {f"{provider}/{t}" for t in TARGETS}
    for target in TARGETS:
        assert theirs[f"{provider}/{target}"] == pytest.approx(ours[target], nan_ok=True), target
    assert ours["hedger"]["ece"] is not None and ours["refuser"]["category_accuracy"] == pytest.approx(0.5)

    # Stronger: the judged-responses frames are the same rows (so every table, interval and figure is too).
    # evaluate's main replies are never asked for a confidence: its confidences are its calibration
    # pass's (the same replies here), which inspect's single confidence-asking pass states.
    renamed = pd.read_parquet(evaluated / "judged.parquet").assign(
        model=lambda f: f["model"].map(lambda m: f"{provider}/{m}")
    )
    assert renamed["confidence"].isna().all()
    calibration = pd.read_parquet(evaluated / "calibration_judgments.parquet").set_index(["model", "item_id"])
    renamed["confidence"] = [
        calibration["confidence"].get((m.split("/")[-1], i)) for m, i in zip(renamed["model"], renamed["item_id"])
    ]
    from_logs = pd.read_parquet(out / "judged.parquet")
    key = ["model", "item_id"]
    pd.testing.assert_frame_equal(
        from_logs.sort_values(key).reset_index(drop=True),
        renamed[from_logs.columns].sort_values(key).reset_index(drop=True),
        check_dtype=False,
    )
    # ... and a log folder is read the same way as its files.
    code, _, stderr = cli(
        "score", str(inspect_env), "--out", str(tmp_path / "from-folder"), "--bootstrap", "200", capsys=capsys
    )
    assert code == 0, stderr
    from_folder = json.loads((tmp_path / "from-folder" / "metrics.json").read_text())["models"]
    assert from_folder.keys() == theirs.keys()
    assert all(from_folder[m] == pytest.approx(theirs[m], nan_ok=True) for m in theirs)


def test_inspect_cli_finds_the_packaged_task(tmp_path, fake_llm, benchmark):
    """`inspect eval refusalbench/refusalbench` (the entry point) with the judge as a task parameter; a JSON log."""
    fake_llm.responder = by_model(RESPONDERS)
    env = dict(os.environ, REFUSALBENCH_BASE_URL=fake_llm.url, XDG_DATA_HOME=str(tmp_path / "xdg-data"))
    inspect_cli = Path(sys.executable).with_name("inspect")
    result = subprocess.run(
        [
            str(inspect_cli),
            "eval",
            "refusalbench/refusalbench",
            "-T",
            f"benchmark={benchmark}",
            "-T",
            "judge=refusalbench/openai/judge",
            "--model",
            "refusalbench/openai/oracle",
            "--log-dir",
            str(tmp_path / "logs"),
            "--log-format",
            "json",
            "--display",
            "none",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (log,) = (tmp_path / "logs").glob("*.json")
    out = tmp_path / "scored"
    scored = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "score", str(log), "--out", str(out), "--bootstrap", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert scored.returncode == 0, scored.stderr
    metrics = json.loads((out / "metrics.json").read_text())["models"]["refusalbench/openai/oracle"]
    assert metrics["answer_accuracy"] == 1.0 and metrics["missed_refusal_rate"] == 1.0


def test_bad_logs_are_one_line_exit_2(tmp_path, capsys):
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes

    garbage = tmp_path / "broken.eval"
    garbage.write_text("not a zip archive")
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{\n  "version": 2,\n  "status": "success",\n  "eval": {')
    (foreign,) = inspect_eval(
        Task(dataset=[Sample(input="Say hi", target="hi")], scorer=includes()),
        model="mockllm/model",
        log_dir=str(tmp_path / "foreign"),
        display="none",
    )
    judged = tmp_path / "judged.jsonl"
    judged.write_text('{"model": "m", "item_id": "a", "expected": "ANSWER_CORRECTLY", "decision": "ANSWER"}\n')
    cases = [
        ([garbage], f"{garbage}: -: not a readable inspect eval log"),
        ([truncated], f"{truncated}: -: not a readable inspect eval log"),
        ([Path(foreign.location)], f"{foreign.location}: metadata: sample 1 has no RefusalBench item in its metadata"),
        ([tmp_path / "empty-folder"], f"{tmp_path / 'empty-folder'}: -: no inspect eval logs"),
        ([garbage, judged], f"{judged}: -: not an inspect eval log"),
        ([judged, judged], f"{judged}: -: one judged-responses file at a time"),
    ]
    (tmp_path / "empty-folder").mkdir()
    # Earlier tests' garbage (e.g. LiteLLM's pending logging task of a closed event loop) is collected now, not
    # during a command below: its "Task was destroyed" log is no output of the command under test.
    gc.collect()
    capsys.readouterr()
    for files, expected in cases:
        code, stdout, stderr = cli("score", *map(str, files), "--out", str(tmp_path / "out"), capsys=capsys)
        assert code == 2, (files, stderr)
        assert stdout == "" and len(stderr.splitlines()) == 1 and stderr.startswith(expected), (expected, stderr)
        assert not (tmp_path / "out").exists()


def test_core_import_path_does_not_load_inspect():
    """Scoring, the CLI and reading logs (until a log is read) work without inspect_ai."""
    code = (
        "import sys; import refusalbench.tasks.refusalbench.scoring, refusalbench.tasks.refusalbench.report.run_outputs, refusalbench.flows.cli, "
        "refusalbench.tasks.integrations.inspect.logs, refusalbench.tasks.integrations.inspect.bridge; "
        "assert 'inspect_ai' not in sys.modules, 'inspect_ai imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
