"""Extension points resolved through registries: adding one is a function plus a decorator.

Each test registers its extension here, in the test file, and reaches it through a config file,
the way a user's own module would: nothing in the project is edited or monkeypatched.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from refusalbench.tasks.llm.callcache import CallCache, cache_backends, open_cache, register_cache_backend
from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.core.errors import InputError
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
    path.write_text(textwrap.dedent(f"""
        models:
          m:
            model: openai/fake
            api_base: {api_base}
            max_attempts: 2
        cache:
          backend: {backend}
    """).lstrip("\n"), encoding="utf-8")
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
