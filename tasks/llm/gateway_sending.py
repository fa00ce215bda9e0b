"""The gateway's sending of one call: retries with backoff, 429 pauses, structured-output fallbacks, a second try.

- Errors are retried with exponential backoff and full jitter, up to the model's ``max_attempts``.
- A 429 is no error: every call of the model waits out the pause the provider asks for
  (``rate_limits``), within the model's ``max_rate_limit_wait_s``.
- A 400 rejecting the structured-output mode lowers the model's mode for the rest of the run
  (``structured_modes``) and the call goes again in the lower mode.
- A reply that is no answer is sent once more when its outcome is worth it (``reply_outcomes``).

The gateway keeps the call cache, the deduplication of identical calls and the results; this
module only gets a call's reply (its cached value) under the model's limits.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Protocol, cast

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.call_requests import build_request, tpm_tokens
from refusalbench.tasks.llm.call_values import call_value
from refusalbench.tasks.llm.callcache import WriteBehind
from refusalbench.tasks.llm.calls import CallSpec
from refusalbench.tasks.llm.prompt_cache import expected_amounts
from refusalbench.tasks.llm.providers import ProviderProfile, StructuredMode, structured_mode
from refusalbench.tasks.llm.rate_limits import MARGIN_S, ProcessLimits
from refusalbench.tasks.llm.reply_outcomes import retry_params
from refusalbench.tasks.llm.shared_limits import RedisLimits, SharedModelLimits
from refusalbench.tasks.llm.structured_modes import StructuredModes
from refusalbench.tasks.llm.transport import CallFailed, DirectClient, Reply, Request, litellm_completion

# What sending a call came to: (its cached value, or None; requests sent; the error when no reply came).
Sent = tuple[dict[str, Any] | None, int, str | None]

# The gateway's logger: a call's failures are logged as the gateway's, wherever the code sits.
log = logging.getLogger("refusalbench.gateway")


class SendingGateway(Protocol):
    """What sending uses of the gateway (the gateway imports this module, so it is named here instead of
    imported); read at each call, as a caller may change the endpoints or the path of a live gateway."""

    @property
    def usage(self) -> accounting.UsageCounters: ...

    @property
    def writes(self) -> WriteBehind: ...

    @property
    def api_bases(self) -> dict[str, str]: ...

    @property
    def direct_http(self) -> bool: ...

    @property
    def backoff_base_s(self) -> float: ...

    @property
    def backoff_max_s(self) -> float: ...

    def profile(self, model: str, cfg: ModelConfig) -> ProviderProfile: ...

    def backoff(self, attempt: int, retry_after: float | None) -> float: ...


class Sender:
    """A gateway's requests (one per gateway): each model's limits, structured-output modes and the direct client."""

    def __init__(self, gateway: SendingGateway, limits_url: str | None = None, lease_s: float = 30.0):
        self.gateway = gateway
        self.direct = DirectClient()
        self._limits: dict[str, ProcessLimits | SharedModelLimits] = {}  # each model's, counted here or in Redis
        self.shared_limits = RedisLimits(limits_url, lease_s) if limits_url else None
        self.structured = StructuredModes()

    def _count(self, model: str, stage: str | None = None, /, **amounts: float) -> None:
        self.gateway.usage.count(model, stage, **amounts)

    async def send_for_outcome(self, spec: CallSpec, cfg: ModelConfig, first: Sent | None = None) -> Sent:
        """Send (with retries on errors), then once more if the reply's outcome is worth it
        (``reply_outcomes.retry_params``): an empty, truncated or blocked reply is sent at most twice.
        ``first``: the first reply, already come (from a batch), as (value, attempts, None)."""
        value, attempts, error = first or await self._send_with_retries(spec, cfg)
        params = (
            retry_params(value, cfg, spec.params, self.gateway.profile(spec.model, cfg)) if value is not None else None
        )
        if value is None or params is None:
            return value, attempts, error
        self._count(spec.model, outcome_retries=1)
        second, more, _ = await self._send_with_retries(spec.model_copy(update={"params": params}), cfg)
        if second is None:  # the second try failed outright: the first reply says more about the row
            return value, attempts + more, None
        second = accounting.add_billing(value, second)  # the first reply was billed too
        if params != spec.params:
            second["retried_with"] = {k: v for k, v in params.items() if spec.params.get(k) != v}
        return second, attempts + more, None

    def limits_for(self, model: str, cfg: ModelConfig) -> ProcessLimits | SharedModelLimits:
        if model not in self._limits:
            self._limits[model] = (
                self.shared_limits.for_model(model, cfg)
                if self.shared_limits
                else ProcessLimits(cfg.max_concurrency, cfg.rpm, cfg.tpm)
            )
        return self._limits[model]

    async def _send_with_retries(self, spec: CallSpec, cfg: ModelConfig) -> Sent:
        """Send until a reply comes; (value, requests sent, error). Errors are retried up to
        ``max_attempts``. A 429 is not an error: the model pauses for as long as the provider asks
        (:meth:`_rate_limited`), within ``max_rate_limit_wait_s``. A 400 rejecting the structured-
        output mode lowers the model's mode (:meth:`_fell_back`) and the call goes again in it."""
        sent = errors = limited = 0
        limited_since: float | None = None
        last_error = "no attempt made"
        while True:
            sent += 1
            modes: list[StructuredMode | None] = []  # the structured mode this attempt went in
            try:
                return await self._send_once(spec, cfg, modes), sent, None
            except CallFailed as failure:
                mode = modes[0] if modes else None
                last_error = str(failure)
                log.debug(
                    "call to %s failed (request %d, %d/%d errors): %s",
                    spec.model,
                    sent,
                    errors,
                    cfg.max_attempts,
                    failure,
                )
                if mode is not None and self._fell_back(spec, cfg, mode, failure):
                    continue
                if failure.rate_limited and failure.retriable:
                    limited += 1
                    limited_since = limited_since if limited_since is not None else time.monotonic()
                    problem = self._rate_limited(spec, cfg, failure, limited, limited_since)
                    if problem is None:
                        continue
                    last_error = f"{last_error}; {problem}"
                    break
                errors += 1
                if not failure.retriable or errors >= cfg.max_attempts:
                    break
                self._count(spec.model, retries=1)
                await asyncio.sleep(self.gateway.backoff(errors, failure.retry_after))
        return None, sent, f"{last_error} (after {sent} attempt{'s' if sent > 1 else ''})"

    def structured_mode(self, spec: CallSpec, cfg: ModelConfig) -> StructuredMode | None:
        """The structured-output mode this call goes in (None: no schema): the model's fallback, else its profile's."""
        if spec.schema_ is None:
            return None
        return cast(
            StructuredMode,
            self.structured.mode(spec.model, structured_mode(cfg, self.gateway.profile(spec.model, cfg))),
        )

    def _fell_back(self, spec: CallSpec, cfg: ModelConfig, mode: StructuredMode, failure: CallFailed) -> bool:
        """Whether ``failure`` is the provider rejecting structured output in ``mode``; then the model
        uses the profile's fallback mode for the rest of the run, and the call is to be sent again."""
        profile = self.gateway.profile(spec.model, cfg)
        fallback = profile.fallback_mode(mode)
        if fallback is None or not profile.rejects_structured_output(failure.status, str(failure), mode):
            return False
        if self.structured.fall_back(spec.model, mode, fallback):
            self._count(spec.model, structured_fallbacks=1)
            log.warning(
                "%s: the provider rejected structured output as %s (%s); using %s for the rest of the run "
                "(json_schema: false in the model's config skips the first try)",
                spec.model,
                mode,
                failure,
                fallback,
            )
        return True

    def _rate_limited(
        self, spec: CallSpec, cfg: ModelConfig, failure: CallFailed, limited: int, limited_since: float
    ) -> str | None:
        """Pause the model for as long as a 429 asks (every call of it waits the pause out); None
        when this call may wait for it, else why not: the provider's quota is spent, or the wait
        would take the call past ``max_rate_limit_wait_s`` since its first 429."""
        self._count(spec.model, rate_limited=1)
        if self.gateway.profile(spec.model, cfg).quota_exhausted(str(failure)):
            return "the provider says the account's quota is used up: waiting will not help"
        if failure.retry_after is not None:
            wait = failure.retry_after + MARGIN_S
        else:  # nothing announced: back off, growing with this call's 429s
            ceiling = min(self.gateway.backoff_max_s, self.gateway.backoff_base_s * 2 ** (limited - 1))
            wait = ceiling / 2 + random.uniform(0, ceiling / 2)
        limiter = self.limits_for(spec.model, cfg)
        limiter.pause(wait)
        waited = time.monotonic() - limited_since
        if waited + limiter.paused_for > cfg.max_rate_limit_wait_s:
            return (
                f"still rate limited after {limited} 429s and {waited:.1f} s of waiting; the provider asks for "
                f"{limiter.paused_for:.1f} s more, beyond max_rate_limit_wait_s ({cfg.max_rate_limit_wait_s:g} s)"
            )
        return None

    async def _send_once(self, spec: CallSpec, cfg: ModelConfig, modes: list[StructuredMode | None]) -> dict[str, Any]:
        async with self.limits_for(spec.model, cfg).slot(tpm_tokens(spec, cfg, self.gateway.profile(spec.model, cfg))):
            self.gateway.writes.flush()  # the replies come so far are committed before another request goes out
            self._count(spec.model, spec.stage, http_calls=1)
            # The mode is read once the slot is held: a call that waited for it goes in any
            # fallback a call in flight has met meanwhile (appended for the caller to see).
            modes.append(mode := self.structured_mode(spec, cfg))
            request = self.request(spec, cfg, mode)
            started = time.perf_counter()
            if request.body is not None and request.api_base is not None:  # the direct path: always an endpoint
                headers = {
                    "Authorization": f"Bearer {request.api_key}",
                    "Content-Type": "application/json",
                    **cfg.extra_headers,
                }
                reply = await self.direct.complete(
                    request.api_base, request.body, headers, cfg.timeout_s, request.profile
                )
            else:
                reply = await litellm_completion(
                    cfg.model, request.messages, cfg.timeout_s, request.kwargs, request.profile
                )
            latency = time.perf_counter() - started
        return self.value(spec, cfg, reply, latency)

    def request(self, spec: CallSpec, cfg: ModelConfig, mode: StructuredMode | None) -> Request:
        return build_request(
            spec,
            cfg,
            self.gateway.api_bases.get(spec.model) or cfg.api_base,
            mode,
            direct_http=self.gateway.direct_http,
        )

    def value(
        self, spec: CallSpec, cfg: ModelConfig, reply: Reply, latency: float, *, batch: bool = False
    ) -> dict[str, Any]:
        """The cached value of a completed call (``call_values``), its tokens and cost counted."""
        value = call_value(cfg, reply, latency, batch=batch)
        expected = {} if batch else expected_amounts(cfg, spec)  # what its shared prefix should save
        self._count(spec.model, spec.stage, **accounting.billed_amounts(value), **expected)
        return value
