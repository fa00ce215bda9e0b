"""Extension points resolved through registries: adding one is a function plus a decorator.

Each test registers its extension here, in the test file, and reaches it through a config file,
the way a user's own module would: nothing in the project is edited or monkeypatched.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import pytest

from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.callcache import CallCache, cache_backends, open_cache, register_cache_backend
from refusalbench.tasks.llm.gateway import gateway_for


class MemoryCache:
    """A complete cache backend: a dict in this process, counting the lookups it answered."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.hits = 0

    def get(self, key: str) -> dict[str, Any] | None:
        value = self.rows.get(key)
        if value is not None:
            self.hits += 1
        return value

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.rows[key] = value


@register_cache_backend("test-memory")
def open_memory_cache(*, path: str | None = None, url: str | None = None) -> CallCache:
    return MemoryCache()


def _config(tmp_path, api_base: str, backend: str):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(f"""
        models:
          m:
            model: openai/fake
            api_base: {api_base}
            max_attempts: 2
        cache:
          backend: {backend}
    """).lstrip("\n"),
        encoding="utf-8",
    )
    return path


def test_a_new_cache_backend_registers_without_editing_the_project(tmp_path, fake_llm):
    assert "test-memory" in cache_backends()
    cfg = load_config(_config(tmp_path, fake_llm.url, "test-memory"))
    assert cfg.cache.backend == "test-memory"

    gateway = gateway_for(cfg)
    assert isinstance(gateway.cache, MemoryCache)
    messages = [{"role": "user", "content": "hello"}]
    first = gateway.complete("m", messages)
    second = gateway.complete("m", messages)

    assert first.ok and not first.cached and first.text == "echo: hello"
    assert second.ok and second.cached and second.text == "echo: hello"
    assert len(fake_llm.calls) == 1  # the second call was answered by the new backend, not the server
    assert gateway.cache.hits == 1 and len(gateway.cache.rows) == 1


