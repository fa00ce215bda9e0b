"""The KnowOrNot paper's PolicyBench run (issue 27, items 6-7): `data import policybench`, then the shipped
``configs/paper-policybench.yaml`` as shipped, on scripted models, over exactly the 331 released questions.

The released files stay beside the checkout (../shared/reference/policybench, as in CI) and are never
copied into the repository: the test imports them into the folder the config reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from refusalbench.tasks.core.config import load_config, packaged_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.knowornot.stages.sources import POLICYBENCH_FILES
from tests.scripted import dry_run_responder, last_user_text, requested_schema

ROOT = Path(__file__).resolve().parents[2]
NO_KEY = "REFUSALBENCH_TEST_UNSET_KEY"  # the key the skipped targets want: never set
POLICYBENCH = ROOT.parent / "shared" / "reference" / "policybench"
needs_policybench = pytest.mark.skipif(
    not POLICYBENCH.is_dir(), reason="PolicyBench is not beside the checkout (../shared/reference/policybench)"
)


def cli(*args: object, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def abstaining_gpt(request: dict) -> str:
    """GPT-4.1 in every role: HyDE answers, a target that always abstains, an evaluator that sees it (so
    no factuality call is needed: the run stays at HyDE + answers + one verdict per answer)."""
    if requested_schema(request):
        return dry_run_responder(request)
    if "<abstained>" in last_user_text(request):
        return "The assistant declined. <abstained>yes</abstained>"
    return "The context does not say, so I cannot answer."


def test_a_bad_policybench_file_is_named_by_line_and_nothing_is_imported(tmp_path):
    source = tmp_path / "release"
    source.mkdir()
    for name in POLICYBENCH_FILES:
        (source / name).write_text(
            json.dumps(
                {
                    "knowledge_base_identifier": "x",
                    "questions": [{"question": "Q?", "answer": "A.", "identifier": f"{name}_0"}],
                },
                indent=2,
            )
        )
    (source / "BTT_QA.json").write_text(
        json.dumps(
            {
                "knowledge_base_identifier": "BTT",
                "questions": [
                    {"question": "Q?", "answer": "A.", "identifier": "BTT_0"},
                    {"question": "Q2?", "answer": " ", "identifier": "BTT_1"},
                ],
            },
            indent=2,
        )
    )
    (source / "medishield_QA.json").unlink()
    done = cli("data", "import", "policybench", source, "--out", tmp_path / "data" / "policybench")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{source / 'BTT_QA.json'}:9: questions[1].answer: must not be blank",
        f"{source / 'medishield_QA.json'}: -: file not found (the release has {', '.join(POLICYBENCH_FILES)})",
    ]
    assert not (tmp_path / "data").exists()


def test_the_shipped_config_says_which_import_to_run_when_the_files_are_missing(tmp_path, monkeypatch):
    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import check_knowornot_inputs

    monkeypatch.chdir(tmp_path)  # a fresh clone's working folder, without data/policybench
    with pytest.raises(InputError) as info:
        check_knowornot_inputs(load_config(packaged_config("paper-policybench.yaml")))
    assert str(info.value) == (
        "data/policybench/BTT_QA.json: -: file not found (beside the config, nor in the working "
        "folder): import the released PolicyBench files first: refusalbench data import "
        "policybench DIR --out data/policybench"
    )


@needs_policybench
@pytest.mark.slow  # ~3,000 scripted calls: HyDE for 331 questions, 1,324 answers, 1,324 verdicts
@pytest.mark.usefixtures("prefect_harness")
def test_the_shipped_config_evaluates_exactly_the_331_released_questions(tmp_path, fake_llm, monkeypatch):
    from refusalbench.flows.launch import run_knowornot

    done = cli("data", "import", "policybench", POLICYBENCH, "--out", "data/policybench", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "data/policybench: 331 questions in 4 files (BTT_QA.json 55, CPF_filtered_qa.json "
        "112, ICA_filtered_qa.json 135, medishield_QA.json 29)"
    )
    shipped = load_config(packaged_config("paper-policybench.yaml")).knowornot
    # The shipped config as shipped: only its models become scripted ones (no latency) and the embedder a
    # model-free one; bases, filters, retrieval, prompts, targets and k are the paper's. As for a user with
    # one provider's key, the targets without a key are skipped (the config's skip_unavailable): GPT-4.1,
    # the evaluator and extractor, answers too, so the run stays small enough for CI (331 x 2 x 2 answers).
    monkeypatch.delenv(NO_KEY, raising=False)
    served = {shipped.evaluator: None, **{name: NO_KEY for name in shipped.targets if name != shipped.evaluator}}
    entry = {"api_base": fake_llm.url, "max_concurrency": 32}
    registry = "".join(
        f"  {name}: {json.dumps({'model': f'openai/{name}', 'api_key_env': key, **entry})}\n"
        for name, key in served.items()
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"include: {packaged_config('paper-policybench.yaml')}\nmodels:\n{registry}"
        f"cache:\n  path: {json.dumps(str(tmp_path / 'calls.sqlite'))}\nknowornot:\n  embedder: hashing\n"
    )
    fake_llm.responder = abstaining_gpt
    out = tmp_path / "run"
    result = run_knowornot(str(config), str(out))

    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    assert set(inputs.target) == {shipped.evaluator}  # the others were skipped, as the config says
    per_base = inputs.groupby("knowledge_base").question_id.nunique()
    assert per_base.to_dict() == {"btt": 55, "cpf": 112, "ica": 135, "medishield": 29}
    cells = len(shipped.retrieval) * len(shipped.prompts)
    assert len(inputs) == result.experiments == 331 * cells and not inputs.ookb.any()
    # Released sets are used as they are: no filter runs again, each base says so.
    report = json.loads((out / "filter_report.json").read_text())
    assert report["n_input"] == report["n_kept"] == 331 and report["method"] == "none"
    assert {b["knowledge_base"]: (b["method"], b["n_kept"]) for b in report["by_knowledge_base"]} == {
        "btt": ("none", 55),
        "cpf": ("none", 112),
        "ica": ("none", 135),
        "medishield": ("none", 29),
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["qa_pairs_all"] == manifest["counts"]["qa_pairs"] == 331
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert len(metrics) == cells and set(metrics["n"]) == {331} and (metrics["abstention_rate"] == 1.0).all()
    assert len(pd.read_parquet(out / "results.parquet")) == 331 * cells
    assert "within each of 4 knowledge bases, 331 QA pairs in all" in (out / "report.html").read_text()
