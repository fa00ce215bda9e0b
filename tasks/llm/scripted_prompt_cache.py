"""The scripted server's prompt cache: cached-token counts as Anthropic and OpenAI report them.

Which of the two a request gets is its wire's choice (``Wire.apply_prompt_cache`` in ``provider_wire``).

- Messages API (explicit caching): a prefix ending at a block marked ``cache_control`` (in
  ``system`` or in a message's content blocks) of at least ``min_tokens`` is written to the cache
  the first time (``cache_creation_input_tokens``) and read from it afterwards
  (``cache_read_input_tokens``): the longest marked prefix seen before is read, the rest up to the
  last mark written. A prefix below the minimum is neither (as Anthropic: no error, no cache).
- Chat completions (automatic caching, as OpenAI): the longest prefix of at least ``min_tokens``,
  in ``step_tokens`` steps, that an earlier request to the same model began with is reported as
  ``prompt_tokens_details.cached_tokens``; nothing is marked and nothing is written.

Tokens are the scripted server's own (whitespace-separated words, as ``shape_reply`` bills them),
and each model has a cache of its own. Prompts shorter than the minimum, as nearly every test's
are, see no change at all.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

# Anthropic's and OpenAI's smallest cacheable prefix, and OpenAI's step beyond it.
MIN_CACHEABLE_TOKENS = 1024
OPENAI_CACHE_STEP_TOKENS = 128


def _words(text: Any) -> list[str]:
    return str(text or "").split()


def _segments(body: dict[str, Any]) -> list[tuple[str, list[str], bool]]:
    """A Messages API request as (where, words, marked) blocks in prompt order: system, then messages
    (where: ``system[0]``, ``messages[1][0]``: the message and its block)."""
    out: list[tuple[str, list[str], bool]] = []
    parts: list[tuple[str, Any]] = [("system", body.get("system"))]
    parts += [(f"messages[{i}]", m.get("content")) for i, m in enumerate(body.get("messages") or [])]
    for where, content in parts:
        if isinstance(content, list):
            for n, block in enumerate(content):
                if isinstance(block, dict):
                    text = block.get("text") if block.get("type") == "text" else json.dumps(block, sort_keys=True)
                    out.append((f"{where}[{n}]", _words(text), bool(block.get("cache_control"))))
        elif content:
            out.append((where, _words(content), False))
    return out


@dataclass
class ScriptedPromptCache:
    """Which prompt prefixes each model has cached; ``min_tokens`` may be lowered for tests."""

    min_tokens: int = MIN_CACHEABLE_TOKENS
    step_tokens: int = OPENAI_CACHE_STEP_TOKENS
    _seen: set[str] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def anthropic(self, body: dict[str, Any]) -> tuple[int, int, list[str]]:
        """(tokens read, tokens written, where the marks were) for one Messages API request."""
        digest = hashlib.sha256(str(body.get("model")).encode())
        prefixes: list[tuple[int, str]] = []  # (tokens, key) of the prefix ending at each marked block
        marked: list[str] = []
        tokens = 0
        for where, words, mark in _segments(body):
            digest.update(json.dumps(words).encode())
            tokens += len(words)
            if mark:
                prefixes.append((tokens, digest.copy().hexdigest()))
                marked.append(where)
        if not prefixes:
            return 0, 0, marked
        with self._lock:
            read = next((n for n, key in reversed(prefixes) if key in self._seen), 0)
            last_tokens, last_key = prefixes[-1]
            written = last_tokens - read if last_tokens >= self.min_tokens and last_key not in self._seen else 0
            self._seen.update(key for n, key in prefixes if n >= self.min_tokens)
        return read, written, marked

    def openai(self, request: dict[str, Any]) -> int:
        """Prompt tokens a chat-completions request reads from the model's automatic prefix cache."""
        words = [w for m in request.get("messages") or [] for w in _words(m.get("content"))]
        if len(words) < self.min_tokens:
            return 0
        digest = hashlib.sha256(str(request.get("model")).encode())
        keys: list[tuple[int, str]] = []
        for n, word in enumerate(words, 1):
            digest.update(word.encode() + b"\0")
            if n >= self.min_tokens and (n - self.min_tokens) % self.step_tokens == 0:
                keys.append((n, digest.copy().hexdigest()))
        with self._lock:
            cached = next((n for n, key in reversed(keys) if key in self._seen), 0)
            self._seen.update(key for _, key in keys)
        return cached
