"""Rate limits as providers announce them, and the limiter all calls of one model share.

A 429 says how long to wait in one of several ways, and each provider picks its own:

- ``Retry-After``: seconds (``2``) or an HTTP-date (``Wed, 21 Oct 2025 07:28:00 GMT``);
- ``retry-after-ms``: milliseconds (OpenAI, Azure);
- ``x-ratelimit-reset-requests`` / ``x-ratelimit-reset-tokens``: a Go duration (``1s``, ``6m0s``,
  ``250ms``) until that budget refills, beside ``x-ratelimit-remaining-*`` (OpenAI and the servers
  that copy it);
- ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset``: an RFC 3339 time,
  beside ``anthropic-ratelimit-*-remaining`` (Anthropic).

:func:`announced_wait` reads them all. The gateway then pauses the model's :class:`ModelLimiter`
for that long: every call of the model in this process waits the pause out before it is sent,
instead of each retrying early on its own; the limiter also spaces requests to ``rpm`` and
tokens to ``tpm``.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any


def retry_delay(attempt: int, retry_after: float | None, base_s: float, max_s: float) -> float:
    """Seconds before retrying a failed call's ``attempt``-th error: the provider's ``retry_after`` when
    it gave one (capped at ``max_s``), else exponential backoff with full jitter, which spreads the
    retries of many concurrent calls instead of synchronising them."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), max_s)
    return random.uniform(0, min(max_s, base_s * 2 ** (attempt - 1)))


# Added to every announced wait: an HTTP-date is rounded to the second and a sleep may end a
# hair early, so a retry at the exact instant could still be refused.
MARGIN_S = 0.05

# The budgets a provider announces a reset for, per header family.
_OPENAI_KINDS = ("requests", "tokens")
_ANTHROPIC_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|h|m|s)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration_seconds(text: str) -> float | None:
    """Seconds in a Go duration as OpenAI's reset headers write it (``250ms``, ``2s``, ``6m0s``,
    ``1h2m3.5s``); a bare number is seconds. None when it is neither."""
    text = text.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    total, position = 0.0, 0
    for part in _GO_PART.finditer(text):
        if part.start() != position:
            return None
        total += float(part.group(1)) * _GO_UNITS[part.group(2)]
        position = part.end()
    return total if text and position == len(text) else None


def retry_after_seconds(value: str, now: float) -> float | None:
    """Seconds from ``now`` (epoch) a ``Retry-After`` value asks for: delta-seconds or an HTTP-date."""
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT
        when = when.replace(tzinfo=UTC)
    return max(when.timestamp() - now, 0.0)


