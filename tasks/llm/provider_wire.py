"""How real providers word their replies and errors on the wire, for the scripted model server.

Each API the server speaks is one :class:`Wire`, holding everything that API does its own way:
how a request is read, what it refuses up front, the shape of a reply, an error, a 429 and a
filtered prompt, what a structured-output request looks like, how cached prompt tokens are found,
and how a batch job (:class:`BatchJob`) looks. The wires themselves are ``openai_wire.OPENAI``
(chat completions, the files + batches API) and ``anthropic_wire.ANTHROPIC`` (the Messages API and
its message batches). Here too: how one scripted model shapes its replies (:class:`Behaviour`,
:class:`RateLimit`): reasoning, truncation, safety blocks, rejected ``json_schema``, served model
names and the tokens each reply bills. The OpenAI embeddings API's reply (``embeddings_body``)
carries ``scripted_embedding`` vectors.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, ClassVar, Literal

from refusalbench.tasks.llm.scripted_prompt_cache import ScriptedPromptCache

WireFormat = Literal["openai", "anthropic", "gemini", "bedrock"]


# ---------------------------------------------------------------- real providers' manners

Finish = Literal["stop", "length", "content_filter", "refusal"]
ReasoningPlace = Literal["field", "reasoning_field", "think_tags", "think_end_only"]
INLINE_REASONING = ("think_tags", "think_end_only")  # reasoning places written into the content
RateLimitForm = Literal["seconds", "ms", "http_date", "reset_requests", "reset_tokens"]

# What an aligned model or a provider's safety layer writes instead of an answer.
CANNED_REFUSAL = "I'm sorry, but I can't help with that."
# Azure OpenAI's 400 for a prompt its content filter blocked, word for word.
AZURE_PROMPT_FILTERED = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content management "
    "policy. Please modify your prompt and retry. To learn more about our content filtering "
    "policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766"
)
# The 400 of an OpenAI-compatible server that only accepts json_object.
JSON_SCHEMA_UNSUPPORTED = "response_format.type 'json_schema' is not supported; use 'json_object'"


def go_duration(seconds: float) -> str:
    """A wait as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``250ms``, ``2s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    return f"{int(hours)}h{text}" if hours else text


@dataclass
class RateLimit:
    """429s worded the way one provider words them: for the first ``requests`` requests, while the
    clock is before ``until`` (epoch seconds), both when both are set, always when neither is.

    ``form`` says which headers announce the wait (``wait_s``, or what is left until ``until``):
    ``seconds`` (``Retry-After: 2``), ``ms`` (``retry-after-ms: 250``), ``http_date``
    (``Retry-After: <HTTP-date>``, rounded up to the whole second), ``reset_requests`` /
    ``reset_tokens`` (no Retry-After: only ``x-ratelimit-reset-requests: 2s`` or
    ``x-ratelimit-reset-tokens: 6m0s`` with ``x-ratelimit-remaining-*``; on the Messages API only
    ``anthropic-ratelimit-*`` headers, their reset an RFC 3339 time).
    """

    form: RateLimitForm = "seconds"
    wait_s: float = 1.0
    requests: int | None = None
    until: float | None = None


