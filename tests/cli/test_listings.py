"""Listings readable anywhere: class and intensity names as people type them, tables that fit 80
columns piped without cutting an id, CSV and JSON for programs, and a missing relative input
that says where it was looked for."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from refusalbench.tasks.refusalbench.taxonomy import PERTURBATION_CLASSES

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, columns: int | None = 80, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The CLI as a script sees it: stdout is a pipe; COLUMNS as given (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def listing(*args: str) -> list[dict]:
    done = cli(*args, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", ["ambiguity", "AMBIGUITY", "P-Ambiguity", "p-ambiguity"])
def test_a_class_in_any_case_with_or_without_the_prefix(name):
    done = cli("levers", "list", "--class", name)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if re.match(r"^[a-z]+-(low|medium|high)-", line)]
    assert rows and all(line.startswith("ambiguity-") for line in rows)
    everything = listing("levers", "list")
    assert len(rows) == sum(r["perturbation_class"] == "P-Ambiguity" for r in everything)


def test_class_slugs_and_intensities_in_any_case():
    picked = listing("levers", "list", "--class", "missing-info", "--class", "granularity", "--intensity", "Low")
    assert picked and {r["perturbation_class"] for r in picked} == {"P-MissingInfo", "P-GranularityMismatch"}
    assert {r["intensity"] for r in picked} == {"LOW"}
    assert listing("levers", "list", "--class", "missinginfo", "--intensity", "low") == [
        r for r in picked if r["perturbation_class"] == "P-MissingInfo"
    ]


def test_an_unknown_class_exits_2_with_the_choices_and_the_closest_one():
    done = cli("levers", "list", "--class", "ambiguty")
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("--class: unknown perturbation class 'ambiguty' (did you mean P-Ambiguity?)")
    assert all(cls in line for cls in PERTURBATION_CLASSES)
    assert "Traceback" not in done.stderr and "ValueError" not in done.stderr
    bad = cli("levers", "list", "--intensity", "hgh")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        == "--intensity: unknown intensity 'hgh' (did you mean HIGH?); valid: LOW, MEDIUM, HIGH (any case)"
    )


@pytest.mark.parametrize(("command", "key"), [(["levers", "list"], "id"), (["models", "list"], "name")])
def test_piped_tables_fit_80_columns_and_keep_every_id_whole(command, key):
    done = cli(*command, columns=None)  # piped, COLUMNS unset: as wide as an 80-column terminal
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = set(done.stdout.split())
    ids = [row[key] for row in listing(*command)]
    assert ids and all(i in words for i in ids)  # each on one line, not folded or cut with …
    assert "…" not in done.stdout
    assert not re.search(r"\b(None|True|False|nan)\b", done.stdout)
    assert "left out at 80 columns" in " ".join(done.stdout.split())  # the table says what it does not show
    assert done.stdout == cli(*command, columns=80).stdout


def test_a_wide_terminal_shows_every_column_as_words_people_read():
    done = cli("models", "list", columns=250)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("name"))
    assert header.split()[:4] == ["name", "available", "runs", "on"]
    assert "api_key_env" in header and "left out" not in done.stdout
    assert not re.search(r"\b(None|True|False)\b", done.stdout)
    assert re.search(r"\b(yes|no)\b", done.stdout)


@pytest.mark.parametrize("command", [["levers", "list"], ["models", "list"]])
def test_csv_and_json_carry_every_row_and_column(command):
    rows = listing(*command)
    assert rows
    done = cli(*command, "--format", "csv")
    assert done.returncode == 0, done.stderr
    read = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(read) == len(rows)
    assert set(read[0]) == set(rows[0])
    key = "id" if command[0] == "levers" else "name"
    assert [r[key] for r in read] == [r[key] for r in rows]
    if command[0] == "models":
        assert {type(r["available"]) for r in rows} == {bool}  # JSON keeps the types
        assert {r["available"] for r in read} <= {"true", "false"}
        assert [r["api_base"] for r in read] == [row["api_base"] or "" for row in rows]  # null: an empty cell


def test_a_missing_relative_base_set_says_where_it_looked_and_how_to_build_it(tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "run.yaml").write_text(
        "models:\n  rules: {model: rules/v1}\n  v: {model: openai/v, api_base: 'http://127.0.0.1:9/v1'}\n"
        "generation:\n  base_set: data/base.jsonl\n  generators: [rules]\n  verifiers: [v]\n"
    )
    done = cli("plan", "--config", "configs/run.yaml", cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    looked = folder / "data" / "base.jsonl"
    assert f"run.yaml:5: generation.base_set: file not found: data/base.jsonl (looked for {looked}" in line
    assert f"refusalbench data import garage GaRAGe_benchmark.jsonl --out {looked}" in line
    assert "refusalbench data import kilt-nq --questions" in line


def test_a_missing_include_and_knowledge_base_say_where_they_were_looked_for(tmp_path):
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.core.errors import InputError
    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import check_knowornot_inputs

    (tmp_path / "cfg").mkdir()
    config = tmp_path / "cfg" / "kb.yaml"
    config.write_text("include: ../shared/models.yaml\n")
    with pytest.raises(InputError) as info:
        load_config(config)
    assert f"included file not found: ../shared/models.yaml (looked for {tmp_path / 'shared' / 'models.yaml'}" in str(
        info.value
    )
    config.write_text(
        "models:\n  m: {model: openai/m}\nknowornot:\n  documents: [docs/policy.txt]\n  targets: [m]\n  evaluator: m\n"
    )
    with pytest.raises(InputError) as info:
        check_knowornot_inputs(load_config(config))
    assert info.value.line == 4 and info.value.field == "knowornot.documents.0"
    assert f"file not found: docs/policy.txt (looked for {tmp_path / 'cfg' / 'docs' / 'policy.txt'}" in str(info.value)


def test_a_missing_relative_benchmark_names_its_absolute_path(tmp_path, monkeypatch):
    from refusalbench.tasks.core.errors import InputError
    from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        read_benchmark("runs/r1/benchmark.parquet")
    assert str(info.value) == (
        f"runs/r1/benchmark.parquet: -: benchmark file not found "
        f"(looked for {tmp_path / 'runs' / 'r1' / 'benchmark.parquet'}: relative to the working folder)"
    )
