"""Embedding requests through LiteLLM's embedding call, one batch of texts per request.

A model of the registry (``models:``) that serves embeddings (``openai/text-embedding-3-large``,
an OpenAI-compatible ``/v1/embeddings`` behind an ``api_base``) is called the way the gateway
calls a chat model: its provider profile gives the key and says which failures are worth another
attempt (``transport.classify``); errors are retried with full-jitter backoff up to the model's
``max_attempts``; a 429 waits as long as the provider says, within ``max_rate_limit_wait_s``;
``rpm`` spaces the requests. The SDK's own retries are off, so attempts stay bounded.

Requests go one after another: a knowledge base's texts are embedded in a few large batches, and
the caller (``knowornot.embeddings``) keeps every vector in the call cache, so a re-run sends none.

Given the run's gateway (``access``), each request is one of the model's calls like any other: it
holds one of the model's slots (``Gateway.limited``: its ``max_concurrency``, ``rpm`` and ``tpm``,
shared across processes where the config shares them), a 429 pauses the model for every caller, and
it is counted in the gateway's accounting under the stage ``embed`` (``accounting.EMBED_STAGE``):
its input tokens (the provider's ``usage``, else characters / 4) at the model's input price
(``accounting.embedding_token_price``: the config's ``price``, else LiteLLM's map). Where a budget
admits calls (``accounting.admitted``), each request is admitted first at its estimate: its tokens
at that price.

Where LiteLLM would send the request unchanged - an ``openai/`` model behind an ``api_base`` of its
own, with at most ``dimensions`` and ``user`` as parameters - the client posts that same body itself
(``{"model", "input", "encoding_format": "float", ...}``, the key as a Bearer header) and reads the
same JSON floats, so the vectors are the same bits; importing LiteLLM costs seconds of CPU at start-up
and nothing else of the run needs it (the gateway's chat calls take their own direct path). A
redirect, and every other model, goes through LiteLLM.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.core.errors import RunIncomplete
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.endpoints import endpoint_identity
from refusalbench.tasks.llm.providers import profile_for
from refusalbench.tasks.llm.rate_limits import announced_wait, retry_delay
from refusalbench.tasks.llm.transport import CallFailed, classify, litellm_module, status_failure

# LiteLLM's price map from the package, not fetched at import (as the gateway sets it).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
# The parameters LiteLLM's OpenAI embedding path passes on unchanged (``encoding_format`` it sets itself).
DIRECT_PARAMS = frozenset({"dimensions", "user"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
T = TypeVar("T")
# (vectors, input tokens as the provider counted them, None when it did not say)
Embedded = tuple[list[list[float]], int | None]


class ModelAccess(Protocol):
    """What an embedding request takes of the run's gateway (``Gateway``): its limits and its counters."""

    usage: accounting.UsageCounters

    def limited(self, model: str, tokens: int, work: Callable[[], T]) -> T: ...

    def pause(self, model: str, seconds: float) -> None: ...


class EmbeddingFailed(RunIncomplete):
    """A batch the model did not embed after every attempt it was allowed: the run cannot build its
    index without it, so it ends (one line, exit 1); every vector already embedded stays cached."""


def embedding_identity(cfg: ModelConfig) -> dict[str, Any]:
    """What the vectors of ``cfg`` depend on, for the call-cache key: the LiteLLM model string, the
    deployment (``endpoints.endpoint_identity``: a written ``api_base``, deployment headers) and the
    parameters (``dimensions`` changes every vector). Credentials are not part of it."""
    return {"model": cfg.model, **endpoint_identity(cfg), "params": dict(sorted(cfg.params.items()))}


