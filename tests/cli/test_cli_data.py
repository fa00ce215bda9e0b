"""`data import` and `plan` through the real command line (issue 14, parts 1 and 5).

The importers read tiny self-written files in the published layouts (tests/fixtures: KILT's NQ
file and knowledge source, GaRAGe's JSON lines); what they write must pass `data validate`. The
paper's configs are planned offline on a stand-in base set imported from those fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from refusalbench.tasks.core.config import packaged_config
from refusalbench.tasks.refusalbench.basesets import import_garage, import_kilt_nq, load_base_set

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NQ = FIXTURES / "kilt" / "nq-sample-kilt.jsonl"
KS = FIXTURES / "kilt" / "knowledge-sample.jsonl"
GARAGE = FIXTURES / "garage_sample.jsonl"
STAGES = {"pretest", "generate", "verify", "respond", "judge"}
PAPER_GENERATORS = ["claude-4-sonnet", "deepseek-r1", "gpt-4o", "nova-pro"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def import_kilt(out: Path, *extra: str, questions: Path = NQ, knowledge: Path = KS) -> subprocess.CompletedProcess:
    return cli("data", "import", "kilt-nq", "--questions", questions, "--knowledge", knowledge, "--out", out, *extra)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ----------------------------------------------------------------- import


def test_kilt_nq_import_through_the_cli_passes_validation(tmp_path):
    out = tmp_path / "nq-base.jsonl"
    done = import_kilt(out, "--n", "4", "--seed", "3")
    assert done.returncode == 0, done.stderr
    stats: Counter[str] = Counter()
    expected = import_kilt_nq(NQ, KS, n=4, seed=3, stats=stats)
    # One summary line: what was written and why the rest was not.
    assert done.stdout.strip() == (
        f"{out}: 4 items (without a short answer {stats['no_short_answer']}, answer not in the cited passage "
        f"{stats['answer_not_in_passage']}, not sampled {stats['not_sampled']}, knowledge pages read 17, "
        f"cited pages used {stats['pages_kept']}, cited pages missing from the dump 1)"
    )
    assert done.stderr == ""  # no bar off a terminal
    assert cli("data", "validate", out).returncode == 0
    assert load_base_set(out) == expected
    assert leftovers(tmp_path) == []


def test_garage_import_through_the_cli_passes_validation(tmp_path):
    out = tmp_path / "garage-base.jsonl"
    done = cli("data", "import", "garage", GARAGE, "--out", out, "--seed", "1")
    assert done.returncode == 0, done.stderr
    expected = import_garage(GARAGE, seed=1)
    assert done.stdout.startswith(f"{out}: {len(expected)} items (")
    validated = cli("data", "validate", out)
    assert validated.returncode == 0, validated.stderr
    items = load_base_set(out)
    assert items == expected and all(i.variant == "multi" and len(i.passages) == 10 for i in items)


@pytest.mark.parametrize("which", ["knowledge", "questions", "garage"])
def test_a_malformed_line_is_one_line_naming_file_and_line_and_writes_nothing(tmp_path, which):
    source = {"knowledge": KS, "questions": NQ, "garage": GARAGE}[which]
    lines = source.read_text().splitlines(keepends=True)
    lines[5] = lines[5][: len(lines[5]) // 2] + "\n"  # cut off mid-way, as by an interrupted download
    broken = tmp_path / source.name
    broken.write_text("".join(lines))
    out = tmp_path / "out" / "base.jsonl"
    out.parent.mkdir()
    if which == "garage":
        done = cli("data", "import", "garage", broken, "--out", out)
    else:
        done = import_kilt(out, **{which: broken})
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"{broken}:6: -: not valid JSON")
    assert "Traceback" not in done.stderr
    assert list(out.parent.iterdir()) == []  # neither the base set nor a temporary file


def test_import_refuses_bad_arguments_before_reading(tmp_path):
    parquet = import_kilt(tmp_path / "base.parquet")
    assert parquet.returncode == 2
    assert (
        parquet.stderr.strip()
        == f"{tmp_path / 'base.parquet'}: --out: the base set is written as JSON lines: name it *.jsonl"
    )
    missing = import_kilt(tmp_path / "base.jsonl", knowledge=tmp_path / "kilt_knowledgesource.json")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"{tmp_path / 'kilt_knowledgesource.json'}: -: file not found"
    assert import_kilt(tmp_path / "base.jsonl", "--n", "0").returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_nothing_passing_is_an_error_not_an_empty_base_set(tmp_path):
    no_answers = tmp_path / "nq.jsonl"
    no_answers.write_text(json.dumps({"id": "q1", "input": "what is it", "output": [{"provenance": []}]}) + "\n")
    out = tmp_path / "base.jsonl"
    done = import_kilt(out, questions=no_answers)
    assert done.returncode == 2
    assert done.stderr.strip() == f"{no_answers}: -: no item passed the curation (without a short answer 1)"
    assert not out.exists()


# ----------------------------------------------------------------- plan


def paper_config(tmp_path: Path, name: str) -> Path:
    """The paper's config over a stand-in base set imported from the fixtures through the CLI."""
    base = tmp_path / "base.jsonl"
    if name == "paper-nq.yaml":
        done = import_kilt(base)
    else:
        done = cli("data", "import", "garage", GARAGE, "--out", base)
    assert done.returncode == 0, done.stderr
    config = tmp_path / name
    config.write_text(f"include: {packaged_config(name)}\ngeneration:\n  base_set: {base}\n")
    return config


