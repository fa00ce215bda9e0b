"""`refusalbench plan` through the real command line: every shipped config plans, a stage with
nothing to do exits 2 naming it, missing keys are warned about, and KnowOrNot is planned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from refusalbench.tasks.core.config import packaged_config
from refusalbench.tasks.knowornot.stages.retrieval import RETRIEVERS
from refusalbench.tasks.refusalbench.basesets import import_garage, import_kilt_nq, write_base_set
from tests.cli.test_cli_data import GARAGE, KS, NQ, no_credentials

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    p.name for p in (ROOT / "configs").glob("*.yaml") if p.name != "models.yaml"
)  # models.yaml: the registry


def cli(*args: object, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def policybench_files(folder: Path) -> None:
    """Stand-ins for the four released PolicyBench files, in their layout (three questions each)."""
    folder.mkdir(parents=True)
    for name in ("BTT_QA.json", "CPF_filtered_qa.json", "ICA_filtered_qa.json", "medishield_QA.json"):
        questions = [
            {"question": f"Q{i} of {name}?", "answer": f"A{i}.", "identifier": f"{name}_{i}"} for i in range(3)
        ]
        (folder / name).write_text(json.dumps({"knowledge_base_identifier": name, "questions": questions}))


@pytest.fixture(scope="module")
def working_folder(tmp_path_factory) -> Path:
    """A working folder holding the data the paper configs name (written by `data import` in real use)."""
    folder = tmp_path_factory.mktemp("work")
    data = folder / "data"
    data.mkdir()
    write_base_set(import_garage(GARAGE), data / "garage-base.jsonl")
    write_base_set(import_kilt_nq(NQ, KS), data / "nq-base.jsonl")
    policybench_files(data / "policybench")
    return folder


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_plans(working_folder, name):
    done = cli("plan", "--config", packaged_config(name), env=no_credentials(), cwd=working_folder)
    assert done.returncode == 0, done.stderr
    assert "\ntotal " in done.stdout and "(stage)" in done.stdout


def test_the_stage_with_nothing_to_do_is_named_and_exits_2(tmp_path):
    rules_only = tmp_path / "rules.yaml"
    rules_only.write_text(
        f"include: {packaged_config('demo.yaml')}\n"
        f"generation:\n  base_set: {ROOT / 'data' / 'sample_single.jsonl'}\n  generators: [rules]\n"
        "  strata: [P-Ambiguity/LOW]\n"
    )
    done = cli("plan", "--config", rules_only)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"{rules_only}: generation.generators: generation: 0 benchmark items: the generators make no candidate "
        "(the rule generator realises none of the 2 assignments and no LLM generator is named)"
    ]
    no_targets = tmp_path / "targets.yaml"
    no_targets.write_text(f"include: {packaged_config('demo.yaml')}\nevaluation:\n  targets: []\n")
    done = cli("plan", "--config", no_targets)
    assert done.returncode == 2 and "evaluation.targets" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    empty = tmp_path / "qa.jsonl"
    empty.write_text("")
    kon = tmp_path / "kon.yaml"
    kon.write_text(
        f"include: {packaged_config('knowornot-demo.yaml')}\nknowornot:\n  documents: null\n  qa_pairs: {empty}\n"
    )
    done = cli("plan", "--config", kon)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_missing_keys_are_listed_once_each_and_plan_still_exits_0(working_folder):
    done = cli(
        "plan", "--config", packaged_config("paper-nq.yaml"), "--all-models", env=no_credentials(), cwd=working_folder
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning: missing credentials: ")]
    assert "warning: missing credentials: OPENAI_API_KEY is not set, needed by gpt-4.1, gpt-4o, o4-mini" in warnings
    bedrock = [w for w in warnings if "AWS_ACCESS_KEY_ID" in w]
    assert len(bedrock) == 1 and "claude-4-sonnet" in bedrock[0] and "nova-pro" in bedrock[0]
    assert any("GOOGLE_APPLICATION_CREDENTIALS" in w and w.endswith("gemini-2.5-pro") for w in warnings)
    assert len(warnings) == len({w.split(", needed by")[0] for w in warnings})  # one line per variable
    assert not any("qwen1.5" in w or "olmo" in w for w in warnings)  # self-hosted servers without auth


def test_knowornot_demo_is_planned_with_the_calls_a_run_makes():
    done = cli("plan", "--config", packaged_config("knowornot-demo.yaml"), "--format", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["method"] == "knowornot"
    assert list(plan["stages"]) == ["facts", "qa", "filter", "hyde", "answer", "evaluate"]
    stages = {name: stage["by_model"] for name, stage in plan["stages"].items()}
    # The config, counted by hand: 3 sentences (max_sentences) -> one extraction call each; 2 questions
    # (max_questions) x 4 retrieval strategies x 1 prompt per target; one HyDE call per question (hyde_rag);
    # abstention for every answer, factuality and cites_context (answered only) at most for every answer.
    helper = "qwen2.5-coder-0.5b-instruct"
    assert stages["facts"] == {helper: 3}
    assert stages["hyde"] == {helper: 2} and "hyde_rag" in RETRIEVERS
    assert stages["answer"] == {"smollm2-135m-instruct": 8, helper: 8}
    assert stages["evaluate"] == {helper: 3 * 16}
    assert stages["filter"] == {} and plan["stages"]["qa"]["estimated"]
    assert plan["total"]["calls"] == sum(s["calls"] for s in plan["stages"].values())
    assert all(m["free"] for s in plan["stages"].values() for m in s["models"].values())
    table = cli("plan", "--config", packaged_config("knowornot-demo.yaml"))
    assert table.returncode == 0 and table.stdout.startswith("KnowOrNot plan for ")
    assert "local, free" in table.stdout and "2 questions x 4 retrieval strategies x 1 system prompt" in table.stdout


def test_plan_as_csv_has_a_row_per_stage_and_model_and_the_runs_totals():
    import csv
    import io

    config = packaged_config("knowornot-demo.yaml")
    document = json.loads(cli("plan", "--config", config, "--format", "json").stdout)
    done = cli("plan", "--config", config, "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    per_model = {(r["stage"], r["model"]): r for r in rows if r["model"]}
    expected = {(stage, model) for stage, planned in document["stages"].items() for model in planned["models"]}
    assert set(per_model) == expected
    answer = per_model[("answer", "smollm2-135m-instruct")]
    assert int(answer["calls"]) == document["stages"]["answer"]["models"]["smollm2-135m-instruct"]["calls"]
    assert answer["free"] == "true" and answer["latency_source"]
    (total,) = [r for r in rows if r["stage"] == "total"]
    assert int(total["calls"]) == document["total"]["calls"] and total["model"] == ""
    assert [r["stage"] for r in rows if not r["model"] and r["stage"] != "total"] == list(document["stages"])
