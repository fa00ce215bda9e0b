"""Whether a prompt fits a model's context window, checked before it is sent.

A prompt longer than the model's window minus the reply's ``max_tokens`` cannot be answered:
the provider refuses it (a 400, billed nothing, often worded as any other bad request) or cuts
the prompt silently. The gateway checks first and records such a call as ``too_long`` for that
model without sending it; ``plan`` counts the prompts each model cannot take.

- The window: the model's ``context_window`` in the config, else ``max_input_tokens`` from
  LiteLLM's offline model map (read from its JSON, without importing LiteLLM). A model with
  neither (a self-hosted model LiteLLM does not know) is not checked.
- The prompt's tokens: LiteLLM's ``token_counter`` over the messages, plus the JSON schema when
  the structured-output mode sends it. Counting costs CPU on the gateway's loop, so a prompt is
  counted only when a cheap bound says it might not fit: a byte-level tokenizer never makes more
  tokens than the text has UTF-8 bytes, plus a few per message for the chat template.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.config import ModelConfig

# Chat-template tokens around each message and before the reply, more than any template adds.
_TOKENS_PER_MESSAGE = 8
_TOKENS_PER_PROMPT = 16


@functools.lru_cache(maxsize=1)
def _model_map() -> dict[str, Any]:
    """LiteLLM's offline model map (prices and context windows), read from its JSON."""
    spec = importlib.util.find_spec("litellm")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "model_prices_and_context_window_backup.json"
        if path.exists():
            model_map: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return model_map
    return {}


@functools.cache
def known_window(model: str) -> int | None:
    """``max_input_tokens`` of a LiteLLM model string in LiteLLM's map (``openai/gpt-4o`` is its
    ``gpt-4o`` entry; a name another provider's entry holds is not this model); None if unknown."""
    entries = _model_map()
    entry = entries.get(model)
    if entry is None and "/" in model:
        prefix, name = model.split("/", 1)
        candidate = entries.get(name)
        if isinstance(candidate, dict) and candidate.get("litellm_provider") == prefix:
            entry = candidate
    value = entry.get("max_input_tokens") if isinstance(entry, dict) else None
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def context_window(cfg: ModelConfig) -> int | None:
    """The model's context window in tokens: ``context_window`` from the config, else LiteLLM's; None if unknown."""
    return cfg.context_window or known_window(cfg.model)


def _litellm() -> Any:
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    # LiteLLM would download a Hugging Face tokenizer for some families (Llama, Command R) from
    # the gateway's loop, stalling every call for as long as that takes (and for good offline):
    # tiktoken counts them closely enough for a limit.
    litellm.disable_hf_tokenizer_download = True
    return litellm


def prompt_tokens(model: str, messages: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> int:
    """The prompt's tokens as LiteLLM counts them for ``model``, with ``schema`` when it travels along."""
    litellm = _litellm()
    tokens = litellm.token_counter(model=model, messages=messages)
    if schema is not None:
        tokens += litellm.token_counter(model=model, text=json.dumps(schema))
    return int(tokens)


def _upper_bound(messages: list[dict[str, Any]], schema: dict[str, Any] | None) -> int:
    """At least as many tokens as any byte-level tokenizer makes of the prompt."""
    size = sum(len(str(m.get("content") or "").encode("utf-8")) for m in messages)
    if schema is not None:
        size += len(json.dumps(schema).encode("utf-8"))
    return size + _TOKENS_PER_MESSAGE * len(messages) + _TOKENS_PER_PROMPT


def overflow(
    cfg: ModelConfig, messages: list[dict[str, Any]], max_tokens: int | None, schema: dict[str, Any] | None = None
) -> str | None:
    """Why the prompt does not fit ``cfg``'s window less ``max_tokens``, in one line; None when it
    fits or the window is unknown. ``schema``: the JSON schema sent with the request, if any."""
    window = context_window(cfg)
    if window is None:
        return None
    limit = window - (max_tokens or 0)
    if _upper_bound(messages, schema) <= limit:
        return None
    tokens = prompt_tokens(cfg.model, messages, schema)
    if tokens <= limit:
        return None
    budget = f" less max_tokens {max_tokens}" if max_tokens else ""
    return (
        f"too_long: the prompt has {tokens} tokens; {cfg.model} takes at most {max(limit, 0)} "
        f"(context window {window}{budget}): not sent"
    )
