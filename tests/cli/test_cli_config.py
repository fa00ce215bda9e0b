"""``refusalbench init``, ``config validate`` and ``--version``, and a config's problems listed at once."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=180,
        env=env,
    )


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    from refusalbench.flows.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_version_prints_the_installed_versions(capsys):
    code, out, err = run_in_process(["--version"], capsys)
    assert code == 0, err
    assert out.strip() == (
        f"refusalbench {metadata.version('refusalbench')} "
        f"(prefect {metadata.version('prefect')}, litellm {metadata.version('litellm')})"
    )


def test_init_writes_a_config_that_plan_accepts_without_keys(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    made = cli("init", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    written = tmp_path / "refusalbench.yaml"
    text = written.read_text(encoding="utf-8")
    assert text.startswith("# yaml-language-server: $schema=")
    schema = text.splitlines()[0].split("$schema=", 1)[1]
    assert (tmp_path / schema).resolve() == ROOT / "docs" / "schema" / "config.schema.json"
    document = yaml.safe_load(text)
    assert (tmp_path / document["generation"]["base_set"]).resolve() == ROOT / "data" / "sample_single.jsonl"
    models = yaml.safe_load((ROOT / "configs" / "models.yaml").read_text(encoding="utf-8"))["models"]
    providers = {models[name]["model"].split("/")[0] for name in document["evaluation"]["targets"]}
    assert {"openai", "anthropic"} <= providers
    assert any("local" in models[name] for name in document["evaluation"]["targets"])
    assert document["evaluation"]["judge"] in models

    plan = cli("plan", "--config", str(written), cwd=tmp_path, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "total" in plan.stdout and "Traceback" not in plan.stderr

    again = cli("init", cwd=tmp_path, env=env)
    assert again.returncode == 2
    assert again.stderr.strip() == "refusalbench.yaml: -: already exists; pass --force to replace it"
    assert written.read_text(encoding="utf-8") == text


def test_init_beside_the_shipped_files_writes_relative_paths():
    """Written in a folder beside data/ (as configs/ is), the paths are relative to the file, as a config's are."""
    from refusalbench.flows.cli_config import starter_config

    document = yaml.safe_load(starter_config(ROOT / "configs" / "mine.yaml"))
    assert document["generation"]["base_set"] == "../data/sample_single.jsonl"
    assert document["include"] == "models.yaml"


@pytest.mark.parametrize("command", [["init"], ["config"], ["config", "validate"]])
def test_help(command):
    result = cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_config_validate_the_demo_config(capsys):
    code, out, err = run_in_process(["config", "validate", str(ROOT / "configs" / "demo.yaml")], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert "name: local-demo" in lines
    assert "base set: ../data/sample_single.jsonl (28 items, 2 drawn)" in lines
    assert "judge: qwen2.5-coder-0.5b-instruct (decision: judge)" in lines
    assert lines[-1] == "config OK"
    assert err == ""  # local models only: no key to miss


def test_config_validate_warns_of_every_missing_key(tmp_path, capsys, monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "run.yaml").write_text(
        f"include: {ROOT / 'configs' / 'models.yaml'}\n"
        "evaluation:\n  targets: [gpt-4o, claude-4-sonnet-api, smollm2-135m-instruct]\n  judge: gpt-4.1\n",
        encoding="utf-8",
    )
    code, out, err = run_in_process(["config", "validate", str(tmp_path / "run.yaml")], capsys)
    assert code == 0, err
    assert err.splitlines() == [
        "warning: OPENAI_API_KEY is not set (needed by gpt-4o, gpt-4.1)",
        "warning: ANTHROPIC_API_KEY is not set (needed by claude-4-sonnet-api)",
    ]
    assert out.splitlines()[-1] == "config OK"


def test_config_validate_lists_every_problem_and_exits_2(tmp_path):
    (tmp_path / "models.yaml").write_text(
        "models:\n  gen:\n    model: openai/gen\n    api_base: http://127.0.0.1:9/v1\n    temprature: 0\n",
        encoding="utf-8",
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "include: models.yaml\n"
        "generation:\n"
        "  base_set: base.jsonl\n"
        "  generators: [gen]\n"
        "  verifiers: [gem]\n"
        "  filter: unanimus\n"
        "evaluation:\n"
        "  targets: [gen]\n"
        "  judge: gen\n"
        "  bootstrapp: 10\n",
        encoding="utf-8",
    )
    result = cli("config", "validate", str(bad))
    assert result.returncode == 2
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"{bad}:5: generation.verifiers: model 'gem' is not in the registry; did you mean 'gen'?",
        f"{bad}:6: generation.filter: Input should be 'unanimous', 'majority' or 'none' (got 'unanimus'); "
        "did you mean 'unanimous'?",
        f"{bad}:10: evaluation.bootstrapp: unknown key 'bootstrapp'; did you mean 'bootstrap'?",
        f"{tmp_path / 'models.yaml'}:5: models.gen.temprature: unknown key 'temprature'",
    ]


def test_config_validate_reports_files_that_are_not_there(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        "models:\n  gen:\n    model: openai/gen\n    api_base: http://127.0.0.1:9/v1\n"
        "generation:\n  base_set: nowhere.jsonl\n  generators: [gen]\n  verifiers: [gen]\n",
        encoding="utf-8",
    )
    code, out, err = run_in_process(["config", "validate", str(config)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"{config}:6: generation.base_set: file not found: nowhere.jsonl"
