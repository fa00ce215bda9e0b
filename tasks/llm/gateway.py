"""The model gateway: every LLM call of the project goes through here (DESIGN.md §3).

- LiteLLM ``acompletion`` underneath, so any provider works; the SDK's own retries are
  switched off and this module retries instead, so attempts per call stay bounded.
  Self-hosted models behind an OpenAI-compatible ``api_base`` take a direct path
  (``transport``): the same request body, posted without LiteLLM's per-call machinery.
- Per-model concurrency and requests-per-minute limits, process-wide: all calls run on
  one background event loop, whichever Prefect worker thread asked for them.
- Exponential backoff with full jitter on 429/5xx/timeouts/garbled replies, honouring
  ``Retry-After``.
- A persistent call cache keyed by (model, messages, parameters, response schema),
  written as each call completes; identical requests in flight are sent once.
- Provider quirks (structured-output mode, credentials, parameter rewrites, retriable
  statuses, the direct path) come from the model's provider profile (``providers``).
- Structured output: a pydantic schema becomes the ``response_format`` the profile's mode asks
  for and the reply is validated; a reply that does not parse is a recorded parse error.
- A failed call returns a ``CallResult`` with ``error`` set; it never raises into the batch.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import copy
import functools
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from refusalbench.tasks.llm.callcache import CallCache, NullCache
from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.llm.providers import profile_for, response_format_for, structured_mode
from refusalbench.tasks.llm.transport import CallFailed, DirectClient, Reply, direct_model, litellm_completion

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
log = logging.getLogger("refusalbench.gateway")

# Bump when the cached value's layout changes, so old rows are not misread.
CACHE_VERSION = 1


class CallSpec(BaseModel):
    """One chat completion to make."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = Field(description="registry name (key of RunConfig.models)")
    messages: list[dict[str, str]]
    schema_: type[BaseModel] | None = Field(default=None, alias="schema")
    params: dict[str, Any] = Field(default_factory=dict)
    tag: str | None = Field(default=None, description="caller's id for the call (not part of the cache key)")