def rfc3339_seconds(value: str, now: float) -> float | None:
    """Seconds from ``now`` (epoch) until an RFC 3339 time (``2025-10-21T07:28:00Z``)."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(when.timestamp() - now, 0.0)


def _remaining(headers: Mapping[str, str], name: str) -> float | None:
    try:
        return float(headers[name])
    except (KeyError, TypeError, ValueError):
        return None


def announced_wait(headers: Mapping[str, Any] | None, now: float | None = None) -> float | None:
    """Seconds a provider's response headers ask to wait before the next request; None when
    they say nothing. Header names are matched case-insensitively.

    ``retry-after-ms`` and ``Retry-After`` say it outright and win. Otherwise the reset headers
    do: the reset of each budget that is used up (its ``remaining`` is 0), or of every budget
    announced when none says so; the latest of them, since a request needs all of them.
    """
    if not headers:
        return None
    lower = {str(name).lower(): str(value) for name, value in headers.items()}
    now = time.time() if now is None else now
    if "retry-after-ms" in lower:
        try:
            return max(float(lower["retry-after-ms"]) / 1000.0, 0.0)
        except ValueError:
            pass
    if "retry-after" in lower:
        seconds = retry_after_seconds(lower["retry-after"], now)
        if seconds is not None:
            return seconds
    resets: list[tuple[float, float | None]] = []  # (seconds, remaining)
    for kind in _OPENAI_KINDS:
        value = lower.get(f"x-ratelimit-reset-{kind}")
        seconds = go_duration_seconds(value) if value is not None else None
        if seconds is not None:
            resets.append((seconds, _remaining(lower, f"x-ratelimit-remaining-{kind}")))
    for kind in _ANTHROPIC_KINDS:
        value = lower.get(f"anthropic-ratelimit-{kind}-reset")
        seconds = rfc3339_seconds(value, now) if value is not None else None
        if seconds is not None:
            resets.append((seconds, _remaining(lower, f"anthropic-ratelimit-{kind}-remaining")))
    used_up = [seconds for seconds, remaining in resets if remaining is not None and remaining <= 0]
    chosen = used_up or [seconds for seconds, _ in resets]
    return max(chosen) if chosen else None


class ModelLimiter:
    """What paces one model's requests in this process: starts at least 60/``rpm`` seconds apart,
    at most ``tpm`` tokens a minute (a token bucket; a request takes its prompt tokens plus its
    ``max_tokens``, as OpenAI counts them), and a pause after a 429 that every caller waits out."""

    def __init__(self, rpm: int | None = None, tpm: int | None = None):
        self.interval = 60.0 / rpm if rpm else 0.0
        self.tpm = tpm
        self._next = 0.0
        self._level = float(tpm or 0)  # tokens in the bucket; below 0 while requests are owed
        self._filled_at = time.monotonic()
        self._paused_until = 0.0
        self._lock = asyncio.Lock()

    def pause(self, seconds: float) -> None:
        """No request of this model starts for ``seconds`` from now (a longer pause stands)."""
        self._paused_until = max(self._paused_until, time.monotonic() + max(seconds, 0.0))

    @property
    def paused_for(self) -> float:
        """Seconds left of the current pause (0 when none)."""
        return max(self._paused_until - time.monotonic(), 0.0)

    async def wait(self, tokens: int = 0) -> None:
        """Return when a request of about ``tokens`` tokens may start."""
        if self.tpm and tokens:
            await self._take_tokens(
                min(tokens, self.tpm), self.tpm
            )  # a request larger than the bucket waits for a full one
        if self.interval:
            async with self._lock:
                now = time.monotonic()
                start = max(now, self._next)
                self._next = start + self.interval
            if start > now:
                await asyncio.sleep(start - now)
        # Last, so a pause set while this call waited for its slot holds it back too.
        while (left := self._paused_until - time.monotonic()) > 0:
            await asyncio.sleep(left)

    async def _take_tokens(self, tokens: int, tpm: int) -> None:
        """Take ``tokens`` from the bucket of ``tpm`` (``self.tpm``, known to be set), waiting for any deficit."""
        rate = tpm / 60.0
        async with self._lock:
            now = time.monotonic()
            self._level = min(float(tpm), self._level + (now - self._filled_at) * rate)
            self._filled_at = now
            self._level -= tokens  # reserved now; a deficit is paid back by waiting
            owed = -self._level
        if owed > 0:
            await asyncio.sleep(owed / rate)


class Slot:
    """``async with limits.slot(tokens):`` holds one of a model's concurrency slots, paced, for one request."""

    __slots__ = ("limits", "tokens", "token")

    def __init__(self, limits: Any, tokens: int):  # ProcessLimits, or shared_limits.SharedModelLimits
        self.limits = limits
        self.tokens = tokens
        self.token: Any = None

    async def __aenter__(self) -> None:
        self.token = await self.limits.acquire(self.tokens)

    async def __aexit__(self, *exc: object) -> None:
        self.limits.release(self.token)


class ProcessLimits:
    """One model's ``max_concurrency``, ``rpm``, ``tpm`` and 429 pause, counted in this process
    alone (the embedded default; ``shared_limits`` counts them across processes)."""

    def __init__(self, max_concurrency: int, rpm: int | None = None, tpm: int | None = None):
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self.limiter = ModelLimiter(rpm, tpm)

    def slot(self, tokens: int = 0) -> Slot:
        return Slot(self, tokens)

    async def acquire(self, tokens: int = 0) -> None:
        await self._semaphore.acquire()
        try:
            await self.limiter.wait(tokens)
        except BaseException:
            self._semaphore.release()
            raise

    def release(self, token: None = None) -> None:
        self._semaphore.release()

    def pause(self, seconds: float) -> None:
        self.limiter.pause(seconds)

    @property
    def paused_for(self) -> float:
        return self.limiter.paused_for
