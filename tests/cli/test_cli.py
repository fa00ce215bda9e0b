"""The command line: help everywhere, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = [
    [],
    ["levers"],
    ["levers", "list"],
    ["levers", "validate"],
    ["data", "validate"],
    ["models"],
    ["models", "list"],
    ["models", "pull"],
    ["models", "serve"],
    ["generate"],
    ["evaluate"],
    ["score"],
    ["report"],
    ["knowornot"],
    ["knowornot", "run"],
    ["run"],
    ["data", "import"],
    ["data", "import", "kilt-nq"],
    ["data", "import", "garage"],
    ["pretest"],
    ["plan"],
    ["export"],
    ["view"],
    ["deploy"],
    ["contamination"],
]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_help_everywhere(command):
    result = cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_levers_list_json_contract():
    import json

    result = cli("levers", "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 176
    assert {"id", "perturbation_class", "intensity", "name", "instruction", "expected"} <= set(rows[0])
    filtered = json.loads(
        cli("levers", "list", "--format", "json", "--class", "P-Contradiction", "--intensity", "high").stdout
    )
    assert len(filtered) == 10 and {r["intensity"] for r in filtered} == {"HIGH"}


def test_levers_validate_ok():
    result = cli("levers", "validate")
    assert result.returncode == 0, result.stderr
    assert "176 levers" in result.stdout


def test_bad_config_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("models:\n  a:\n    model: m\n    nope: 1\n")
    result = cli("generate", "--config", str(config), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"{config}:4: models.a.nope: unknown key 'nope'"
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_data_validate_reports_file_line_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "question": "q?", "answers": ["x"], "context": "c"}\n{"id": "a", "question": " ", "answers": [], "context": "c"}\n'
    )
    result = cli("data", "validate", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert any(line.startswith(f"{bad}:2: question:") for line in lines)
    assert any(line.startswith(f"{bad}:2: answers:") for line in lines)
    assert "Traceback" not in result.stderr
    good = cli("data", "validate", "data/sample_single.jsonl")
    assert good.returncode == 0, good.stderr


def test_usage_error_exits_2():
    assert cli("generate").returncode == 2
    assert cli("no-such-command").returncode == 2
