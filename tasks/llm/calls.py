"""What one model call is: its request (``CallSpec``), its result (``CallResult``) and its cache key.

The gateway (``gateway``) turns specs into results; the stages build specs and read results,
so they need only this module's names. ``request_key`` is the call cache's key: the model,
its deployment (endpoint and deployment-selecting headers, ``endpoints``), the messages, the
parameters and the response schema.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.call_fields import REPLY_BILLING, REPLY_METADATA, TimedCallFields
from refusalbench.tasks.llm.endpoints import endpoint_identity
from refusalbench.tasks.llm.reply_outcomes import OK

# Bump when the cached value's layout changes, so old rows are not misread.
CACHE_VERSION = 1
# ``json.dumps(payload, sort_keys=True, default=str)``, its encoder made once instead of per key.
_KEY_ENCODER = json.JSONEncoder(sort_keys=True, default=str)


class CallSpec(BaseModel):
    """One chat completion to make."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = Field(description="registry name (key of RunConfig.models)")
    messages: list[dict[str, str]]
    schema_: type[BaseModel] | None = Field(default=None, alias="schema")
    params: dict[str, Any] = Field(default_factory=dict)
    tag: str | None = Field(default=None, description="caller's id for the call (not part of the cache key)")
    role: str | None = Field(
        default=None,
        description="what the call is for (core.cache_policy.CACHE_ROLES): its cache scope; None: cached forever",
    )
    stage: str | None = Field(
        default=None,
        description="the stage the call's tokens and cost count for (not part of "
        "the cache key); None: the caller's tag (tasks/llm/accounting.py)",
    )
    shared_chars: int | None = Field(
        default=None,
        description="characters of the last message that, with the messages before it, open a prefix other "
        "calls share (not part of the cache key): where prompt caching marks it (tasks/llm/prompt_cache.py)",
    )
    shared_by: int = Field(default=1, description="how many calls the caller expects to share that prefix")


class CallResult(TimedCallFields):
    """What one call came to: its text (or why there is none), and its metadata, billing and latency."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str
    key: str
    tag: str | None = None
    text: str | None = None
    parsed: Any = None
    error: str | None = None
    error_kind: str | None = Field(
        default=None,
        description="call_error | parse_error, or the outcome of a reply that "
        "is no answer: truncated | provider_blocked | empty | too_long",
    )
    attempts: int = 0
    cached_tokens: int | None = Field(
        default=None, description="prompt tokens the provider served from its prompt cache"
    )
    batch: bool = Field(default=False, description="the reply came through the provider's batch API (mode: batch)")

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def outcome(self) -> str:
        """What the call came to (``tasks/llm/reply_outcomes.py``): ``ok``, or why there is no usable reply."""
        return OK if self.error is None else (self.error_kind or "call_error")

    def metadata(self, prefix: str = "") -> dict[str, Any]:
        """The reply's metadata as record fields, each name after ``prefix`` (a judgment's are ``judge_...``)."""
        return {prefix + name: getattr(self, name) for name in REPLY_METADATA}

    def billing(self, prefix: str = "") -> dict[str, Any]:
        """What the call billed as record fields (tokens, cost, whether the cache served it), each after ``prefix``."""
        return {prefix + name: getattr(self, name) for name in REPLY_BILLING}


def schema_name(schema: type[BaseModel]) -> str:
    return schema.__name__


@functools.cache
def _built_schema(schema: type[BaseModel]) -> dict[str, Any]:
    from refusalbench.tasks.llm.structured_outputs import json_schema_for

    return json_schema_for(schema)


def json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    # Self-contained schema (no $refs, every field required) so llama.cpp's grammar honours it.
    # Built once per output class (pydantic takes up to ~1 ms, twice per call, on the
    # gateway's single event-loop thread); each caller gets its own copy to change freely,
    # decoded from the schema's JSON text (a third of a deep copy's CPU).
    built: dict[str, Any] = json.loads(_schema_text(schema))
    return built


@functools.cache
def _schema_text(schema: type[BaseModel]) -> str:
    return json.dumps(_built_schema(schema))


def request_key(
    cfg: ModelConfig,
    messages: list[dict[str, str]],
    params: dict[str, Any],
    schema: type[BaseModel] | None,
    *,
    deployment: bool = True,
    scope: str | None = None,
) -> str:
    """Cache key: what determines the reply, the deployment included: a configured ``api_base``
    (normalised) and the ``extra_headers`` that select a deployment (``endpoints``), so one model
    string on two hosts is two models. Credentials are not part of it (a rotated key still hits
    the cache), nor is an endpoint found at run time (a local server started on a new port each
    run); a model at its provider's own endpoint keeps the key it always had. ``deployment=False``
    gives the key such a call had before the deployment was part of it (the gateway migrates
    those entries). ``scope``: what a narrower cache scope adds (the round, a ``--fresh`` salt;
    ``cache_scope``); None, as for every ``forever`` call, leaves the key as it always was."""
    payload = {
        "v": CACHE_VERSION,
        "model": cfg.model,
        "messages": messages,
        "params": {**cfg.params, **params},
        "schema": _built_schema(schema) if schema is not None else None,  # only read: no copy needed
        **(endpoint_identity(cfg) if deployment else {}),
        **({"scope": scope} if scope is not None else {}),
    }
    return hashlib.sha256(_KEY_ENCODER.encode(payload).encode()).hexdigest()


def parse_structured(schema: type[BaseModel], text: str) -> tuple[BaseModel | None, str | None]:
    from refusalbench.tasks.llm.structured_outputs import parse_output

    return parse_output(schema, text)
