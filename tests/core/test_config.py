"""Run config: includes, unknown keys with file and line, registry cross-checks."""

from __future__ import annotations

import re
import textwrap

import pytest

from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.core.errors import InputError


def _write(path, text):
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


REGISTRY = """
models:
  gen:
    model: openai/gen
    api_base: http://127.0.0.1:9/v1
  judge:
    model: anthropic/claude-sonnet-4
    api_key_env: ANTHROPIC_API_KEY
    max_concurrency: 2
"""


def test_include_merges_registry_and_run(tmp_path):
    _write(tmp_path / "models.yaml", REGISTRY)
    cfg_path = _write(
        tmp_path / "run.yaml",
        """
        include: models.yaml
        generation:
          base_set: data.jsonl
          generators: [gen]
          verifiers: [gen, judge]
        evaluation:
          targets: [gen]
          judge: judge
        models:
          gen:
            max_concurrency: 3
    """,
    )
    cfg = load_config(cfg_path)
    assert set(cfg.models) == {"gen", "judge"}
    assert cfg.models["gen"].max_concurrency == 3  # the including file wins
    assert cfg.models["gen"].api_base == "http://127.0.0.1:9/v1"  # the rest comes from the include
    assert cfg.generation.filter == "unanimous"
    assert cfg.resolve_path(cfg.generation.base_set) == str(tmp_path / "data.jsonl")
    assert cfg.used_models() == ["gen", "judge"]
    assert len(cfg.fingerprint()) == 16


def test_unknown_key_names_key_file_and_line(tmp_path):
    path = _write(
        tmp_path / "run.yaml",
        """
        models:
          gen:
            model: openai/gen
            temprature: 0.2
    """,
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:4: models.gen.temprature: unknown key 'temprature'"


def test_unknown_key_in_an_included_file_points_at_that_file(tmp_path):
    registry = _write(
        tmp_path / "models.yaml",
        """
        models:
          gen:
            model: openai/gen
            bogus: 1
    """,
    )
    path = _write(tmp_path / "run.yaml", "include: models.yaml\n")
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{registry.resolve()}:4: models.gen.bogus: unknown key")


def test_model_names_are_checked_against_the_registry(tmp_path):
    _write(tmp_path / "models.yaml", REGISTRY)
    path = _write(
        tmp_path / "run.yaml",
        """
        include: models.yaml
        evaluation:
          targets: [gen, gpt-9]
          judge: judge
    """,
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    assert "evaluation.targets: model 'gpt-9' is not in the registry" in str(info.value)


def test_api_key_must_be_an_env_var_name(tmp_path):
    path = _write(
        tmp_path / "run.yaml",
        """
        models:
          x:
            model: openai/gpt-4o
            api_key_env: sk-live-1234-abcd
    """,
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    assert "NAME of an environment variable" in str(info.value)
    assert ":4: models.x.api_key_env" in str(info.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "empty config file"),
        ("models: [1, 2\n", "invalid YAML"),
        ("- a\n- b\n", "mapping at top level"),
        ("models:\n  a:\n    model: m\n  a:\n    model: n\n", "duplicate key 'a'"),
        ("include: nowhere.yaml\n", "included file not found: nowhere.yaml"),
        ("generation:\n  generators: [a]\n  verifiers: [a]\n", "generation.base_set: required key missing"),
    ],
)
def test_bad_config_files(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_config(path)
    assert expected in str(info.value)
    assert str(info.value).startswith(str(path.resolve()) if "include" not in text and "base_set" not in text else "")


def test_include_cycle_is_reported(tmp_path):
    _write(tmp_path / "a.yaml", "include: b.yaml\n")
    _write(tmp_path / "b.yaml", "include: a.yaml\n")
    with pytest.raises(InputError, match="include cycle"):
        load_config(tmp_path / "a.yaml")


def test_non_utf8_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_config(path)


# ---------------------------------------------------------------- ${NAME} in endpoints


def test_endpoints_are_expanded_from_the_environment(tmp_path, monkeypatch):
    path = _write(
        tmp_path / "run.yaml",
        """
        models:
          m:
            model: openai/m
            api_base: "${RB_TEST_MODELS_URL:-http://models:8080/v1}"
          n:
            model: openai/n
            api_base: "http://${RB_TEST_HOST}:8000/v1"
        cache:
          backend: redis
          url: "${RB_TEST_REDIS_URL:-redis://redis:6379/0}"
    """,
    )
    monkeypatch.delenv("RB_TEST_MODELS_URL", raising=False)
    monkeypatch.setenv("RB_TEST_REDIS_URL", "")  # empty counts as unset, as with the shell's :-
    monkeypatch.setenv("RB_TEST_HOST", "gpu-box")
    cfg = load_config(path)
    assert cfg.models["m"].api_base == "http://models:8080/v1" and cfg.cache.url == "redis://redis:6379/0"
    assert cfg.models["n"].api_base == "http://gpu-box:8000/v1"
    monkeypatch.setenv("RB_TEST_MODELS_URL", "http://127.0.0.1:18080/v1")
    monkeypatch.setenv("RB_TEST_REDIS_URL", "redis://127.0.0.1:16379/0")
    cfg = load_config(path)
    assert cfg.models["m"].api_base == "http://127.0.0.1:18080/v1" and cfg.cache.url == "redis://127.0.0.1:16379/0"
    # The deployment is the one written: the call cache keys on it wherever the variable points.
    assert cfg.models["m"].api_base_as_written == "${RB_TEST_MODELS_URL:-http://models:8080/v1}"
    assert (
        cfg.models["m"].model_copy(update={"api_base": "http://127.0.0.1:5/v1"}).api_base_as_written
        == "http://127.0.0.1:5/v1"
    )  # a copy sent elsewhere (a server the run started) is keyed as that


def test_a_missing_variable_is_a_config_error_at_its_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RB_TEST_UNSET", raising=False)
    path = _write(
        tmp_path / "run.yaml",
        """
        models:
          m:
            model: openai/m
            api_base: "${RB_TEST_UNSET}"
    """,
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path.resolve()}:4: models.m.api_base: environment variable RB_TEST_UNSET is not set "
        "(give a default: ${RB_TEST_UNSET:-...})"
    )
    for text, problem in (
        ("cache:\n  url: '${RB_TEST_UNSET}'\n", "cache.url: environment variable RB_TEST_UNSET"),
        ("cache:\n  url: 'redis://${REDIS'\n", "cache.url: unclosed '${'"),
        ("cache:\n  url: '${1X:-y}'\n", "cache.url: '${1X:-y}' is not ${NAME} or ${NAME:-default}"),
    ):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(problem)):
            load_config(path)
