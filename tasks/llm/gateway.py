"""The model gateway: every LLM call of the project goes through here.

- LiteLLM ``acompletion`` underneath, so any provider works; the SDK's own retries are
  switched off and the gateway retries instead (``gateway_sending``), so attempts per call stay bounded.
  Self-hosted models behind an OpenAI-compatible ``api_base`` take a direct path
  (``transport``): the same request body, posted without LiteLLM's per-call machinery.
- Per-model concurrency, requests- and tokens-per-minute limits: process-wide (every call runs on
  one background event loop) or, with ``limits_url``, across all processes, in Redis (``shared_limits``).
- Accounting (``accounting``): calls, tokens and cost per model and per stage (the caller's tag, not
  the time), priced by the model's ``price`` in the config over LiteLLM's map; unknown is None.
- Exponential backoff with full jitter on 5xx/timeouts/garbled replies, up to ``max_attempts``.
  A 429 is no error: it waits as long as the provider says (``rate_limits``: Retry-After as
  seconds or an HTTP-date, retry-after-ms, the reset headers), pausing every call of the model,
  within the model's ``max_rate_limit_wait_s``.
- A prompt longer than the model's context window less ``max_tokens`` is not sent: the call is
  ``too_long`` (``context_limits``).
- A reply that is no answer has an outcome (``reply_outcomes``): ``truncated``
  (finish reason length), ``provider_blocked`` (content filter, refusal, a 400 saying the
  content was filtered), ``empty``. It is a result with ``error`` set, never parsed, billed like
  any reply, and sent at most twice: once more when empty, or truncated with the model's
  ``retry_truncated_max_tokens``; never when blocked. A structured call's such reply is never
  cached (a re-run asks again).
- A persistent call cache keyed by (model, deployment, messages, parameters, response schema),
  scoped per role (``cache_scope``: forever, per round, ttl), written as each call completes (the
  calls completing together in one transaction, before the next request goes out: ``WriteBehind``);
  identical requests in flight are sent once.
- Provider quirks (structured-output mode, credentials, parameter rewrites, retriable
  statuses, the direct path) come from the model's provider profile (``providers``).
- Structured output: a pydantic schema becomes the ``response_format`` the profile's mode asks
  for and the reply is validated; a reply that does not parse is a recorded parse error. A 400
  rejecting the mode lowers it for the rest of the run (``structured_modes``) and the call is
  sent again in the lower mode.
- A failed call returns a ``CallResult`` with ``error`` set; it never raises into the batch.
- A model's calls in ``mode: batch`` for their stage go through its provider's batch API (``batch_calls``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.batch_calls import BatchCalls
from refusalbench.tasks.llm.cache_scope import CacheScope
from refusalbench.tasks.llm.call_fields import REPLY_METADATA
from refusalbench.tasks.llm.call_requests import too_long
from refusalbench.tasks.llm.call_values import result_fields
from refusalbench.tasks.llm.callcache import CallCache, NullCache, WriteBehind

# What a call is lives in ``calls`` (its metadata fields in ``call_fields``); the stages import
# these names from here too (``__all__``).
from refusalbench.tasks.llm.calls import (
    CACHE_VERSION,
    CallResult,
    CallSpec,
    json_schema,
    parse_structured,
    request_key,
    schema_name,
)
from refusalbench.tasks.llm.calls_ahead import CallsAhead
from refusalbench.tasks.llm.gateway_sending import Sender, Sent
from refusalbench.tasks.llm.loop_thread import Handoff, LoopThread, wave_for
from refusalbench.tasks.llm.providers import (
    ProviderProfile,
    profile_for,
    reasoning_mode,
)
from refusalbench.tasks.llm.rate_limits import retry_delay
from refusalbench.tasks.llm.reply_outcomes import OK, TOO_LONG, cacheable, final_outcome, outcome_error
from refusalbench.tasks.llm.transport import Reply, Request

# A call for ``Handoff.fill``: (index, the coroutine function, its argument).
Started = tuple[int, Callable[[Any], Awaitable[Any]], Any]

__all__ = [
    "CACHE_VERSION",
    "REPLY_METADATA",
    "CallResult",
    "CallSpec",
    "Gateway",
    "gateway_for",
    "json_schema",
    "parse_structured",
    "request_key",
    "schema_name",
    "shared_gateway",
]

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
log = logging.getLogger("refusalbench.gateway")
T = TypeVar("T")


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
        scope: CacheScope | None = None,
        limits_url: str | None = None,
        lease_s: float = 30.0,
    ):
        self.models = models
        self.cache: CallCache = cache if cache is not None else NullCache()
        # The call cache as the loop reads and writes it: one commit per turn of the loop (also the batch path's).
        self.writes = WriteBehind(self.cache)
        self.scope = scope if scope is not None else CacheScope()  # each role's cache scope (cache_scope)
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        # Endpoints discovered at run time (a local llama.cpp server we started).
        self.api_bases: dict[str, str] = dict(api_bases or {})
        # False: every call through LiteLLM (benchmarks compare the two paths).
        self.direct_http = direct_http
        self._loop = LoopThread()
        # Each call's requests: retries, 429 pauses, structured-output fallbacks (``gateway_sending``).
        self._sender = Sender(self, limits_url, lease_s)
        self._loop.cleanups.append(self._sender.direct.close)
        self._loop.cleanups += [self._sender.shared_limits.close] if self._sender.shared_limits else []
        self._inflight: dict[str, asyncio.Future[Sent]] = {}
        self._ahead = CallsAhead()  # calls started before their asker asks (``start_ahead``)
        self.usage = accounting.UsageCounters()  # per model and per stage, for the run's manifest
        self._batches = BatchCalls(self)  # the calls of models in mode: batch

    # ------------------------------------------------------------ public API

    def complete_many(
        self,
        specs: Iterable[CallSpec],
        on_result: Callable[[CallResult], None] | None = None,
    ) -> list[CallResult]:
        """Run many calls concurrently (within each model's limits); results in input order. A model's
        calls in ``mode: batch`` for their stage go through its batch API (``batch_calls``)."""
        specs = accounting.tagged(specs)
        batched = self._batches.futures(specs)  # {index: future} of the batch-mode specs, already sent
        handoff = Handoff(len(specs), wave_for(self.models, specs))  # the rest: one submission to the loop
        # The rest, their cached replies read a wave at a time, before the wave starts (``CacheScope.reading_ahead``).
        sent: list[Started] = [(i, self.send, spec) for i, spec in enumerate(specs) if i not in batched]
        self._loop.submit(self.scope.reading_ahead(self.writes, self.models, lambda ahead: handoff.fill(sent, ahead)))
        results: list[CallResult] = []
        for i in range(len(specs)):
            result = batched[i].result() if i in batched else handoff.get(i)
            if on_result is not None:
                on_result(result)
            results.append(result)
        return results

    async def acomplete_many(self, specs: Iterable[CallSpec]) -> list[CallResult]:
        specs = accounting.tagged(specs)
        handoff = Handoff(len(specs), wave_for(self.models, specs))
        calls: list[Started] = [(i, self.send, s) for i, s in enumerate(specs)]
        await asyncio.wrap_future(
            self._loop.submit(
                self.scope.reading_ahead(self.writes, self.models, lambda ahead: handoff.fill(calls, ahead))
            )
        )
        return [handoff.get(i) for i in range(len(specs))]

    def start_ahead(self, specs: Iterable[CallSpec]) -> None:
        """Start ``specs`` and return at once, for a caller in this process that asks for the same calls
        later and gets what they came to (``calls_ahead``); each spec names its ``stage``."""
        self._loop.submit(self._start_ahead(list(specs)))

    async def _start_ahead(self, specs: list[CallSpec]) -> None:
        for spec in specs:
            if (cfg := self.models.get(spec.model)) is not None:
                self._ahead.start(self.scope.key(cfg, spec), functools.partial(self._answer, spec, asked=False))

    def complete(
        self, model: str, messages: list[dict[str, str]], schema: type[BaseModel] | None = None, **params: Any
    ) -> CallResult:
        return self.complete_many([CallSpec(model=model, messages=messages, schema=schema, params=params)])[0]

    async def acomplete(
        self, model: str, messages: list[dict[str, str]], schema: type[BaseModel] | None = None, **params: Any
    ) -> CallResult:
        return (await self.acomplete_many([CallSpec(model=model, messages=messages, schema=schema, params=params)]))[0]

    def stats_snapshot(self) -> dict[str, dict[str, float]]:
        return self.usage.snapshot()

    def stage_snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        """{stage: {model: counters}}: calls, tokens and cost by the stage each call was tagged with."""
        return self.usage.stage_snapshot()

    def structured_output_fallbacks(self) -> dict[str, str]:
        """{model: mode} for each model whose provider rejected its structured-output mode in this process."""
        return self._sender.structured.fallbacks()

    # ------------------------------------------------------------ requests other than chat calls

    def limited(self, model: str, tokens: int, work: Callable[[], T]) -> T:
        """``work()`` (one blocking request to ``model`` that is no chat call: an embedding request) done
        while it holds one of the model's slots: the limits its chat calls take (``max_concurrency``,
        ``rpm``, ``tpm`` with ``tokens``; shared through Redis where the config shares them)."""
        limits = self._sender.limits_for(model, self.models[model])

        async def held() -> T:
            async with limits.slot(tokens):
                return await asyncio.to_thread(work)

        return self._loop.submit(held()).result()

    def pause(self, model: str, seconds: float) -> None:
        """Pause ``model``'s requests (every process's, where its limits are shared) after a 429."""
        limits = self._sender.limits_for(model, self.models[model])

        async def paused() -> None:  # on the loop: the shared limits publish the pause from there
            limits.pause(seconds)

        self._loop.submit(paused()).result()

    # ------------------------------------------------------------ the batch path's interface
    # What ``batch_calls`` uses (besides ``models``, ``scope``, ``usage`` and ``writes``, the call cache as
    # this loop reads and writes it): each step of a call as the synchronous path takes it.

    def run_on_loop(self, work: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        """Start ``work`` on the gateway's event loop and return at once."""
        return self._loop.submit(work)

    async def send(self, spec: CallSpec) -> CallResult:
        """One call the synchronous way; its result once its reply (and every reply before it) is in the call cache."""
        result = await self._answer(spec)
        await self.writes.committed()
        return result

    def without_sending(self, spec: CallSpec, cfg: ModelConfig, key: str) -> CallResult | None:
        """``spec``'s result when it needs no request, counted: its reply in the call cache (in scope, usable,
        migrated), or a prompt too long for the window (the provider could not answer it: not sent, not cached)."""
        cached = self.scope.cached_reply(self.writes, key, spec, cfg, self.models)
        if cached is not None:
            self._count(spec.model, spec.stage, cache_hits=1)
            return self._finish(spec, key, cached, cached=True, attempts=0)
        too_long = self._too_long(spec, cfg)
        if too_long is None:
            return None
        self._count(spec.model, **{TOO_LONG: 1})
        return CallResult(model=spec.model, key=key, tag=spec.tag, error=too_long, error_kind=TOO_LONG)

    def request(self, spec: CallSpec, cfg: ModelConfig) -> Request:
        """What an attempt of ``spec`` sends now, in the model's structured-output mode of the moment."""
        return self._sender.request(spec, cfg, self._sender.structured_mode(spec, cfg))

    async def finish_batch_reply(
        self, specs: list[CallSpec], key: str, reply: Reply, latency: float
    ) -> list[CallResult]:
        """The results of ``specs`` (identical, request ``key``) from a batch API's reply: one request at the
        batch price, asked again synchronously when its outcome is worth it as a synchronous reply's is, in
        the call cache before the results are handed back; the specs after the first count as deduplicated."""
        spec, cfg = specs[0], self.models[specs[0].model]
        self._count(spec.model, spec.stage, http_calls=1)
        first = self._sender.value(spec, cfg, reply, latency, batch=True)
        value, attempts, _ = await self._sender.send_for_outcome(spec, cfg, first=(first, 1, None))
        value = value if value is not None else first  # given a first reply, never None
        if cacheable(value, structured=spec.schema_ is not None):
            self.writes.put(key, self.scope.stamped(value))
        await self.writes.committed()
        for each in specs[1:]:
            self._count(each.model, deduplicated=1)
        return [self._finish(each, key, value, cached=False, attempts=attempts) for each in specs]

    # ------------------------------------------------------------ internals

    def _count(self, model: str, stage: str | None = None, /, **amounts: float) -> None:
        self.usage.count(model, stage, **amounts)

    async def _answer(self, spec: CallSpec, asked: bool = True) -> CallResult:
        cfg = self.models.get(spec.model)
        if cfg is None:
            return CallResult(
                model=spec.model, key="", tag=spec.tag, error=f"unknown model {spec.model!r}", error_kind="call_error"
            )
        if cfg.rule_based:
            return CallResult(
                model=spec.model,
                key="",
                tag=spec.tag,
                error_kind="call_error",
                error=f"{spec.model!r} is the rule-based generator ({cfg.model}): it answers no prompt "
                "and can only be listed under generation.generators",
            )
        key = self.scope.key(cfg, spec)
        if asked and (ahead := self._ahead.take(key)) is not None:  # this call, started ahead: counted there
            return await asyncio.shield(ahead)
        if (answered := self.without_sending(spec, cfg, key)) is not None:
            return answered
        # Identical request already on its way: share its reply instead of sending again.
        pending = self._inflight.get(key)
        shared = pending is not None  # then served by its twin's reply, billed once: ``cached`` as a cache hit is
        if pending is not None:
            self._count(spec.model, deduplicated=1)
            value, attempts, error = await asyncio.shield(pending)
        else:
            pending = asyncio.get_running_loop().create_future()
            self._inflight[key] = pending
            try:
                value, attempts, error = await self._sender.send_for_outcome(spec, cfg)
                if value is not None and cacheable(value, structured=spec.schema_ is not None):
                    self.writes.put(key, self.scope.stamped(value))  # committed before any result is handed back
                pending.set_result((value, attempts, error))
            except BaseException as exc:  # pragma: no cover - defensive: never leave waiters hanging
                pending.set_result((None, 0, f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                self._inflight.pop(key, None)
        if value is None:
            self._count(spec.model, errors=1)
            return CallResult(
                model=spec.model, key=key, tag=spec.tag, error=error, error_kind="call_error", attempts=attempts
            )
        return self._finish(spec, key, value, cached=shared, attempts=attempts)

    def _finish(self, spec: CallSpec, key: str, value: dict[str, Any], *, cached: bool, attempts: int) -> CallResult:
        mode = reasoning_mode(self.models[spec.model], self.profile(spec.model, self.models[spec.model]))
        result = CallResult(
            model=spec.model, key=key, tag=spec.tag, attempts=attempts, cached=cached, **result_fields(value, mode)
        )
        if self._record_outcome(spec.model, result, value):
            return result
        if spec.schema_ is not None:
            parsed, problem = parse_structured(spec.schema_, result.text or "")
            if parsed is None:
                result.error = f"parse error: {problem}"
                result.error_kind = "parse_error"
                self._count(spec.model, parse_errors=1)
            result.parsed = parsed
        return result

    def _record_outcome(self, model: str, result: CallResult, value: dict[str, Any]) -> bool:
        """Mark ``result`` with its reply's outcome when that is no answer (truncated, blocked,
        empty); True then, and the reply is not parsed: a cut or filtered JSON is no output."""
        outcome = final_outcome(value, result.text)
        if outcome == OK:
            return False
        result.error = outcome_error(outcome, value.get("finish_reason"), value.get("refusal"), result.attempts)
        result.error_kind = outcome
        self._count(model, **{outcome: 1})
        return True

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        return retry_delay(attempt, retry_after, self.backoff_base_s, self.backoff_max_s)

    def profile(self, model: str, cfg: ModelConfig) -> ProviderProfile:
        return profile_for(cfg.model, self.api_bases.get(model) or cfg.api_base)

    def _too_long(self, spec: CallSpec, cfg: ModelConfig) -> str | None:
        return too_long(spec, cfg, self.profile(spec.model, cfg), self._sender.structured_mode(spec, cfg))


# ---------------------------------------------------------------- process-wide instances


def gateway_for(config: RunConfig | dict[str, Any], api_bases: dict[str, str] | None = None) -> Gateway:
    """The shared gateway of a RunConfig (stage tasks receive the typed config; a JSON dump
    of one, as some callers still pass, is validated first)."""
    cfg = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
    return shared_gateway(
        cfg.models,
        cfg.cache.backend,
        cfg.cache.path,
        cfg.cache.url,
        api_bases,
        CacheScope.of(cfg.cache),
        limits_url=cfg.limits.shared_url(cfg.cache.backend, cfg.cache.url),
        lease_s=cfg.limits.lease_s,
    )


_GATEWAYS: dict[str, Gateway] = {}
_GATEWAYS_LOCK = threading.Lock()


def shared_gateway(
    models: dict[str, ModelConfig],
    cache_backend: str = "sqlite",
    cache_path: str | None = None,
    cache_url: str | None = None,
    api_bases: dict[str, str] | None = None,
    scope: CacheScope | None = None,
    *,
    limits_url: str | None = None,
    lease_s: float = 30.0,
) -> Gateway:
    """One gateway per registry, cache and cache scope in this process, so limits hold across tasks."""
    from refusalbench.tasks.llm.callcache import open_cache

    ident = hashlib.sha256(
        json.dumps(
            [
                {k: v.model_dump(mode="json") for k, v in sorted(models.items())},
                cache_backend,
                cache_path,
                cache_url,
                *([scope.identity()] if scope is not None else []),
                *([limits_url, lease_s] if limits_url else []),
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    with _GATEWAYS_LOCK:
        gateway = _GATEWAYS.get(ident)
        if gateway is None:
            gateway = Gateway(
                models,
                open_cache(cache_backend, path=cache_path, url=cache_url),
                api_bases=api_bases,
                scope=scope,
                limits_url=limits_url,
                lease_s=lease_s,
            )
            _GATEWAYS[ident] = gateway
        elif api_bases:
            gateway.api_bases.update(api_bases)
        return gateway