class EmbeddingClient:
    """Sends batches of texts to one embedding model and returns one float vector per text."""

    def __init__(
        self,
        cfg: ModelConfig,
        api_base: str | None = None,
        *,
        name: str | None = None,
        access: ModelAccess | None = None,
    ):
        self.cfg = cfg
        self.name = name or cfg.model  # the registry's name: what the limits and the accounting count under
        self.access = access if name is not None else None  # the gateway knows the model by its registry name
        self.price = accounting.embedding_token_price(cfg)
        self.api_base = api_base or cfg.api_base  # a run-time endpoint (a local server) wins
        self.profile = profile_for(cfg.model, self.api_base)
        self.requests = 0  # requests sent (attempts included), for the caller's accounting
        self.direct = _posts_directly(cfg, self.api_base)
        self._lock = threading.Lock()
        self._last_sent = 0.0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of ``texts`` in their order, from one request (retried as the model allows)."""
        errors, limited_since, last = 0, None, "no attempt made"
        while True:
            try:
                return self._admitted(list(texts))
            except CallFailed as failure:
                last = str(failure)
                if failure.rate_limited and failure.retriable:
                    limited_since = limited_since if limited_since is not None else time.monotonic()
                    wait = failure.retry_after if failure.retry_after is not None else BACKOFF_BASE_S
                    if time.monotonic() - limited_since + wait <= self.cfg.max_rate_limit_wait_s:
                        if self.access is not None:  # every request of the model waits (the next slot too)
                            self.access.pause(self.name, wait)
                        else:
                            time.sleep(wait)
                        continue
                    last += f"; still rate limited after {self.cfg.max_rate_limit_wait_s:g} s"
                    break
                errors += 1
                if not failure.retriable or errors >= self.cfg.max_attempts:
                    break
                time.sleep(retry_delay(errors, failure.retry_after, BACKOFF_BASE_S, BACKOFF_MAX_S))
        raise EmbeddingFailed(
            f"embedding model {self.cfg.model}: {last} (after {self.requests} request"
            f"{'s' if self.requests != 1 else ''})"
        )

    def _pace(self) -> None:
        """Space requests ``60 / rpm`` seconds apart (the model's requests-per-minute limit)."""
        if not self.cfg.rpm:
            return
        with self._lock:
            wait = self._last_sent + 60.0 / self.cfg.rpm - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last_sent = time.monotonic()

    def _admitted(self, texts: list[str]) -> list[list[float]]:
        """One request, admitted by the run's budget where one admits calls, under the model's limits where
        the run's gateway holds them (else paced by ``rpm`` here), counted in its accounting."""
        tokens = accounting.embedding_tokens(texts)
        estimate = tokens * (self.price or 0.0)
        with accounting.admitted(accounting.EMBED_STAGE, self.name, estimate, f"{len(texts)} texts"):
            if self.access is None:
                self._pace()
                return self._send(texts)[0]
            return self.access.limited(self.name, tokens, lambda: self._counted(texts, tokens))

    def _counted(self, texts: list[str], estimated: int) -> list[list[float]]:
        assert self.access is not None
        self.access.usage.count(self.name, accounting.EMBED_STAGE, http_calls=1)
        vectors, tokens = self._send(texts)
        tokens = tokens if tokens is not None else estimated
        cost = {"unpriced_calls": 1} if self.price is None else {"cost_usd": tokens * self.price}
        self.access.usage.count(self.name, accounting.EMBED_STAGE, prompt_tokens=tokens, **cost)
        return vectors

    def _send(self, texts: list[str]) -> Embedded:
        api_key = self.profile.api_key(self.cfg, self.api_base)
        if self.direct and api_key:
            self.requests += 1
            embedded = self._post(texts, api_key)
            if embedded is not None:
                return embedded
            self.direct = False  # redirected: LiteLLM's client follows it, this and later requests go there
        return self._send_litellm(texts)

    def _post(self, texts: list[str], api_key: str) -> Embedded | None:
        """One request posted directly: the vectors, a :class:`CallFailed`, or None on a redirect."""
        assert self.api_base is not None
        url = urlsplit(self.api_base.rstrip("/") + "/embeddings")
        body = {"model": self.cfg.model.split("/", 1)[1], "input": texts, "encoding_format": "float", **self.cfg.params}
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {api_key}",
            **(self.cfg.extra_headers or {}),
        }
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        # One connection per request: a batch is large and requests are few (a run sends tens).
        connection = kind(url.hostname or "", url.port, timeout=self.cfg.timeout_s)
        try:
            connection.request(
                "POST", url.path + (f"?{url.query}" if url.query else ""), json.dumps(body).encode(), headers
            )
            answer = connection.getresponse()
            status, raw, reply_headers = answer.status, answer.read(), dict(answer.getheaders())
        except TimeoutError:
            raise CallFailed(f"Timeout: no reply within {self.cfg.timeout_s:g} s", retriable=True) from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, dropped mid-reply: try again
            raise CallFailed(f"APIConnectionError: {type(exc).__name__}: {exc}", retriable=True) from None
        finally:
            connection.close()
        if status in _REDIRECTS:
            return None
        if status >= 400:
            raise status_failure(status, raw, announced_wait(reply_headers), self.profile)
        try:
            answer_json = json.loads(raw)
            data = answer_json["data"]
            vectors = [_field(row, "embedding") for row in sorted(data, key=lambda row: _field(row, "index"))]
        except (ValueError, KeyError, TypeError):
            raise CallFailed("malformed reply: no embeddings", retriable=True) from None
        if not all(isinstance(v, list) for v in vectors):
            raise CallFailed("malformed reply: embeddings are not lists of floats", retriable=True)
        if len(vectors) != len(texts):
            raise CallFailed(f"malformed reply: {len(vectors)} embeddings for {len(texts)} texts", retriable=True)
        return vectors, _prompt_tokens(answer_json.get("usage") if isinstance(answer_json, dict) else None)

    def _send_litellm(self, texts: list[str]) -> Embedded:
        litellm = litellm_module()
        # LiteLLM's OpenAI embedding path reads ``max_retries or DEFAULT_MAX_RETRIES``: the 0 passed
        # below would become 2 and the SDK would retry behind this module's back. The project never
        # lets an SDK retry (the gateway passes 0 to every call), so its default is 0 too.
        litellm.DEFAULT_MAX_RETRIES = 0
        kwargs: dict[str, Any] = dict(self.cfg.params)
        if self.api_base:
            kwargs["api_base"] = self.api_base
        api_key = self.profile.api_key(self.cfg, self.api_base)
        if api_key:
            kwargs["api_key"] = api_key
        if self.cfg.extra_headers:
            kwargs["extra_headers"] = self.cfg.extra_headers
        self.requests += 1
        try:
            response = litellm.embedding(
                model=self.cfg.model, input=texts, timeout=self.cfg.timeout_s, max_retries=0, **kwargs
            )
        except Exception as exc:  # provider errors of every kind become a CallFailed
            raise classify(exc, self.profile) from None
        try:
            rows = sorted(response.data, key=lambda row: _field(row, "index"))
            vectors = [list(_field(row, "embedding")) for row in rows]
        except (AttributeError, KeyError, TypeError):
            raise CallFailed("malformed reply: no embeddings", retriable=True) from None
        if len(vectors) != len(texts):
            raise CallFailed(f"malformed reply: {len(vectors)} embeddings for {len(texts)} texts", retriable=True)
        return vectors, _prompt_tokens(getattr(response, "usage", None))


def _prompt_tokens(usage: Any) -> int | None:
    """The input tokens an embedding reply's ``usage`` counts (a dict or LiteLLM's object), if it says."""
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else getattr(usage, "prompt_tokens", None)
    return int(tokens) if isinstance(tokens, (int, float)) and tokens >= 0 else None


def _posts_directly(cfg: ModelConfig, api_base: str | None) -> bool:
    """Whether LiteLLM would send this model's embedding requests unchanged to ``api_base``: its OpenAI
    path (a profile with ``direct_embeddings``: ``openai/`` + an endpoint of one's own, plain ``http(s)``),
    parameters it passes on as they are, and its default ``encoding_format`` (``float``) not changed through the environment."""
    return (
        profile_for(cfg.model, api_base).direct_embeddings
        and str(api_base or "").startswith(("http://", "https://"))
        and cfg.params.keys() <= DIRECT_PARAMS
        and not os.environ.get("LITELLM_DEFAULT_EMBEDDING_ENCODING_FORMAT")
    )


def _field(row: Any, name: str) -> Any:
    """A field of one embedding row (LiteLLM gives dicts or objects, by provider)."""
    return row[name] if isinstance(row, dict) else getattr(row, name)