def test_an_unknown_cache_backend_names_the_registered_ones(tmp_path):
    path = _config(tmp_path, "http://127.0.0.1:9/v1", "memcache")
    with pytest.raises(InputError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:7: cache.backend: unknown cache backend 'memcache'")
    for name in ("none", "redis", "sqlite", "test-memory"):
        assert name in message
    with pytest.raises(ValueError, match="unknown cache backend 'memcache'"):
        open_cache("memcache")


def test_a_backend_name_cannot_be_taken_twice():
    with pytest.raises(ValueError, match="already registered"):
        register_cache_backend("sqlite")(open_memory_cache)


# ---------------------------------------------------------------- a pre-check


@pytest.fixture
def restore_prechecks():
    """A pre-check a test registers is removed again, so the others see only the built-ins."""
    from refusalbench.tasks.refusalbench.stages.prechecks import PRECHECKS

    before = set(PRECHECKS)
    yield
    for name in set(PRECHECKS) - before:
        PRECHECKS.remove(name)


@pytest.mark.usefixtures("restore_prechecks")
def test_a_new_precheck_is_one_function_and_one_decorator():
    from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, Lever, LeverExample
    from refusalbench.tasks.refusalbench.stages.prechecks import precheck_names, register_precheck, run_prechecks

    @register_precheck("question_shouts")
    def question_shouts(candidate, item, lever):
        return "the question is in capitals" if candidate.question.isupper() else None

    lever = Lever(
        id="x",
        name="X",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        target="query-context",
        instruction="do",
        example=LeverExample(question="q", context="c", expected="ANSWER_CORRECTLY", answer="a"),
        multi_document="m",
    )
    item = BaseItem(
        id="b1", question="When was the bridge opened?", answers=["1932"], context="The bridge opened in 1932."
    )
    fields = dict(
        candidate_id="c1",
        assignment_id="a1",
        base_id="b1",
        lever_id="x",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        variant="single",
        generator="g",
        status="ok",
        expected="ANSWER_CORRECTLY",
        prompt_hash="h",
        context="The bridge opened in 1933.",
    )

    assert precheck_names()[-1] == "question_shouts"
    assert run_prechecks(Candidate(**fields, question="WHEN WAS THE BRIDGE OPENED?"), item, lever) == [
        "question_shouts: the question is in capitals"
    ]
    assert run_prechecks(Candidate(**fields, question="When was the bridge closed?"), item, lever) == []


# ---------------------------------------------------------------- one Registry, one collision policy


def test_a_second_registration_of_a_name_raises_unless_replacing():
    from refusalbench.tasks.core.registry import Registry

    widgets: Registry[object] = Registry("widget")
    widgets.add("plain", 1)
    with pytest.raises(ValueError, match=r"^widget 'plain' is already registered; pass replace=True to replace it$"):
        widgets.add("plain", 2)
    assert widgets["plain"] == 1  # the refused registration changed nothing

    @widgets.register("made")
    def make_widget():
        return 3

    with pytest.raises(
        ValueError,
        match=r"widget 'made' is already registered by "
        rf"{re.escape(__name__)}\.test_a_second_registration_of_a_name_raises_unless_replacing\.<locals>\.make_widget",
    ):
        widgets.register("made")(lambda: 4)
    assert widgets["made"] is make_widget

    assert widgets.add("plain", 2, replace=True) == 2 and widgets.lookup("plain") == 2
    replacement = widgets.register("made", replace=True)(lambda: 5)
    assert widgets["made"] is replacement and list(widgets) == ["plain", "made"]
    with pytest.raises(ValueError, match=r"^unknown widget 'other' \(known: plain, made\)$"):
        widgets.lookup("other")
    with pytest.raises(ValueError, match="a widget needs a name"):
        widgets.add(" ", 6)


def _project_registries():
    """(registry, existing name, a registration of something else under that name) for every registry."""
    from refusalbench.tasks.core.config import CONFIG_CHECKS
    from refusalbench.tasks.core.eval_spec import EvalSpec
    from refusalbench.tasks.knowornot.stages.embeddings import EMBEDDERS, HashingEmbedder, register_embedder
    from refusalbench.tasks.knowornot.stages.evaluation import EVAL_SPECS, register_eval_spec
    from refusalbench.tasks.knowornot.stages.retrieval import RETRIEVERS, register_retriever
    from refusalbench.tasks.llm.callcache import CACHE_BACKENDS
    from refusalbench.tasks.refusalbench.basesets.readers import READERS, register_reader
    from refusalbench.tasks.refusalbench.rule_generator import RULES, register_rule
    from refusalbench.tasks.refusalbench.stages.prechecks import PRECHECKS, register_precheck

    spec = EvalSpec(name="abstention", tag="other", outcomes=["a", "b"], prompt="p")
    return [
        (
            CACHE_BACKENDS,
            "sqlite",
            lambda replace: register_cache_backend("sqlite", replace=replace)(open_memory_cache),
        ),
        (
            PRECHECKS,
            "unchanged",
            lambda replace: register_precheck("unchanged", replace=replace)(lambda c, i, label: None),
        ),
        (
            RULES,
            "missing-info-medium-answer-clause-excised",
            lambda replace: register_rule("missing-info-medium-answer-clause-excised", replace=replace)(
                lambda item, key: None
            ),
        ),
        (
            READERS,
            ".csv",
            lambda replace: register_reader(".csv", replace=replace)(lambda path, problems, limit: iter(())),
        ),
        (RETRIEVERS, "direct", lambda replace: register_retriever("direct", replace=replace)(lambda query, kb, k: [])),
        (
            EMBEDDERS,
            "hashing",
            lambda replace: register_embedder("hashing", replace=replace)(lambda: HashingEmbedder(dimension=8)),
        ),
        (EVAL_SPECS, "abstention", lambda replace: register_eval_spec(spec, replace=replace)),
        (
            CONFIG_CHECKS,
            "cache.backend",
            lambda replace: CONFIG_CHECKS.register("cache.backend", replace=replace)(lambda cfg: None),
        ),
    ]


def test_every_registry_refuses_a_second_registration_unless_replacing():
    for registry, name, register_other in _project_registries():
        original = registry[name]
        with pytest.raises(ValueError, match=f"{registry.kind} '{name}' is already registered"):
            register_other(False)
        assert registry[name] is original, registry.kind
        try:
            register_other(True)
            assert registry[name] is not original, registry.kind
        finally:
            registry.add(name, original, replace=True)
        assert registry[name] is original
