"""A config's problems all at once: one line each at the right file and line, with a "did you mean"."""

from __future__ import annotations

import re
import textwrap

import pytest

import refusalbench.tasks.refusalbench  # noqa: F401  (registers the strata check, as the CLI's import does)
from refusalbench.tasks.core.config import load_config, packaged_config
from refusalbench.tasks.core.config_problems import did_you_mean
from refusalbench.tasks.core.errors import InputError, InputErrors


def _write(path, text):
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


REGISTRY = """
models:
  gen:
    model: openai/gen
    api_base: http://127.0.0.1:9/v1
  judge:
    model: openai/judge
    api_base: http://127.0.0.1:9/v1
"""


def _problems(path) -> list[str]:
    with pytest.raises(InputError) as info:
        load_config(path)
    return info.value.lines() if isinstance(info.value, InputErrors) else [str(info.value)]


def test_four_mistakes_are_four_lines_at_their_lines(tmp_path):
    _write(tmp_path / "models.yaml", REGISTRY)
    path = _write(
        tmp_path / "run.yaml",
        """
        include: models.yaml
        generation:
          base_set: base.jsonl
          generators: [gen]
          verifiers: [gne]
          filter: unanimus
          seeed: 3
        evaluation:
          targets: [gen]
          judge: judge
          bootstrap: many
        """,
    )
    assert _problems(path) == [
        f"{path}:5: generation.verifiers: model 'gne' is not in the registry; did you mean 'gen'?",
        f"{path}:6: generation.filter: Input should be 'unanimous', 'majority' or 'none' (got 'unanimus'); "
        "did you mean 'unanimous'?",
        f"{path}:7: generation.seeed: unknown key 'seeed'; did you mean 'seed'?",
        f"{path}:11: evaluation.bootstrap: Input should be a valid integer, unable to parse string as an integer",
    ]


def test_a_mistake_in_an_included_file_names_that_file_and_line(tmp_path):
    registry = _write(tmp_path / "models.yaml", REGISTRY + "    max_concurency: 2\n")
    path = _write(tmp_path / "run.yaml", "include: models.yaml\nevaluation:\n  targets: [gen]\n  judge: judgee\n")
    assert _problems(path) == [
        f"{path}:4: evaluation.judge: model 'judgee' is not in the registry; did you mean 'judge'?",
        f"{registry.resolve()}:8: models.judge.max_concurency: unknown key 'max_concurency'; "
        "did you mean 'max_concurrency'?",
    ]


def test_a_mistyped_model_gets_at_most_three_names_not_the_registry(tmp_path):
    names = list(load_config(packaged_config("models.yaml")).models)
    assert len(names) > 30
    path = _write(
        tmp_path / "run.yaml",
        f"""
        include: {packaged_config("models.yaml")}
        evaluation:
          targets: [claude-4-sonet-api, zzzz]
          judge: gpt-4.1
        """,
    )
    first, second = _problems(path)
    assert first.startswith(
        f"{path}:3: evaluation.targets: model 'claude-4-sonet-api' is not in the registry; did you mean"
    )
    suggested = re.findall(r"'([^']+)'", first.split("did you mean", 1)[1])
    assert 1 <= len(suggested) <= 3 and suggested[0] == "claude-4-sonnet-api"
    assert second == (
        f"{path}:3: evaluation.targets: model 'zzzz' is not in the registry "
        "(no registry name is close; `refusalbench models list` lists them)"
    )
    assert sum(f"'{name}'" in first + second for name in names) <= 3  # never the whole registry


def test_a_union_value_is_one_problem_and_a_literal_gets_its_closest_value(tmp_path):
    path = _write(tmp_path / "run.yaml", "models:\n  a:\n    model: openai/a\n    mode: bach\n")
    assert _problems(path) == [
        f"{path}:4: models.a.mode: Input should be 'sync' or 'batch' (got 'bach'); did you mean 'batch'?"
    ]


def test_strata_are_checked_at_load_each_at_its_line(tmp_path):
    _write(tmp_path / "models.yaml", REGISTRY)
    path = _write(
        tmp_path / "run.yaml",
        """
        include: models.yaml
        generation:
          base_set: base.jsonl
          generators: [gen]
          verifiers: [gen]
          strata:
            - p-missinginfo / low
            - P-Ambiguty/HIGH
            - nonsense
        """,
    )
    first, second = _problems(path)
    assert first.startswith(f"{path}:8: generation.strata.1: unknown stratum 'P-Ambiguty/HIGH'")
    assert "did you mean P-Ambiguity?" in first and "valid: P-Ambiguity, P-Contradiction" in first
    assert second.startswith(f"{path}:9: generation.strata.2: unknown stratum 'nonsense': expected CLASS/INTENSITY")


def test_did_you_mean_wording():
    assert did_you_mean("sed", ["seed", "shard_size"]) == "; did you mean 'seed'?"
    assert did_you_mean("a", ["xyz"]) == ""
    assert did_you_mean("gpt-4", ["gpt-4o", "gpt-4.1", "gpt-3"]).count("'") == 6