class CallResult(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str
    key: str
    tag: str | None = None
    text: str | None = None
    parsed: Any = None
    error: str | None = None
    error_kind: str | None = Field(default=None, description="call_error | parse_error")
    attempts: int = 0
    cached: bool = False
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def schema_name(schema: type[BaseModel]) -> str:
    return schema.__name__


@functools.lru_cache(maxsize=None)
def _built_schema(schema: type[BaseModel]) -> dict[str, Any]:
    from refusalbench.tasks.llm.structured_outputs import json_schema_for

    return json_schema_for(schema)


def json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    # Self-contained schema (no $refs, every field required) so llama.cpp's grammar honours it.
    # Built once per output class (pydantic takes up to ~1 ms, twice per call, on the
    # gateway's single event-loop thread); each caller gets its own copy to change freely.
    return copy.deepcopy(_built_schema(schema))


def request_key(cfg: ModelConfig, messages: list[dict[str, str]], params: dict[str, Any], schema: type[BaseModel] | None) -> str:
    """Cache key: what determines the reply. Endpoint and credentials are not part of it,
    so a local server on a new port, or a rotated key, still hits the cache."""
    payload = {
        "v": CACHE_VERSION,
        "model": cfg.model,
        "messages": messages,
        "params": {**cfg.params, **params},
        "schema": json_schema(schema) if schema is not None else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def parse_structured(schema: type[BaseModel], text: str) -> tuple[BaseModel | None, str | None]:
    from refusalbench.tasks.llm.structured_outputs import parse_output

    return parse_output(schema, text)


class _RateLimiter:
    """Spaces request starts at least 60/rpm seconds apart (per model)."""

    def __init__(self, rpm: int | None):
        self.interval = 60.0 / rpm if rpm else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


class _LoopThread:
    """A private event loop on a daemon thread; all gateway coroutines run here."""

    def __init__(self) -> None:
        self.cleanups: list[Callable[[], Any]] = []  # coroutine functions run before the loop stops
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="refusalbench-gateway", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Cancel background tasks (LiteLLM's logging worker) and stop the loop, quietly."""
        if not self.loop.is_running():
            return

        async def cancel_all() -> None:
            for cleanup in self.cleanups:
                await cleanup()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=5)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Gateway:
    """Process-wide access to the models of one registry."""

    def __init__(
        self,
        models: dict[str, ModelConfig],
        cache: CallCache | None = None,
        *,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        api_bases: dict[str, str] | None = None,
        direct_http: bool = True,
    ):
        self.models = models
        self.cache: CallCache = cache if cache is not None else NullCache()
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        # Endpoints discovered at run time (a local llama.cpp server we started).
        self.api_bases: dict[str, str] = dict(api_bases or {})
        # False: every call through LiteLLM (benchmarks compare the two paths).
        self.direct_http = direct_http
        self._loop = _LoopThread()
        self._direct = DirectClient()
        self._loop.cleanups.append(self._direct.close)
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        self._limiters: dict[str, _RateLimiter] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self.stats: dict[str, Counter] = defaultdict(Counter)
        self._stats_lock = threading.Lock()

    # ------------------------------------------------------------ public API

    def complete_many(
        self,
        specs: Iterable[CallSpec],
        on_result: Callable[[CallResult], None] | None = None,
    ) -> list[CallResult]:
        """Run many calls concurrently (within each model's limits); results in input order."""
        futures = [self._loop.submit(self._complete(spec)) for spec in specs]
        results: list[CallResult] = []
        for fut in futures:
            result = fut.result()
            if on_result is not None:
                on_result(result)
            results.append(result)
        return results

    async def acomplete_many(self, specs: Iterable[CallSpec]) -> list[CallResult]:
        futures = [asyncio.wrap_future(self._loop.submit(self._complete(spec))) for spec in specs]
        return list(await asyncio.gather(*futures))

    def complete(self, model: str, messages: list[dict[str, str]], schema: type[BaseModel] | None = None, **params: Any) -> CallResult:
        return self.complete_many([CallSpec(model=model, messages=messages, schema=schema, params=params)])[0]

    async def acomplete(self, model: str, messages: list[dict[str, str]], schema: type[BaseModel] | None = None, **params: Any) -> CallResult:
        return (await self.acomplete_many([CallSpec(model=model, messages=messages, schema=schema, params=params)]))[0]

    def stats_snapshot(self) -> dict[str, dict[str, float]]:
        with self._stats_lock:
            return {model: dict(counter) for model, counter in self.stats.items()}

    # ------------------------------------------------------------ internals

    def _count(self, model: str, **amounts: float) -> None:
        with self._stats_lock:
            for name, amount in amounts.items():
                if amount:
                    self.stats[model][name] += amount

    async def _complete(self, spec: CallSpec) -> CallResult:
        cfg = self.models.get(spec.model)
        if cfg is None:
            return CallResult(model=spec.model, key="", tag=spec.tag, error=f"unknown model {spec.model!r}", error_kind="call_error")
        if cfg.rule_based:
            return CallResult(model=spec.model, key="", tag=spec.tag, error_kind="call_error",
                              error=f"{spec.model!r} is the rule-based generator ({cfg.model}): it answers no prompt "
                                    "and can only be listed under generation.generators")
        key = request_key(cfg, spec.messages, spec.params, spec.schema_)
        cached = self.cache.get(key)
        if cached is not None:
            self._count(spec.model, cache_hits=1)
            return self._finish(spec, key, cached, cached=True, attempts=0)
        # Identical request already on its way: share its reply instead of sending again.
        pending = self._inflight.get(key)
        if pending is not None:
            self._count(spec.model, deduplicated=1)
            value, attempts, error = await asyncio.shield(pending)
        else:
            pending = asyncio.get_running_loop().create_future()
            self._inflight[key] = pending
            try:
                value, attempts, error = await self._send_with_retries(spec, cfg)
                if value is not None:
                    self.cache.put(key, value)
                pending.set_result((value, attempts, error))
            except BaseException as exc:  # pragma: no cover - defensive: never leave waiters hanging
                pending.set_result((None, 0, f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                self._inflight.pop(key, None)
        if value is None:
            self._count(spec.model, errors=1)
            return CallResult(model=spec.model, key=key, tag=spec.tag, error=error, error_kind="call_error", attempts=attempts)
        return self._finish(spec, key, value, cached=False, attempts=attempts)

    def _finish(self, spec: CallSpec, key: str, value: dict[str, Any], *, cached: bool, attempts: int) -> CallResult:
        result = CallResult(
            model=spec.model,
            key=key,
            tag=spec.tag,
            text=value.get("text"),
            attempts=attempts,
            cached=cached,
            latency_s=value.get("latency_s"),
            prompt_tokens=value.get("prompt_tokens"),
            completion_tokens=value.get("completion_tokens"),
            cost_usd=value.get("cost_usd"),
        )
        if spec.schema_ is not None:
            parsed, problem = parse_structured(spec.schema_, result.text or "")
            if parsed is None:
                result.error = f"parse error: {problem}"
                result.error_kind = "parse_error"
                self._count(spec.model, parse_errors=1)
            result.parsed = parsed
        return result

    def _semaphore(self, model: str, cfg: ModelConfig) -> asyncio.Semaphore:
        if model not in self._semaphores:
            self._semaphores[model] = asyncio.Semaphore(cfg.max_concurrency)
            self._limiters[model] = _RateLimiter(cfg.rpm)
        return self._semaphores[model]

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max_s)
        # Full jitter: spreads retries of many concurrent calls instead of synchronising them.
        return random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)))

    async def _send_with_retries(self, spec: CallSpec, cfg: ModelConfig) -> tuple[dict[str, Any] | None, int, str | None]:
        last_error = "no attempt made"
        for attempt in range(1, cfg.max_attempts + 1):
            try:
                value = await self._send_once(spec, cfg)
                return value, attempt, None
            except CallFailed as failure:
                last_error = str(failure)
                log.debug("call to %s failed (attempt %d/%d): %s", spec.model, attempt, cfg.max_attempts, failure)
                if not failure.retriable or attempt == cfg.max_attempts:
                    break
                self._count(spec.model, retries=1)
                await asyncio.sleep(self._backoff(attempt, failure.retry_after))
        return None, attempt, f"{last_error} (after {attempt} attempt{'s' if attempt > 1 else ''})"

    async def _send_once(self, spec: CallSpec, cfg: ModelConfig) -> dict[str, Any]:
        semaphore = self._semaphore(spec.model, cfg)
        async with semaphore:
            await self._limiters[spec.model].wait()
            self._count(spec.model, http_calls=1)
            api_base = self.api_bases.get(spec.model) or cfg.api_base
            profile = profile_for(cfg.model, api_base)
            params = profile.rewrite_params({**cfg.params, **spec.params})
            api_key = profile.api_key(cfg, api_base)
            response_format = None
            if spec.schema_ is not None:
                response_format = response_format_for(structured_mode(cfg, profile), schema_name(spec.schema_),
                                                      json_schema(spec.schema_))
            direct = direct_model(cfg.model, api_base, params, spec.messages) if self.direct_http and api_key else None
            started = time.perf_counter()
            if direct is not None:
                body = {"messages": spec.messages, "model": direct, **params}
                if response_format is not None:
                    body["response_format"] = response_format
                headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json", **cfg.extra_headers}
                reply = await self._direct.complete(api_base, body, headers, cfg.timeout_s, profile)
            else:
                kwargs = dict(params)
                if api_base:
                    kwargs["api_base"] = api_base
                if api_key:
                    kwargs["api_key"] = api_key
                if cfg.extra_headers:
                    kwargs["extra_headers"] = cfg.extra_headers
                if response_format is not None:
                    kwargs["response_format"] = response_format
                reply = await litellm_completion(cfg.model, spec.messages, cfg.timeout_s, kwargs, profile)
            latency = time.perf_counter() - started
        return self._value(spec.model, reply, latency)

    def _value(self, model: str, reply: Reply, latency: float) -> dict[str, Any]:
        """The cached value of a completed call (the same layout on both paths)."""
        if not reply.text or not str(reply.text).strip():
            raise CallFailed("empty reply content", retriable=True)
        self._count(model, prompt_tokens=reply.prompt_tokens or 0, completion_tokens=reply.completion_tokens or 0,
                    cost_usd=reply.cost_usd or 0.0)
        return {
            "text": str(reply.text),
            "latency_s": round(latency, 4),
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "cost_usd": reply.cost_usd,
            "finish_reason": reply.finish_reason,
            "created_at": time.time(),
        }


