"""A call's cached value (the same layout on every path) and the result fields read back from it.

The gateway writes :func:`call_value` of every reply to the call cache and makes each
``CallResult`` from a value with :func:`result_fields`, whether the value just came or was cached
runs ago; the batch path's replies take the same two steps, at the batch price.
"""

from __future__ import annotations

import time
from typing import Any

from refusalbench.tasks.core.config import ModelConfig, ReasoningMode
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.reasoning import split_reasoning
from refusalbench.tasks.llm.reply_outcomes import reply_outcome
from refusalbench.tasks.llm.transport import Reply

# What a result takes from its cached value as it is.
VALUE_FIELDS = ("latency_s", "prompt_tokens", "completion_tokens", "cost_usd", "cached_tokens", "finish_reason")


def call_value(cfg: ModelConfig, reply: Reply, latency: float, *, batch: bool = False) -> dict[str, Any]:
    """The cached value of a completed call, whatever its outcome: a truncated, blocked or empty reply
    is billed like any other. ``batch``: it came through a batch API (priced at the batch price, marked)."""
    return {
        "text": None if reply.text is None else str(reply.text),
        "outcome": reply.outcome or reply_outcome(reply.text, reply.finish_reason, reply.refusal),
        "refusal": reply.refusal,
        "latency_s": round(latency, 4),
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "cost_usd": accounting.reply_cost(cfg, reply, reply.cached_tokens, batch=batch),  # the config's price first
        "cached_tokens": reply.cached_tokens,
        **accounting.prompt_cache_billing(cfg, reply),  # cache writes and savings, when the prompt cache served
        "finish_reason": reply.finish_reason,
        **reply.metadata(),
        "created_at": time.time(),
        **(accounting.batch_billing(cfg, reply) if batch else {}),
    }


def result_fields(value: dict[str, Any], mode: ReasoningMode) -> dict[str, Any]:
    """A ``CallResult``'s fields from a cached value: its final answer (``text``) with its reasoning split
    off as ``mode`` says now (the cache keeps the text as it came, so a changed mode needs no new call),
    its billing and its other metadata (entries cached before a field existed have None)."""
    answer, reasoning = split_reasoning(value.get("text"), value.get("reasoning"), mode)
    reasoning_tokens = value.get("reasoning_tokens")
    if reasoning and not value.get("reasoning") and not reasoning_tokens:
        # Reasoning written inline is billed as plain output: the provider's 0 means "not counted".
        reasoning_tokens = None
    return {
        "text": answer,
        "reasoning": reasoning,
        "reasoning_tokens": reasoning_tokens,
        "served_model": value.get("served_model"),
        "system_fingerprint": value.get("system_fingerprint"),
        "batch": bool(value.get("batch")),
        **{name: value.get(name) for name in VALUE_FIELDS},
    }
