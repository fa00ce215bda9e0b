"""Plugins load in every process that runs a task: an installed entry point, a module the config lists.

Each plugin here registers what a user would: a provider profile under a prefix of its own (it
stamps a ``seed`` on every request, which the scripted server sees) and a ratio metric (refusals
over all rows), which must appear in metrics.json with the value the rows give.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from refusalbench.tasks.core.config import CONFIG_CHECKS, load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.providers import PROVIDERS
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS
from tests.pipeline.test_evaluation_flow import ITEMS
from tests.scripted import by_model, judge_by_reference, last_user_text

ROOT = Path(__file__).resolve().parents[2]

PROVIDER = """
from refusalbench.extend import ProviderProfile, register_provider


@register_provider("{prefix}")
class Stamped(ProviderProfile):
    \"\"\"An OpenAI-compatible host that wants a seed on every request.\"\"\"

    direct_http = True

    def rewrite_params(self, params):
        return {{**params, "seed": {seed}}}
"""
METRIC = """
from refusalbench.extend import MetricSpec, declare


def register():
    declare(MetricSpec("{metric}", label="Refused share", numerator=("refused",), denominator=("n",),
                       higher_is_better=None))
"""


def plugin_module(prefix: str, seed: int, metric: str) -> str:
    """One module holding both: the profile registered at import, the metric declared as it is imported."""
    return PROVIDER.format(prefix=prefix, seed=seed) + METRIC.format(metric=metric) + "\n\nregister()\n"


def half_refuses(request: dict) -> str:
    """Refuses the items whose number is even (their context says "The answer is ref0", "ref2" ...)."""
    number = int(re.search(r"The answer is ref(\d+)", last_user_text(request)).group(1))
    return "REFUSE_INFO_MISSING" if number % 2 == 0 else "It is something."


def scripted(fake_llm) -> None:
    fake_llm.responder = by_model({"mixed": half_refuses, "judge": judge_by_reference})


def write_config(folder: Path, url: str, prefix: str, *, extra: str = "", runner: str = "thread") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.yaml"
    config.write_text(
        extra
        + textwrap.dedent(f"""\
        models:
          mixed:
            model: {prefix}/mixed
            api_base: {url}
            max_attempts: 2
          judge:
            model: openai/judge
            api_base: {url}
            max_attempts: 2
        cache:
          path: {folder / "calls.sqlite"}
        runner: {runner}
        evaluation:
          targets: [mixed]
          judge: judge
          bootstrap: 20
          shard_size: 5
        """)
    )
    return config


@pytest.fixture
def benchmark(tmp_path) -> str:
    return ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)


def assert_plugin_worked(out: Path, fake_llm, metric: str, seed: int) -> None:
    """The target's calls went through the plugin's profile, and its metric is in metrics.json as the rows say."""
    sent = fake_llm.calls_for("mixed")
    assert len(sent) == len(ITEMS) and all(call["params"].get("seed") == seed for call in sent)
    assert not any("seed" in call["params"] for call in fake_llm.calls_for("judge"))  # only its own models
    rows = pd.read_parquet(out / "judged.parquet")
    rows = rows[rows.model == "mixed"]
    expected = rows.decision.str.startswith("REFUSE").sum() / len(rows)  # refusals over all rows
    assert expected == 0.5  # the script refuses half of the items
    value = json.loads((out / "metrics.json").read_text())["models"]["mixed"][metric]
    assert value == pytest.approx(expected)


@pytest.fixture
def registries_restored():
    """Registrations a test's plugins make in this process are undone after it (other tests see the built-ins)."""
    registries = (PROVIDERS, METRIC_SPECS, CONFIG_CHECKS)
    before = [set(registry) for registry in registries]
    path, modules = list(sys.path), set(sys.modules)
    yield
    for registry, names in zip(registries, before):
        for name in set(registry) - names:
            registry.remove(name)
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name.startswith("rb_"):
            del sys.modules[name]


# ---------------------------------------------------------------- a: an installed entry point


def install_plugin_package(tmp_path: Path) -> Path:
    """A distribution declaring two ``refusalbench.plugins`` entry points (a module and a function),
    really installed into ``tmp_path/site`` by pip; returns that folder."""
    package = tmp_path / "rb-acme-plugin"
    (package / "rb_acme_plugin").mkdir(parents=True)
    (package / "rb_acme_plugin" / "__init__.py").write_text("")
    (package / "rb_acme_plugin" / "provider.py").write_text(PROVIDER.format(prefix="acme_stamped", seed=4242))
    (package / "rb_acme_plugin" / "metric.py").write_text(METRIC.format(metric="acme_refusal_share"))
    (package / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=69"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "rb-acme-plugin"
        version = "0.1.0"

        [project.entry-points."refusalbench.plugins"]
        provider = "rb_acme_plugin.provider"
        metric = "rb_acme_plugin.metric:register"

        [tool.setuptools]
        packages = ["rb_acme_plugin"]
        """)
    )
    site = tmp_path / "site"
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
            str(site),
            str(package),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (site / "rb_acme_plugin" / "provider.py").is_file()
    return site


def cli_env(tmp_path: Path, site: Path | None = None) -> dict[str, str]:
    """A CLI process on the session's Prefect test API (no server of its own to start)."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=str(PREFECT_API_URL.value()))
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


@pytest.mark.usefixtures("prefect_harness")
def test_an_installed_entry_point_brings_a_provider_and_a_metric(tmp_path, fake_llm, benchmark):
    site = install_plugin_package(tmp_path)
    scripted(fake_llm)
    config = write_config(tmp_path / "cfg", fake_llm.url, "acme_stamped")
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "refusalbench.flows.cli",
            "evaluate",
            "--config",
            str(config),
            "--benchmark",
            benchmark,
            "--out",
            str(out),
        ],
        env=cli_env(tmp_path, site),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_plugin_worked(out, fake_llm, "acme_refusal_share", 4242)
    # Without the installed distribution the model's prefix is unknown: the same config calls nothing.
    assert "acme_stamped" not in PROVIDERS