# ---------------------------------------------------------------- process-wide instances

def gateway_for(config: RunConfig | dict[str, Any], api_bases: dict[str, str] | None = None) -> Gateway:
    """The shared gateway of a RunConfig (stage tasks receive the typed config; a JSON dump
    of one, as some callers still pass, is validated first)."""
    cfg = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
    return shared_gateway(cfg.models, cfg.cache.backend, cfg.cache.path, cfg.cache.url, api_bases)


_GATEWAYS: dict[str, Gateway] = {}
_GATEWAYS_LOCK = threading.Lock()


def shared_gateway(models: dict[str, ModelConfig], cache_backend: str = "sqlite", cache_path: str | None = None,
                   cache_url: str | None = None, api_bases: dict[str, str] | None = None) -> Gateway:
    """One gateway per registry and cache in this process, so limits hold across tasks."""
    from refusalbench.tasks.llm.callcache import open_cache

    ident = hashlib.sha256(
        json.dumps(
            [{k: v.model_dump(mode="json") for k, v in sorted(models.items())}, cache_backend, cache_path, cache_url],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    with _GATEWAYS_LOCK:
        gateway = _GATEWAYS.get(ident)
        if gateway is None:
            gateway = Gateway(models, open_cache(cache_backend, path=cache_path, url=cache_url), api_bases=api_bases)
            _GATEWAYS[ident] = gateway
        elif api_bases:
            gateway.api_bases.update(api_bases)
        return gateway
