"""The distribution installs under one namespace and lives beside unrelated packages.

The design card fixes the repository's top-level folders (flows/, tasks/, ...); they are
installed as ``refusalbench.flows``, ``refusalbench.tasks``, ... so that a generic name
such as ``tasks`` never lands in site-packages and collides with another project's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("flows", "tasks", "deployments", "extend", "levers", "prompts", "configs")


def declared_packages() -> tuple[list[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools["packages"], setuptools["package-dir"]


def test_every_code_folder_is_a_declared_namespaced_package():
    packages, package_dir = declared_packages()
    expected = set()
    for top in CODE_FOLDERS:
        assert package_dir[f"refusalbench.{top}"] == top
        for init in (ROOT / top).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / top).parts
            expected.add(".".join(("refusalbench", top, *relative)))
    assert set(packages) == expected, "pyproject.toml's package list must name every package folder"
    assert all(name.startswith("refusalbench.") for name in packages)


@pytest.mark.slow
def test_installed_beside_an_unrelated_tasks_package(tmp_path):
    target, other = tmp_path / "site", tmp_path / "other"
    (other / "tasks").mkdir(parents=True)
    (other / "tasks" / "__init__.py").write_text("UNRELATED = True\n")
    # Built from a copy: an in-tree build would leave build/ in the checkout.
    source = tmp_path / "source"
    for name in (*CODE_FOLDERS, "pyproject.toml", "README.md"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(
            ROOT / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}),
        )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    top_level = {p.name for p in target.iterdir() if not p.name.endswith((".dist-info", ".egg-info"))}
    assert top_level - {"bin"} == {"refusalbench"}, top_level

    # The project's own editable install is hidden so the copy under ``target`` is imported.
    probe = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path_importer_cache.clear()
import tasks
assert tasks.UNRELATED
import refusalbench.tasks.llm.gateway, refusalbench.flows.cli, refusalbench.levers, refusalbench.prompts
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.core.config import packaged_config
assert len(load_catalogue()) == 176
assert packaged_config("demo.yaml").is_file()
from refusalbench.tasks.refusalbench.reference.paper_reference import load_reference
assert load_reference().match("openai/gpt-4o") == "GPT-4o"
print(refusalbench.tasks.llm.gateway.__file__)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(other)])}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith(str(target))


def test_docs_document_the_run_folder_as_declared():
    """The run-folder reference page is the declarations' table, generated when the site is built."""
    import importlib.util

    from refusalbench.tasks.pipeline.runfolder_doc import runfolder_markdown

    page = (ROOT / "docs" / "reference" / "run-folder.md").read_text()
    assert "<!-- generated: run-folder -->" in page
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert runfolder_markdown() in hook.render(page)


# Where run-folder files are declared: the shared ones, and each method's own.
DECLARATIONS = {
    "tasks/core/runfolder.py",
    "tasks/refusalbench/schema/artifacts.py",
    "tasks/knowornot/schema/artifacts.py",
}


def test_no_artifact_file_name_is_spelled_out_outside_the_run_folder_modules():
    import re

    from refusalbench.tasks.pipeline.runfolder_doc import ARTIFACTS

    names = {artifact.name for artifact in ARTIFACTS}
    assert all((ROOT / module).is_file() for module in DECLARATIONS)
    offenders = []
    for folder in ("flows", "tasks", "deployments"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() in DECLARATIONS:
                continue
            for literal in re.findall(r"[\"']([\w./-]+\.(?:parquet|json|html|faiss))[\"']", path.read_text()):
                if literal in names:
                    offenders.append(f"{path.relative_to(ROOT)}: {literal}")
    assert not offenders, offenders


def test_production_modules_stay_small():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for folder in ("flows", "tasks", "deployments")
        for p in (ROOT / folder).rglob("*.py")
    }
    assert not {name: n for name, n in sizes.items() if n > 500}


def test_a_refusalbench_run_does_not_load_what_only_knowornot_needs():
    """Start-up is paid on every scheduled run: the main job's modules must not drag in NLTK or FAISS."""
    probe = (
        "import sys, refusalbench.flows.cli, refusalbench.flows.launch, refusalbench.flows.main; "
        "print(sorted(m for m in ('nltk', 'faiss', 'sentence_transformers', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