@dataclass
class Behaviour:
    """How one scripted model shapes its replies, the way a real provider does; the defaults are a
    polite provider. Read on every request, so a test may change a field between calls (a new
    ``served_model`` after a provider's silent update).

    - ``reasoning`` (a string, or a callable of the request): thinking before the answer, written
      ``in`` the content as ``<think>…</think>`` (``think_tags``: DeepSeek-R1 or Qwen3 on vLLM
      without a reasoning parser), as ``…</think>`` (``think_end_only``: DeepSeek-R1, whose chat
      template opens the tag in the prompt) or in a field of its own (``field``: ``reasoning_content``;
      ``reasoning_field``: ``reasoning``, as newer vLLM and OpenRouter send it) with
      ``completion_tokens_details.reasoning_tokens``; on the Messages API a ``thinking`` block
      with a signature.
    - ``content``: replaces the responder's answer (``""``: nothing but reasoning, or an empty
      block; ``CANNED_REFUSAL``: a canned safety text); ``truncate_at`` cuts the answer to that
      many characters.
    - ``finish``: ``stop``; ``length`` (OpenAI ``finish_reason: length``, Anthropic
      ``stop_reason: max_tokens``; the reply bills the request's whole ``max_tokens``);
      ``content_filter`` (OpenAI/Azure ``finish_reason: content_filter`` with Azure's filter
      results, content null when empty; Anthropic ``stop_reason: refusal``); ``refusal``
      (OpenAI's refusal channel: ``message.refusal`` with null content and ``finish_reason:
      stop``; Anthropic ``stop_reason: refusal``).
    - ``prompt_filtered``: a 400 saying the prompt was filtered (Azure's body; on the Messages
      API ``Output blocked by content filtering policy``). Nothing is billed.
    - ``too_long``: a 400 saying the prompt exceeds the model's context window, in the words of the
      provider whose route was called (OpenAI's ``context_length_exceeded``, Anthropic's "prompt is
      too long", Bedrock's ValidationException, Gemini's INVALID_ARGUMENT: ``cloud_wires``). Nothing
      is billed.
    - ``rejects_json_schema``: a 400 for ``response_format: json_schema`` (or the Messages API's
      ``output_format``) while ``json_object`` (or a forced tool) works.
    - ``rate_limit``: 429s, see :class:`RateLimit`.
    - ``served_model`` / ``system_fingerprint``: the ``model`` the reply names (default: the one
      requested) and OpenAI's ``system_fingerprint`` (default: none sent).
    - ``cached_prompt_tokens``: prompt tokens billed as cache reads.
    """

    reasoning: str | Callable[[dict[str, Any]], str] | None = None
    reasoning_in: ReasoningPlace = "field"
    content: str | None = None
    truncate_at: int | None = None
    finish: Finish = "stop"
    prompt_filtered: bool = False
    too_long: bool = False
    rejects_json_schema: bool = False
    rate_limit: RateLimit | None = None
    served_model: str | None = None
    system_fingerprint: str | None = None
    cached_prompt_tokens: int = 0


