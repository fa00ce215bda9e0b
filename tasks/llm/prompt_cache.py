"""Provider prompt caching: the shared prefix of a prompt marked cacheable at send time.

A stage's calls share a prefix where its template says so (``{{ SHARED_END }}``, see ``prompting``):
the judge's calls about one item share the instructions and the item's context, question and
reference answers, whichever target's reply follows; the verifier's calls about one (item, lever)
share the instructions, the lever and the original item, whichever generator's candidate follows.
The stage puts that split on the spec (``CallSpec.shared_chars``) with how many calls it expects to
share it (``CallSpec.shared_by``). Every call of a stage shares its system prompt too.

Providers that cache only a prefix the request marks (``ProviderProfile.marks_prompt_cache``:
Anthropic, Bedrock's Claude and Nova, Claude on Vertex AI) get it marked by :func:`marked_messages`:
the user message becomes two text blocks, the shared one carrying ``cache_control: {type:
ephemeral}`` (LiteLLM passes it on: Anthropic's content blocks, Bedrock's ``cachePoint``), and a
system prompt long enough on its own is marked as well. A prefix is marked only where it pays: at
least the provider's minimum (:func:`min_prefix_tokens`; LiteLLM's ``token_counter`` counts it) and
shared by more than one call, as a mark on a prefix nobody reads again costs the cache write's
premium for nothing. Providers with automatic prefix caching (OpenAI, Azure, DeepSeek, Gemini)
need only the order, and every other provider receives the messages as built.

The marking happens after the call cache key is made, from the messages as the stage built them,
so a marked and an unmarked call share one key and old cache entries stay valid. Cached tokens come
back in the reply's usage (``transport``) and are priced and counted in ``accounting``
(``cached_savings_usd``); ``plan`` forecasts them with :func:`expected_cache_tokens`, and the gateway
counts the same forecast for the calls it sends (:func:`expected_amounts`), so the cost report sets
what was expected beside what the provider's cache did.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.calls import CallSpec
from refusalbench.tasks.llm.providers import ProviderProfile, profile_for

# Anthropic's only cache type: a 5-minute cache, refreshed by each read.
CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}
# OpenAI's automatic cache reads a prefix in steps of this many tokens beyond its minimum.
AUTOMATIC_STEP_TOKENS = 128


def min_prefix_tokens(profile: ProviderProfile, model: str) -> int:
    """The shortest prefix ``profile``'s provider caches for ``model``, in tokens."""
    name = model.lower()
    return next((n for part, n in profile.prompt_cache_min_by_model if part in name), profile.prompt_cache_min_tokens)


def caches_prefixes(profile: ProviderProfile, model: str) -> bool:
    """Whether calls to ``model`` get a discount for a repeated prefix (marked, or automatically)."""
    return profile.marks_prompt_cache(model) or profile.prompt_caching == "automatic"


def shared_prefix(messages: list[dict[str, Any]], shared_chars: int | None) -> list[dict[str, Any]] | None:
    """The messages up to where the shared part of the last one ends; None when there is no such split."""
    if not shared_chars or not messages:
        return None
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, str) or not 0 < shared_chars < len(content):
        return None
    return [*messages[:-1], {**last, "content": content[:shared_chars]}]


def prefix_tokens(model: str, messages: list[dict[str, Any]]) -> int:
    """The tokens of a prompt prefix as LiteLLM counts them for ``model``."""
    return _counted(model, tuple((str(m.get("role")), str(m.get("content") or "")) for m in messages))


@lru_cache(maxsize=1024)
def _counted(model: str, messages: tuple[tuple[str, str], ...]) -> int:
    # Every call about one item counts the same prefix: counted once.
    from refusalbench.tasks.llm.context_limits import prompt_tokens

    return prompt_tokens(model, [{"role": role, "content": content} for role, content in messages])


def _text_block(text: str, marked: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if marked:
        block["cache_control"] = dict(CACHE_CONTROL)
    return block


def marked_messages(
    profile: ProviderProfile,
    model: str,
    messages: list[dict[str, Any]],
    shared_chars: int | None = None,
    shared_by: int = 1,
) -> list[dict[str, Any]]:
    """``messages`` with the prefixes worth caching marked, where the provider caches only marked
    prefixes: the system prompt when it alone reaches the minimum (every call of a stage shares it),
    and the first ``shared_chars`` of the user message when ``shared_by`` calls share them and the
    prefix up to there reaches it. Otherwise ``messages`` itself, unchanged."""
    if not messages or not profile.marks_prompt_cache(model):
        return messages
    minimum = min_prefix_tokens(profile, model)
    out = list(messages)
    system = out[0]
    if system.get("role") == "system" and isinstance(system.get("content"), str) and system["content"]:
        if prefix_tokens(model, [system]) >= minimum:
            out[0] = {**system, "content": [_text_block(system["content"], True)]}
    prefix = shared_prefix(messages, shared_chars) if shared_by > 1 else None
    if prefix is not None and prefix_tokens(model, prefix) >= minimum:
        last, cut = messages[-1], shared_chars or 0
        blocks = [_text_block(last["content"][:cut], True), _text_block(last["content"][cut:], False)]
        out[-1] = {**last, "content": blocks}
    return out if any(a is not b for a, b in zip(out, messages)) else messages


def expected_cache_tokens(profile: ProviderProfile, model: str, tokens: int, shared_by: int) -> tuple[int, int]:
    """(tokens read from the cache, tokens written to it) by ``shared_by`` calls sharing a prefix of
    ``tokens`` tokens: the first call writes it (a provider caching marked prefixes bills the write),
    the others read it; nothing where the prefix is below the minimum or nobody reads it again. An
    automatic cache reads whole steps of :data:`AUTOMATIC_STEP_TOKENS` beyond its minimum."""
    minimum = min_prefix_tokens(profile, model)
    if shared_by < 2 or tokens < minimum or not caches_prefixes(profile, model):
        return 0, 0
    if profile.marks_prompt_cache(model):
        return tokens * (shared_by - 1), tokens
    cached = minimum + (tokens - minimum) // AUTOMATIC_STEP_TOKENS * AUTOMATIC_STEP_TOKENS
    return cached * (shared_by - 1), 0


def expected_amounts(cfg: ModelConfig, spec: CallSpec) -> dict[str, float]:
    """What one call sent synchronously is expected to read from the cache and save: its share of its
    prefix's calls (``shared_by - 1`` reads, one write among ``shared_by`` calls); nothing without a
    prefix worth caching. The counters ``accounting`` keeps per stage and model."""
    prefix = shared_prefix(spec.messages, spec.shared_chars) if spec.shared_by > 1 else None
    if prefix is None or cfg.rule_based:  # most calls: nothing shared, nothing to look up
        return {}
    profile = profile_for(cfg.model, cfg.api_base)
    if not caches_prefixes(profile, cfg.model):
        return {}
    reads, writes = expected_cache_tokens(profile, cfg.model, prefix_tokens(cfg.model, prefix), spec.shared_by)
    if not reads:
        return {}
    read, written = reads / spec.shared_by, writes / spec.shared_by
    prices = accounting.prompt_token_prices(cfg)
    savings = 0.0
    if prices is not None:
        full, cached, write = prices
        savings = read * (full - cached) - written * (write - full)
    return {"expected_cached_tokens": read, "expected_cached_savings_usd": savings}
