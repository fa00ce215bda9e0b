"""Provider prompt caching: the shared prefix of a prompt marked cacheable at send time.

Every prompt template puts what the calls of a stage share first: the system prompt (the
instructions of the judge, verifier and generator, the target's system prompt with its refusal
codes, a KnowOrNot target's knowledge-base context), then the item; the judge's prompt begins
with the item's context, question and references, which every target's reply to it shares.
Providers that cache only a prefix the request marks (``ProviderProfile.marks_prompt_cache``:
Anthropic, Bedrock's Claude and Nova, Claude on Vertex AI) get it marked: :func:`marked_messages`
gives the system message's text as one text block carrying ``cache_control: {type: ephemeral}``,
which LiteLLM passes through (Anthropic's ``system`` blocks, Bedrock's ``cachePoint``). Providers
with automatic prefix caching (OpenAI, Azure, DeepSeek, Gemini) and every other provider receive
the messages as built.

The marking happens after the call cache key is made, from the messages as the stage built them,
so a marked and an unmarked call share one key and old cache entries stay valid. A prefix shorter
than the provider's minimum (1,024 tokens for most Claude models) is simply not cached: marking it
costs nothing. Cached tokens come back in the reply's usage (``transport``) and are priced and
counted in ``accounting`` (``cached_savings_usd``).
"""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.llm.providers import ProviderProfile

# Anthropic's only cache type: a 5-minute cache, refreshed by each read.
CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}


def marked_messages(profile: ProviderProfile, model: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the shared prefix (the leading system message) marked cacheable where the
    provider caches only marked prefixes; otherwise ``messages`` itself, unchanged."""
    if not messages or messages[0].get("role") != "system" or not profile.marks_prompt_cache(model):
        return messages
    system = messages[0]
    content = system.get("content")
    if not isinstance(content, str) or not content:
        return messages
    block = {"type": "text", "text": content, "cache_control": dict(CACHE_CONTROL)}
    return [{**system, "content": [block]}, *messages[1:]]
