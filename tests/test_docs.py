"""The README and the documentation site: short, self-contained, and built from the code.

The site is built the way `bash scripts/docs.sh` builds it (strict: a broken link, a missing
anchor or a page left out of the navigation fails), and its generated reference pages are
checked against the code they come from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAIN_JOB = "bash scripts/setup.sh --local && .venv/bin/refusalbench run"
TEST_COMMAND = "bash scripts/setup.sh --local && bash scripts/check.sh"
# A tracker issue number or a document that is not in the repository: the docs must stand alone.
FORBIDDEN = re.compile(r"issue [0-9]|DESIGN\.md", re.IGNORECASE)


def doc_files() -> list[Path]:
    return [
        README,
        *sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix in (".md", ".py", ".json")),
    ]


def reference_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short_and_keeps_the_two_commands_verbatim():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    lines = [line.strip() for line in text.splitlines()]
    assert MAIN_JOB in lines
    assert TEST_COMMAND in lines


def test_no_issue_numbers_or_outside_documents_in_readme_or_docs():
    offenders = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in doc_files()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not offenders, offenders


def test_readme_links_point_at_files_of_the_repository():
    text = README.read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing


def test_the_readme_example_config_is_a_valid_run_config(tmp_path):
    """The 'own API models' example stays within 15 lines and loads as a run config."""
    from refusalbench.tasks.core.config import load_config

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Evaluate your own API models") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None
    assert len(block.group(1).splitlines()) <= 15
    shutil.copy(ROOT / "data" / "sample_single.jsonl", tmp_path / "sample_single.jsonl")
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "data" / "sample_single.jsonl", tmp_path / "data" / "sample_single.jsonl")
    config_file = tmp_path / "my-models.yaml"
    config_file.write_text(block.group(1), encoding="utf-8")
    config = load_config(config_file)
    assert config.evaluation is not None and config.generation is not None
    assert set(config.evaluation.targets) <= set(config.models)
    assert all(model.params.get("max_tokens") for model in config.models.values())  # plan can bound the cost


def test_every_declared_metric_is_in_the_glossary():
    from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS

    glossary = (ROOT / "docs" / "concepts" / "metrics.md").read_text(encoding="utf-8")
    missing = [name for name in METRIC_SPECS if f"`{name}`" not in glossary]
    assert not missing, missing


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [page for item in node for page in pages(item)]
        if isinstance(node, dict):
            return [page for value in node.values() for page in pages(value)]
        return []

    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == set(pages(config["nav"]))


def test_the_checked_in_config_schema_is_current():
    checked_in = (ROOT / "docs" / "schema" / "config.schema.json").read_text(encoding="utf-8")
    assert checked_in == reference_hook().config_schema_text(), (
        "run `.venv/bin/python scripts/config_schema.py` to regenerate docs/schema/config.schema.json"
    )


def test_the_config_schema_accepts_the_shipped_configs_and_rejects_unknown_keys():
    import jsonschema

    schema = json.loads((ROOT / "docs" / "schema" / "config.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text(encoding="utf-8")))]
        assert not errors, (path.name, errors[:3])
    bad = list(validator.iter_errors({"evaluation": {"targets": ["m"], "judge": "m", "judgee": "x"}}))
    assert bad and "judgee" in bad[0].message


def test_the_generated_reference_covers_every_command_key_and_file():
    import typer.main

    from refusalbench.flows.cli import app
    from refusalbench.tasks.core.config import RunConfig
    from refusalbench.tasks.pipeline.runfolder_doc import ARTIFACTS, runfolder_markdown

    hook = reference_hook()
    cli = hook.render("<!-- generated: cli -->")

    def leaves(group: object, path: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for name, command in group.commands.items():  # type: ignore[attr-defined]
            out += leaves(command, (*path, name)) if hasattr(command, "commands") else [" ".join((*path, name))]
        return out

    commands = leaves(typer.main.get_command(app), ())
    assert {"run", "plan", "knowornot run", "data import kilt-nq", "audit label", "api stop"} <= set(commands)
    for command in commands:
        assert f"### `refusalbench {command}`" in cli
    assert "`--all-models`" in cli and "`--per-stratum`" in cli

    config = hook.render("<!-- generated: config -->")
    for section in ("`models.NAME`", "`generation`", "`generation.pretest`", "`evaluation`", "`knowornot`", "`cache`"):
        assert f"## {section}" in config
    for key in RunConfig.model_fields:
        if not RunConfig.model_fields[key].exclude:
            assert f"| `{key}` |" in config

    files = hook.render("<!-- generated: run-folder -->")
    assert files == runfolder_markdown()
    assert all(f"`{artifact.name}`" in files for artifact in ARTIFACTS)


def test_the_site_builds_strictly(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.exists(), "mkdocs is installed by scripts/setup.sh (the docs extra)"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "site"
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "refusalbench knowornot agreement" in cli and "generated:" not in cli
    assert "benchmark.parquet" in (site / "reference" / "run-folder" / "index.html").read_text(encoding="utf-8")
    schema = json.loads((site / "schema" / "config.schema.json").read_text(encoding="utf-8"))
    assert "include" in schema["properties"] and "models" in schema["properties"]
    assert not (site / "hooks").exists()


@pytest.mark.parametrize("page", ["guides/refresh.md", "guides/own-models.md"])
def test_guides_name_commands_that_exist(page):
    """Every `refusalbench ...` command a guide shows is one the command line has."""
    import typer.main

    from refusalbench.flows.cli import app

    root = typer.main.get_command(app)
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    for words in re.findall(r"^refusalbench ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", text, re.MULTILINE):
        first, *rest = words.split()
        assert first in root.commands, words
        command = root.commands[first]
        if rest and hasattr(command, "commands"):
            assert rest[0] in command.commands, words
