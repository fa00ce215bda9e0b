"""A reply's reasoning, split off its final answer before anything parses the answer.

Reasoning models hand their reasoning back in one of two places:

- a field of its own: ``reasoning_content`` (DeepSeek, vLLM with a reasoning parser, LiteLLM's
  name for Anthropic's thinking blocks), ``reasoning`` (newer vLLM, OpenRouter);
- inline, in the text: ``<think>…</think>`` before the answer (DeepSeek-R1 or Qwen3 served
  without a reasoning parser), or only the closing ``…</think>`` when the chat template opened
  the tag in the prompt.

A model's ``reasoning`` setting (its provider profile's by default) says how the gateway
treats the text (:data:`ReasoningMode`): ``field`` takes the text as the answer, ``think_tags``
also splits an inline block off it, ``none`` takes the text as it is. The reasoning field is
kept whatever the mode: it is never part of the text, so keeping it changes no answer.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from refusalbench.tasks.core.config import ReasoningMode

OPEN_TAG = "<think>"
_TAGS = re.compile(r"</?think>", re.IGNORECASE)
_LAST_CLOSE = re.compile(r"(?s:.*)</think>", re.IGNORECASE)


class SplitReply(NamedTuple):
    """A reply's final answer and the reasoning that came with it (None: none)."""

    answer: str | None
    reasoning: str | None


def split_think_tags(text: str) -> SplitReply:
    """``text`` without its inline reasoning.

    Everything up to the last ``</think>`` is reasoning (an opening tag or none: DeepSeek-R1's
    template opens it in the prompt); the rest is the answer. A ``<think>`` that opens the text
    and never closes is reasoning cut off by the token budget: no answer at all.
    """
    closing = _LAST_CLOSE.match(text)
    if closing is not None:
        reasoning, answer = text[: closing.end()], text[closing.end() :]
    elif text.lstrip().lower().startswith(OPEN_TAG):
        reasoning, answer = text, ""
    else:
        return SplitReply(text, None)
    return SplitReply(answer.strip(), _TAGS.sub("", reasoning).strip() or None)


def split_reasoning(text: str | None, field_reasoning: str | None, mode: ReasoningMode) -> SplitReply:
    """The final answer of a reply and all its reasoning (the field's, then any inline block).

    Where the reply carried reasoning, the answer loses its leading blank lines (LiteLLM leaves
    ``"\\n\\nanswer"`` behind when it splits a block itself), so the answer reads the same
    whichever path or adapter split it.
    """
    parts = [field_reasoning.strip()] if field_reasoning and field_reasoning.strip() else []
    answer = text
    if mode == "think_tags" and isinstance(text, str):
        answer, inline = split_think_tags(text)
        if inline:
            parts.append(inline)
    if parts and isinstance(answer, str):
        answer = answer.lstrip()
    return SplitReply(answer, "\n\n".join(parts) or None)