# ---------------------------------------------------------------- b: a module the config lists, on Dask workers


@pytest.mark.usefixtures("prefect_harness", "registries_restored")
def test_a_config_plugin_is_loaded_in_every_dask_worker_process(tmp_path, fake_llm, benchmark, monkeypatch):
    """The module sits beside the config, on no sys.path: each worker process finds it from the config."""
    from refusalbench.flows.launch import run_evaluation

    monkeypatch.setenv("REFUSALBENCH_DASK_WORKERS", "2")
    scripted(fake_llm)
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "rb_local_plugin.py").write_text(plugin_module("local_stamped", 77, "local_refusal_share"))
    config = write_config(folder, fake_llm.url, "local_stamped", extra="plugins: [rb_local_plugin]\n", runner="dask")
    out = tmp_path / "run"
    result = run_evaluation(str(config), benchmark, str(out))
    assert result.responses == len(ITEMS)
    assert_plugin_worked(out, fake_llm, "local_refusal_share", 77)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calls"]["mixed"]["http_calls"] == len(ITEMS)  # made in the worker processes, counted there


@pytest.mark.usefixtures("registries_restored")
def test_a_plugin_is_found_beside_the_file_that_lists_it_and_loaded_once(tmp_path):
    """An included file's ``plugins`` resolve against that file's folder; loading again is a no-op."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "rb_shared_plugin.py").write_text(plugin_module("shared_stamped", 5, "shared_refusal_share"))
    (shared / "plugins.yaml").write_text("plugins: [rb_shared_plugin]\n")
    config = tmp_path / "runs" / "run.yaml"
    config.parent.mkdir()
    config.write_text("include: ../shared/plugins.yaml\nmodels:\n  m:\n    model: shared_stamped/m\n")
    first = load_config(config)
    assert first.plugins == ["rb_shared_plugin"] and "shared_stamped" in PROVIDERS
    again = load_config(config)  # a second registration would raise: the module is imported once
    again.load_plugins()
    assert sys.modules["rb_shared_plugin"].Stamped is PROVIDERS["shared_stamped"]


# ---------------------------------------------------------------- c: bad plugins are bad input


def test_a_missing_plugin_module_is_one_line_naming_file_line_and_key(tmp_path, capsys):
    from refusalbench.flows.cli import main

    config = tmp_path / "run.yaml"
    config.write_text("name: x\nplugins:\n  - rb_no_such_plugin\nmodels: {}\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        main(["evaluate", "--config", str(config), "--benchmark", str(tmp_path / "b.parquet"), "--out", str(out)])
    captured = capsys.readouterr()
    assert exited.value.code == 2
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.splitlines() == [
        f"{config.resolve()}:3: plugins: no plugin module 'rb_no_such_plugin' on sys.path or in {tmp_path.resolve()}"
    ]
    assert not out.exists()


@pytest.mark.usefixtures("registries_restored")
def test_a_plugin_that_fails_to_import_is_named_with_its_error(tmp_path):
    (tmp_path / "rb_broken_plugin.py").write_text("import rb_dependency_not_installed\n")
    config = tmp_path / "run.yaml"
    config.write_text("plugins: [rb_broken_plugin, 'not a module']\n")
    with pytest.raises(InputError) as raised:
        load_config(config)
    assert str(raised.value) == (
        f"{config.resolve()}:1: plugins: plugin module 'rb_broken_plugin' failed to import: "
        "ModuleNotFoundError: No module named 'rb_dependency_not_installed'"
    )
    assert str(tmp_path.resolve()) not in sys.path  # a folder that gave no plugin is not left on sys.path


def test_a_broken_entry_point_names_its_distribution_and_entry_point(tmp_path):
    """An installed distribution (its metadata as pip writes it) whose entry point names a missing module."""
    info = tmp_path / "site" / "rb_broken-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rb-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[refusalbench.plugins]\nbroken = rb_broken_gone.plugin\n")
    done = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "levers", "list"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "distribution rb-broken: refusalbench.plugins: entry point broken = "
        "rb_broken_gone.plugin: ModuleNotFoundError: No module named 'rb_broken_gone'"
    ]


# ---------------------------------------------------------------- every task loads them


def test_every_task_given_a_config_loads_its_plugins_first():
    """A task runs wherever the runner puts it: each one taking the run config must load its plugins."""
    tasks = []
    for path in (ROOT / "tasks" / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).split("(")[0] == "task" for d in node.decorator_list
            ):
                first = node.args.args[0].annotation if node.args.args else None
                if first is not None and ast.unparse(first) == "RunConfig":
                    tasks.append(node.name)
                    names = [ast.unparse(d).split("(")[0] for d in node.decorator_list]
                    assert names[:2] == ["task", "with_plugins"], (path.name, node.name, names)
    assert len(tasks) >= 12, tasks