@dataclass
class Rejection:
    """An HTTP error sent instead of a reply."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ShapedReply:
    """A reply before it is written in one API's shape: the answer, its reasoning, how it ended
    and what it billed."""

    answer: str
    reasoning: str | None
    reasoning_in: ReasoningPlace
    finish: Finish
    served_model: str
    system_fingerprint: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cache_write_tokens: int = 0  # prompt tokens written to the prompt cache (``scripted_prompt_cache``)


def _words(text: Any) -> int:
    return len(str(text or "").split())


def _max_tokens(request: dict[str, Any]) -> int | None:
    value = request.get("max_completion_tokens") or request.get("max_tokens")
    return int(value) if isinstance(value, (int, float)) else None


def shape_reply(request: dict[str, Any], answer: str, behaviour: Behaviour) -> ShapedReply:
    """The reply ``behaviour`` makes of ``answer``, with the tokens a provider would bill
    (whitespace-separated words; a ``length`` finish bills the request's whole ``max_tokens``)."""
    reasoning = behaviour.reasoning(request) if callable(behaviour.reasoning) else behaviour.reasoning
    if behaviour.truncate_at is not None:
        answer = answer[: behaviour.truncate_at]
    inline = behaviour.reasoning_in in INLINE_REASONING
    reasoning_tokens = _words(reasoning) if reasoning else 0
    answer_tokens = _words(answer)
    completion_tokens = answer_tokens + reasoning_tokens
    budget = _max_tokens(request)
    if behaviour.finish == "length" and budget is not None:
        completion_tokens = max(budget, answer_tokens)
        reasoning_tokens = completion_tokens - answer_tokens if reasoning else 0
    prompt_tokens = scripted_prompt_tokens(request)
    return ShapedReply(
        answer=answer,
        reasoning=reasoning,
        reasoning_in=behaviour.reasoning_in,
        finish=behaviour.finish,
        served_model=behaviour.served_model or str(request.get("model", "fake")),
        system_fingerprint=behaviour.system_fingerprint,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        # Inline reasoning is part of the text: the provider cannot tell it apart, so reports none.
        reasoning_tokens=0 if inline else reasoning_tokens,
        cached_tokens=min(behaviour.cached_prompt_tokens, prompt_tokens),
    )


def scripted_prompt_tokens(request: dict[str, Any]) -> int:
    """The prompt tokens the scripted server counts for a request: its messages' words."""
    return sum(_words(m.get("content")) for m in request.get("messages", []))


def inline_text(reply: ShapedReply) -> str:
    """The content with reasoning written inline, as a model without a reasoning parser emits it."""
    if not reply.reasoning or reply.reasoning_in not in INLINE_REASONING:
        return reply.answer
    opening = "<think>\n" if reply.reasoning_in == "think_tags" else ""
    if reply.finish == "length" and not reply.answer:
        return f"{opening}{reply.reasoning}"  # the budget ran out inside the reasoning: no closing tag
    return f"{opening}{reply.reasoning}\n</think>\n\n{reply.answer}"


# ---------------------------------------------------------------- one class per wire format


class Wire(ABC):
    """Everything one API does its own way, for the scripted server's routes, batch APIs and prompt
    cache: how a request is read, what it refuses before anything else, how a reply, an error, a
    429 and a filtered prompt are worded, how cached tokens are found, how a batch job looks."""

    name: ClassVar[WireFormat]
    # The ``type`` of an injected fault's error body (None: the API's own name for the status).
    injected_error_kind: ClassVar[str | None] = None
    # The message of a 404 for a batch id the server does not know.
    batch_missing: ClassVar[str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def read_request(
        self, body: dict[str, Any], known_schemas: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], str | None]:
        """The request as the chat-completions dict responders read, and the tool a structured
        reply must call (None: the reply is text)."""
        return body, None

    def header_error(self, headers: Mapping[str, str]) -> Rejection | None:
        """What the API refuses for its headers alone (missing authentication or version)."""
        return None

    def request_error(self, body: dict[str, Any]) -> Rejection | None:
        """What the API refuses in a request's body before looking at the model (a missing field)."""
        return None

    def protocol_error(self, headers: Mapping[str, str], body: dict[str, Any]) -> Rejection | None:
        """What the API refuses before anything else: its headers first, then the body."""
        return self.header_error(headers) or self.request_error(body)

    @abstractmethod
    def error_body(self, status: int, message: str, *, kind: str | None = None, **fields: Any) -> dict[str, Any]:
        """An error body as this API words it; ``fields`` are extra fields of OpenAI's error object."""

    @abstractmethod
    def reply_body(self, reply: ShapedReply, tool: str | None) -> dict[str, Any]:
        """The reply as this API sends it; a structured reply calls ``tool`` when one was offered."""

    @abstractmethod
    def structured_output_rejection(self, request: dict[str, Any], body: dict[str, Any]) -> Rejection | None:
        """The 400 of a server that rejects JSON-schema structured output, if this request asks for it."""

    @abstractmethod
    def prompt_filtered_rejection(self) -> Rejection:
        """The 400 of a provider whose content filter blocked the prompt."""

    @abstractmethod
    def context_length_rejection(self, prompt_tokens: int) -> Rejection:
        """The 400 of a provider whose model's context window is shorter than the prompt's ``prompt_tokens``."""

    def rate_limit_rejection(self, limit: RateLimit, model: str, now: float) -> Rejection:
        """The 429 ``limit`` sends at ``now``, with the headers of its ``form``."""
        wait = max(0.0, limit.until - now) if limit.until is not None else limit.wait_s
        reset_at = limit.until if limit.until is not None else now + wait
        headers: dict[str, str] = {}
        if limit.form == "seconds":
            # Real providers send whole seconds; a scripted sub-second wait is kept as given.
            headers["Retry-After"] = str(math.ceil(wait)) if limit.until is not None else f"{wait:g}"
        elif limit.form == "ms":
            headers["retry-after-ms"] = str(round(wait * 1000))
        elif limit.form == "http_date":
            headers["Retry-After"] = formatdate(math.ceil(reset_at), usegmt=True)
        kind = "tokens" if limit.form == "reset_tokens" else "requests"
        return self._rate_limited(limit, kind, wait, reset_at, model, headers)

    @abstractmethod
    def _rate_limited(
        self, limit: RateLimit, kind: str, wait: float, reset_at: float, model: str, headers: dict[str, str]
    ) -> Rejection:
        """The 429 itself: this API's rate-limit headers added to ``headers``, its wording of the wait."""

    def apply_prompt_cache(
        self,
        cache: ScriptedPromptCache,
        body: dict[str, Any],
        request: dict[str, Any],
        reply: ShapedReply,
        entry: dict[str, Any],
    ) -> None:
        """Set ``reply``'s cached and written tokens for this request and note the marks in the log ``entry``."""
        read, written = self.cached_prefix(cache, body, request, reply, entry)
        if read or written:
            reply.cached_tokens = min(max(reply.cached_tokens, read), reply.prompt_tokens)
            reply.cache_write_tokens = min(written, reply.prompt_tokens - reply.cached_tokens)
        if reply.cache_write_tokens:
            entry["cache_written"] = reply.cache_write_tokens

    @abstractmethod
    def cached_prefix(
        self,
        cache: ScriptedPromptCache,
        body: dict[str, Any],
        request: dict[str, Any],
        reply: ShapedReply,
        entry: dict[str, Any],
    ) -> tuple[int, int]:
        """(prompt tokens read from ``cache``, tokens written to it) for this request, the way this
        API caches prompts; marks the request carried are noted in the log ``entry``."""

    @abstractmethod
    def batch_object(self, job: BatchJob, base_url: str) -> dict[str, Any]:
        """The batch job as this API's batch routes describe it (``base_url``: the server's, for links)."""

    def batch_files(self, job: BatchJob, outcomes: dict[str, Outcome]) -> dict[str, list[str]]:
        """The JSONL files a finished job leaves (the job's attribute naming each file → its lines)."""
        return {}


# A batch request's outcome: (result kind, HTTP status, reply or error body).
Outcome = tuple[str, int, dict[str, Any]]


@dataclass
class BatchJob:
    """One batch as the server keeps it: its requests (custom_id → request body), and once it has
    completed, each request's outcome (custom_id → (kind, status, reply or error body)); its
    ``wire`` words its replies and describes it."""

    id: str
    wire: Wire
    requests: dict[str, dict[str, Any]]
    created_at: float
    input_file_id: str | None = None
    endpoint: str = "/v1/chat/completions"
    outcomes: dict[str, Outcome] | None = None
    ended_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    looks: int = 0  # status requests so far (a client polling)


def content_digest(*parts: Any) -> str:
    """A stable hex digest of ``parts``: the ids the scripted server makes up."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


# ---------------------------------------------------------------- the OpenAI embeddings API

SCRIPTED_EMBEDDING_DIMENSIONS = 64


def scripted_embedding(text: str, dimensions: int = SCRIPTED_EMBEDDING_DIMENSIONS) -> list[float]:
    """A deterministic unit vector for ``text``: each word hashed to a signed coordinate, so texts
    sharing words are near and texts sharing none are far (retrieval behaves as with a real model)."""
    vector = [0.0] * dimensions
    for word in "".join(c if c.isalnum() else " " for c in text.lower()).split():
        value = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
        vector[value % dimensions] += 1.0 if (value >> 63) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else [1.0] + [0.0] * (dimensions - 1)


def embeddings_body(
    model: str, vectors: list[list[float]], encoding_format: str | None, prompt_tokens: int
) -> dict[str, Any]:
    """An OpenAI ``/v1/embeddings`` reply; ``encoding_format: base64`` (the OpenAI SDK's default)
    sends each vector as little-endian float32 bytes, as OpenAI does."""

    def encoded(vector: list[float]) -> Any:
        if encoding_format == "base64":
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        return vector

    return {
        "object": "list",
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
