"""How each provider says a prompt does not fit its model's context window: one class per wording.

The gateway checks a prompt's size before sending it (``context_limits``), but only where it
knows the model's window and can count its tokens; the provider has the last word. Its answer is
a 400 whose body each provider words its own way. A provider profile names the class that reads
its wording (``ProviderProfile.context_length_error``); a 400 it recognises is the row's
``too_long`` outcome (the prompt does not fit: no answer, no failed call), not ``call_error``;
the row's error keeps the provider's own message (:func:`provider_message`).

The wordings, as each provider's API documents and sends them:

- OpenAI (and the OpenAI-compatible servers that imitate it, vLLM among them): ``code:
  context_length_exceeded``, "This model's maximum context length is N tokens ...";
- Anthropic: ``invalid_request_error`` "prompt is too long: N tokens > M maximum";
- AWS Bedrock: a ``ValidationException`` "Input is too long for requested model." or "Too many
  input tokens ...";
- Google (Gemini API and Vertex AI): ``INVALID_ARGUMENT`` "The input token count (N) exceeds the
  maximum number of tokens allowed (M)."
"""

from __future__ import annotations

import json
from typing import ClassVar


class ContextLengthError:
    """A provider's wording of "the prompt is longer than the model's context window" (none: this base)."""

    # The HTTP statuses the provider answers it with.
    statuses: ClassVar[frozenset[int]] = frozenset({400})
    # Words of the error's body (code or message) that say it, lower case.
    markers: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def matches(cls, status: int | None, message: str) -> bool:
        """Whether an error answered with ``status`` (None: not known) and ``message`` says the prompt
        does not fit the window."""
        if status is not None and status not in cls.statuses:
            return False
        text = message.lower()
        return any(marker in text for marker in cls.markers)


class OpenAIContextLength(ContextLengthError):
    """OpenAI's ``context_length_exceeded``; vLLM and other OpenAI-compatible servers word it the same way."""

    markers: ClassVar[tuple[str, ...]] = ("context_length_exceeded", "maximum context length")


class OpenAICompatibleContextLength(OpenAIContextLength):
    """OpenAI's wording, and llama.cpp's server's ("the request exceeds the available context size")."""

    markers: ClassVar[tuple[str, ...]] = (*OpenAIContextLength.markers, "exceeds the available context size")


class AnthropicPromptTooLong(ContextLengthError):
    """Anthropic's Messages API: "prompt is too long: N tokens > M maximum"."""

    markers: ClassVar[tuple[str, ...]] = ("prompt is too long",)


class BedrockInputTooLong(ContextLengthError):
    """AWS Bedrock's ValidationException: "Input is too long for requested model." or "Too many input tokens";
    its Claude models may pass on Anthropic's own "prompt is too long"."""

    markers: ClassVar[tuple[str, ...]] = ("input is too long", "too many input tokens", *AnthropicPromptTooLong.markers)


class GoogleTokenLimit(ContextLengthError):
    """The Gemini API's and Vertex AI's INVALID_ARGUMENT: "... exceeds the maximum number of tokens allowed ..."."""

    markers: ClassVar[tuple[str, ...]] = ("exceeds the maximum number of tokens",)


class VertexContextLength(GoogleTokenLimit):
    """Vertex AI: Gemini's wording, and Anthropic's for the Claude models it serves in the Messages format."""

    markers: ClassVar[tuple[str, ...]] = (*GoogleTokenLimit.markers, *AnthropicPromptTooLong.markers)


def provider_message(text: str) -> str:
    """The provider's own message inside LiteLLM's wording of an error (the ``message`` of the JSON body
    it quotes), else the text as it is."""
    start, end = text.find("{"), text.rfind("}")
    try:
        body = json.loads(text[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else body
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else text


__all__ = [
    "AnthropicPromptTooLong",
    "BedrockInputTooLong",
    "ContextLengthError",
    "GoogleTokenLimit",
    "OpenAICompatibleContextLength",
    "OpenAIContextLength",
    "VertexContextLength",
    "provider_message",
]