def no_credentials() -> dict[str, str]:
    """The environment without any provider credential (and no ~/.aws/credentials)."""
    names = ("KEY", "TOKEN", "AWS_", "GOOGLE_", "VERTEX")
    env = {k: v for k, v in os.environ.items() if not any(part in k for part in names)}
    env["HOME"] = "/nonexistent"
    return env


def check_contract(plan: dict) -> None:
    """DESIGN.md §4: {"stages": {S: {"calls": N, "by_model": {M: N}}}, "total": {"calls", "cost_usd", "time_bound_s"}}."""
    assert set(plan["stages"]) <= STAGES
    for stage in plan["stages"].values():
        assert isinstance(stage["calls"], int) and stage["calls"] == sum(stage["by_model"].values())
        assert all(isinstance(m, str) and isinstance(n, int) for m, n in stage["by_model"].items())
    total = plan["total"]
    assert total["calls"] == sum(s["calls"] for s in plan["stages"].values())
    assert total["cost_usd"] is None or isinstance(total["cost_usd"], float)
    assert isinstance(total["time_bound_s"], (int, float)) and total["time_bound_s"] >= 0


@pytest.mark.parametrize("name", ["paper-nq.yaml", "paper-garage.yaml"])
def test_paper_configs_plan_offline(tmp_path, name):
    config = paper_config(tmp_path, name)
    items = len(load_base_set(tmp_path / "base.jsonl"))
    env = no_credentials()
    everything = cli("plan", "--config", config, "--format", "json", "--all-models", env=env)
    assert everything.returncode == 0, everything.stderr
    plan = json.loads(everything.stdout)
    check_contract(plan)
    assert list(plan["stages"]) == ["pretest", "generate", "verify", "respond", "judge"]
    assert plan["stages"]["generate"]["by_model"] == {m: items * 18 for m in PAPER_GENERATORS}
    assert plan["total"]["cost_usd"] is None  # the open-weight models have no price: unknown, not zero

    # As the run would: skip_unavailable leaves out every model without credentials, and says so.
    keyless = cli("plan", "--config", config, "--format", "json", env=env)
    assert keyless.returncode == 0, keyless.stderr
    plan = json.loads(keyless.stdout)
    check_contract(plan)
    assert plan["stages"]["generate"]["calls"] == 0
    assert set(plan["stages"]["respond"]["by_model"]) == {
        m for m in plan["stages"]["respond"]["by_model"] if m.startswith(("llama", "qwen", "olmo"))
    }
    assert any(note.startswith("left out as unavailable: ") and "gpt-4o" in note for note in plan["notes"])
    assert "skipping unavailable models" in keyless.stderr

    if name != "paper-nq.yaml":
        return
    table = cli("plan", "--config", config, "--all-models", env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith(f"Plan for {config}") and "\ntotal " in table.stdout


def test_plan_bad_input_is_exit_2(tmp_path):
    config = paper_config(tmp_path, "paper-nq.yaml")
    missing = cli("plan", "--config", config, "--all-models", "--benchmark", tmp_path / "benchmark.parquet")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert cli("plan", "--config", config, "--format", "yaml").returncode == 2
    assert cli("plan", "--config", config, "--latency", "0").returncode == 2
