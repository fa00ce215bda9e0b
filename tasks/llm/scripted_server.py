"""A scripted model server: dry runs of a config without spending money, and the test suite's provider.

It speaks the OpenAI chat-completions API (``POST /v1/chat/completions``) and the Anthropic
Messages API (``POST /v1/messages``). Start it, point the models of a config at it and run the
config: every stage runs for real, over HTTP, and no provider is called::

    python -m refusalbench.tasks.llm.scripted_server --port 8099

OpenAI-style models take ``api_base: http://127.0.0.1:8099/v1``; ``anthropic/`` models take
``api_base: http://127.0.0.1:8099`` (LiteLLM appends ``/v1/messages``) and need any API key.

Its default replies (``dry_run_responder``) fit each role: a request that names a JSON schema
(generators, verifiers, judges, the KnowOrNot helper stages) gets a small valid object for that
schema; a KnowOrNot evaluator prompt that asks for ``<tag>label</tag>`` gets one of the listed
labels; anything else (targets) gets a short answer. Replies depend only on the request, so a
second run is served from the call cache like any other.

The test suite uses the same server (``ScriptedLLMServer``) as its model double: replies come
from any Python callable, which reads every request in the chat-completions shape (an Anthropic
request is translated first: system prompt as a system message, a forced tool or
``output_format`` as a JSON-schema ``response_format``). Faults (5xx, 429 with Retry-After, hung
requests, 200 with a body that is not JSON, empty content) are injected by rate or queued one by
one. Per model, a :class:`Behaviour` shapes replies the way real providers do: reasoning inline
in ``<think>`` tags or in its own field, truncation, safety blocks, a 400 for ``json_schema``,
429s worded in each provider's headers, a served model name and ``system_fingerprint`` of its
own. Every request is logged (optionally to a JSONL file, so a test can count calls across a
killed process) with the wire format, the time it arrived, the headers that matter and, for
each reply, the tokens it billed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal

from aiohttp import web

Responder = Callable[[dict[str, Any]], str]
WireFormat = Literal["openai", "anthropic"]


@dataclass
class Fault:
    kind: str  # "status" | "hang" | "not_json" | "empty"
    status: int = 500
    retry_after: float | None = None


@dataclass
class FaultRates:
    server_error: float = 0.0  # HTTP 500
    rate_limited: float = 0.0  # HTTP 429 with Retry-After
    hang: float = 0.0  # never answers within the client's timeout
    not_json: float = 0.0  # HTTP 200 whose body is not JSON
    empty: float = 0.0  # HTTP 200 with empty content
    retry_after_s: float = 0.05


def last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def request_fingerprint(request: dict[str, Any]) -> str:
    blob = json.dumps({"model": request.get("model"), "messages": request.get("messages")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def requested_schema(request: dict[str, Any]) -> str | None:
    """The name of the JSON schema a request asks for (e.g. ``VerifierOutput``), if any."""
    fmt = request.get("response_format") or {}
    return (fmt.get("json_schema") or {}).get("name")


def fenced(text: str, tag: str) -> list[str]:
    """Contents of <tag ...>...</tag> blocks in a rendered prompt."""
    return [m.strip() for m in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", text, flags=re.DOTALL)]


def echo_responder(request: dict[str, Any]) -> str:
    return "echo: " + last_user_text(request)[:200]


def example_for_schema(schema: dict[str, Any], label: str = "scripted") -> Any:
    """The smallest value that satisfies a (references-inlined) JSON schema.

    Booleans are true and enums take their first value, so verifiers say PASS; numbers take their
    minimum; strings carry ``label`` so replies to different requests differ.
    """
    if "enum" in schema:
        return schema["enum"][0]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return example_for_schema(next((o for o in options if o.get("type") != "null"), options[0]), label)
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: example_for_schema(sub, f"{label} {name}") for name, sub in properties.items()}
    if kind == "array":
        count = max(1, schema.get("minItems", 1))
        return [example_for_schema(schema.get("items", {}), f"{label} {i + 1}") for i in range(count)]
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "null":
        return None
    return label


# The last lines of a KnowOrNot evaluator prompt list the allowed verdicts as <tag>label</tag>.
_LABEL_LINE = re.compile(r"^<([A-Za-z_][\w-]*)>([^<>\n]+)</\1>\s*$", re.MULTILINE)


def dry_run_responder(request: dict[str, Any]) -> str:
    """A plausible reply for any role, decided by the request alone (see the module docstring)."""
    fingerprint = request_fingerprint(request)
    schema = ((request.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if isinstance(schema, dict):
        return json.dumps(example_for_schema(schema, f"scripted {fingerprint[:6]}"))
    labels = _LABEL_LINE.findall(last_user_text(request))
    if labels:
        tag = labels[-1][0]
        choices = [label for name, label in labels if name == tag]
        # Spread the verdicts over the labels, so a dry run reaches every branch that depends on them.
        return f"Scripted verdict. <{tag}>{choices[int(fingerprint, 16) % len(choices)]}</{tag}>"
    return f"Scripted answer {fingerprint[:6]}."


# ---------------------------------------------------------------- the Anthropic Messages API

# The tool LiteLLM's anthropic/ adapter forces for a response_format (its RESPONSE_FORMAT_TOOL_NAME).
JSON_TOOL_NAME = "json_tool_call"


def _text_of(content: Any) -> Any:
    """A Messages API content (a string or a list of blocks) as chat-completions text."""
    if isinstance(content, list):
        texts = [block.get("text", "") for block in content if isinstance(block, dict) and block.get("type") == "text"]
        return "\n".join(texts) if texts else json.dumps(content)
    return content


def _schema_name(schema: dict[str, Any], known: dict[str, dict[str, Any]], fallback: str) -> str:
    # The Messages API carries no schema name: take the schema's title, else the known schema
    # with the same top-level properties (the adapter may rewrite the rest of the schema).
    if isinstance(schema.get("title"), str):
        return schema["title"]
    keys = set(schema.get("properties") or {})
    return next((name for name, known_schema in known.items() if set(known_schema.get("properties") or {}) == keys),
                fallback)


def _json_schema_format(schema: dict[str, Any], known: dict[str, dict[str, Any]], fallback: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": _schema_name(schema, known, fallback), "schema": schema}}


def from_anthropic(body: dict[str, Any],
                   known_schemas: dict[str, dict[str, Any]] | None = None) -> tuple[dict[str, Any], str | None]:
    """A Messages API request as the chat-completions dict responders read, and the tool a
    structured reply must call (None: the reply is text).

    The system prompt becomes the first message; text blocks are joined; ``output_format`` (or
    ``output_config.format``) or a forced tool becomes a JSON-schema ``response_format``, named
    after the schema's title or the entry of ``known_schemas`` with the same properties. Every
    other field (``max_tokens``, ``thinking``, ``tools`` ...) is kept as sent.
    """
    messages = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text_of(body["system"])})
    messages += [{"role": m.get("role"), "content": _text_of(m.get("content"))} for m in body.get("messages", [])]
    request = {k: v for k, v in body.items() if k not in ("system", "messages")}
    request["messages"] = messages
    known = known_schemas or {}
    output_format = body.get("output_format") or (body.get("output_config") or {}).get("format")
    if isinstance(output_format, dict) and isinstance(output_format.get("schema"), dict):
        request["response_format"] = _json_schema_format(output_format["schema"], known, "output")
        return request, None
    choice = body.get("tool_choice") or {}
    forced = choice.get("name") if choice.get("type") == "tool" else None
    for tool in body.get("tools") or []:
        # A forced tool, or the adapter's JSON tool offered without forcing (thinking forbids forcing).
        if tool.get("name") == (forced or JSON_TOOL_NAME) and isinstance(tool.get("input_schema"), dict):
            request["response_format"] = _json_schema_format(tool["input_schema"], known, tool["name"])
            return request, tool["name"]
    return request, None


_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                          500: "api_error", 529: "overloaded_error"}


def error_body(wire: WireFormat, status: int, message: str, *, kind: str | None = None,
               **openai_fields: Any) -> dict[str, Any]:
    """An error body as each API words it (Anthropic: ``{"type": "error", "error": {"type": ...}}``)."""
    if wire == "anthropic":
        error_type = kind or _ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": error_type, "message": message},
                "request_id": f"req_{hashlib.sha256(message.encode()).hexdigest()[:24]}"}
    return {"error": {"message": message, "type": kind, "param": None, "code": None} | openai_fields}


# ---------------------------------------------------------------- real providers' manners

Finish = Literal["stop", "length", "content_filter", "refusal"]
ReasoningPlace = Literal["field", "reasoning_field", "think_tags", "think_end_only"]
_INLINE = ("think_tags", "think_end_only")
RateLimitForm = Literal["seconds", "ms", "http_date", "reset_requests", "reset_tokens"]

# What an aligned model or a provider's safety layer writes instead of an answer.
CANNED_REFUSAL = "I'm sorry, but I can't help with that."
# Azure OpenAI's 400 for a prompt its content filter blocked, word for word.
AZURE_PROMPT_FILTERED = ("The response was filtered due to the prompt triggering Azure OpenAI's content management "
                         "policy. Please modify your prompt and retry. To learn more about our content filtering "
                         "policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766")
# The 400 of an OpenAI-compatible server that only accepts json_object.
JSON_SCHEMA_UNSUPPORTED = "response_format.type 'json_schema' is not supported; use 'json_object'"
_FILTER_CATEGORIES = ("hate", "self_harm", "sexual", "violence")


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
        answer = answer[:behaviour.truncate_at]
    inline = behaviour.reasoning_in in _INLINE
    reasoning_tokens = _words(reasoning) if reasoning else 0
    answer_tokens = _words(answer)
    completion_tokens = answer_tokens + reasoning_tokens
    budget = _max_tokens(request)
    if behaviour.finish == "length" and budget is not None:
        completion_tokens = max(budget, answer_tokens)
        reasoning_tokens = completion_tokens - answer_tokens if reasoning else 0
    prompt_tokens = sum(_words(m.get("content")) for m in request.get("messages", []))
    return ShapedReply(
        answer=answer, reasoning=reasoning, reasoning_in=behaviour.reasoning_in, finish=behaviour.finish,
        served_model=behaviour.served_model or str(request.get("model", "fake")),
        system_fingerprint=behaviour.system_fingerprint, prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        # Inline reasoning is part of the text: the provider cannot tell it apart, so reports none.
        reasoning_tokens=0 if inline else reasoning_tokens,
        cached_tokens=min(behaviour.cached_prompt_tokens, prompt_tokens))


def _inline_text(reply: ShapedReply) -> str:
    """The content with reasoning written inline, as a model without a reasoning parser emits it."""
    if not reply.reasoning or reply.reasoning_in not in _INLINE:
        return reply.answer
    opening = "<think>\n" if reply.reasoning_in == "think_tags" else ""
    if reply.finish == "length" and not reply.answer:
        return f"{opening}{reply.reasoning}"  # the budget ran out inside the reasoning: no closing tag
    return f"{opening}{reply.reasoning}\n</think>\n\n{reply.answer}"


def _filter_results(filtered: bool) -> dict[str, Any]:
    # Azure's verdict per category; a block names one (violence).
    hit = {name: filtered and name == "violence" for name in _FILTER_CATEGORIES}
    return {name: {"filtered": hit[name], "severity": "medium" if hit[name] else "safe"} for name in _FILTER_CATEGORIES}


def openai_body(reply: ShapedReply) -> dict[str, Any]:
    """The reply as a chat completion."""
    text = _inline_text(reply)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reply.reasoning and reply.reasoning_in not in _INLINE:
        message["reasoning_content" if reply.reasoning_in == "field" else "reasoning"] = reply.reasoning
    finish_reason = {"stop": "stop", "length": "length", "content_filter": "content_filter", "refusal": "stop"}[reply.finish]
    if reply.finish == "refusal":
        message.update(content=None, refusal=text)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
    usage: dict[str, Any] = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                             "total_tokens": reply.prompt_tokens + reply.completion_tokens}
    if reply.reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
    if reply.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    body: dict[str, Any] = {
        "id": f"chatcmpl-{hashlib.sha256(text.encode()).hexdigest()[:12]}", "object": "chat.completion",
        "created": int(time.time()), "model": reply.served_model, "choices": [choice], "usage": usage}
    if reply.finish == "content_filter":
        # Azure's shape: the output filter's verdict per category, content null when nothing was kept.
        message["content"] = text or None
        choice["content_filter_results"] = _filter_results(True)
        body["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": _filter_results(False)}]
    if reply.system_fingerprint is not None:
        body["system_fingerprint"] = reply.system_fingerprint
    return body


def anthropic_body(reply: ShapedReply, tool: str | None) -> dict[str, Any]:
    """The reply as a Messages API message; a structured reply calls ``tool`` when one was offered."""
    blocks: list[dict[str, Any]] = []
    if reply.reasoning and reply.reasoning_in not in _INLINE:
        signature = base64.b64encode(hashlib.sha256(reply.reasoning.encode()).digest()).decode()
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": signature})
    text = _inline_text(reply)
    structured = None
    if tool is not None and reply.finish in ("stop", "length"):
        try:
            structured = json.loads(text)
        except ValueError:
            structured = None  # not JSON: the model answered in text instead of calling the tool
    if isinstance(structured, dict):
        blocks.append({"type": "tool_use", "id": f"toolu_{hashlib.sha256(text.encode()).hexdigest()[:20]}",
                       "name": tool, "input": structured})
    elif text:
        blocks.append({"type": "text", "text": text})
    stop_reason = {"stop": "tool_use" if isinstance(structured, dict) else "end_turn", "length": "max_tokens",
                   "content_filter": "refusal", "refusal": "refusal"}[reply.finish]
    return {
        "id": f"msg_{hashlib.sha256(text.encode()).hexdigest()[:24]}", "type": "message", "role": "assistant",
        "model": reply.served_model, "content": blocks, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens - reply.cached_tokens, "output_tokens": reply.completion_tokens,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": reply.cached_tokens,
                  "service_tier": "standard"}}


def rate_limit_rejection(limit: RateLimit, wire: WireFormat, model: str, now: float) -> Rejection:
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
    if wire == "anthropic":
        reset = datetime.fromtimestamp(math.ceil(reset_at), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for name in ("requests", "tokens"):
            headers[f"anthropic-ratelimit-{name}-limit"] = "50" if name == "requests" else "40000"
            headers[f"anthropic-ratelimit-{name}-remaining"] = "0" if name == kind else "49"
            headers[f"anthropic-ratelimit-{name}-reset"] = reset
        message = f"This request would exceed the rate limit for your organization of 50 {kind} per minute."
        return Rejection(429, error_body(wire, 429, message), headers)
    headers |= {"x-ratelimit-limit-requests": "60", "x-ratelimit-limit-tokens": "150000",
                "x-ratelimit-remaining-requests": "0" if kind == "requests" else "59",
                "x-ratelimit-remaining-tokens": "0" if kind == "tokens" else "149000"}
    if limit.form in ("reset_requests", "reset_tokens"):
        headers[f"x-ratelimit-reset-{kind}"] = go_duration(wait)
    message = f"Rate limit reached for {kind} per min on model {model}. Please try again in {go_duration(wait)}."
    return Rejection(429, error_body(wire, 429, message, kind=kind, code="rate_limit_exceeded"), headers)


# ---------------------------------------------------------------- the server

# The request headers a test may ask about: authentication, API version, deployment selectors.
_LOGGED_HEADERS = ("authorization", "x-api-key", "api-key", "anthropic-version", "anthropic-beta")


@dataclass
class ScriptedLLMServer:
    """The server, on a background thread; ``responder`` decides every reply (tests swap it freely),
    ``behaviours`` shapes each model's replies the way a real provider would (by requested model
    name, without a provider prefix), ``known_schemas`` names the JSON schemas an Anthropic request
    carries without a name (by their top-level properties).

    ``calls`` logs every request as it arrived: ``time``, ``wire`` (``openai`` | ``anthropic``),
    ``model``, ``messages`` and ``response_format`` (chat-completions shape), ``params`` (the rest),
    ``headers`` (authentication, API version), ``fault``, ``status``, ``billed`` (the tokens the
    reply billed; zero for errors) and, for a reply, its ``finish``."""

    responder: Responder = echo_responder
    latency_s: float = 0.0
    faults: FaultRates = field(default_factory=FaultRates)
    seed: int = 0
    hang_s: float = 60.0
    log_path: str | Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    known_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._queued: deque[Fault] = deque()
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._rate_limited: dict[str, int] = {}  # 429s served so far, per model
        self.inflight = 0
        self.max_inflight = 0

    # ------------------------------------------------------------ control

    @property
    def url(self) -> str:
        """The ``api_base`` of OpenAI-style models."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        """The ``api_base`` of ``anthropic/`` models (LiteLLM appends ``/v1/messages``)."""
        return f"http://{self.host}:{self.port}"

    def fail_next(self, count: int = 1, *, status: int = 500, retry_after: float | None = None, kind: str = "status") -> None:
        for _ in range(count):
            self._queued.append(Fault(kind=kind, status=status, retry_after=retry_after))

    def calls_for(self, model: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["model"] == model]

    def billed(self, model: str | None = None) -> dict[str, int]:
        """Tokens billed so far (to ``model``, or to all): prompt, completion, reasoning, cached."""
        total = {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0}
        for call in self.calls:
            if model is None or call["model"] == model:
                for key, value in (call.get("billed") or {}).items():
                    total[key] += value
        return total

    def start(self) -> "ScriptedLLMServer":
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/chat/completions", self._handle_openai)
            app.router.add_post("/chat/completions", self._handle_openai)
            app.router.add_post("/v1/messages", self._handle_anthropic)
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="scripted-llm", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("scripted model server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "ScriptedLLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ HTTP

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    def _draw_fault(self) -> Fault | None:
        with self._lock:
            if self._queued:
                return self._queued.popleft()
            rates = self.faults
            roll = self._rng.random()
        edges = [
            (rates.server_error, Fault("status", 500)),
            (rates.rate_limited, Fault("status", 429, retry_after=rates.retry_after_s)),
            (rates.hang, Fault("hang")),
            (rates.not_json, Fault("not_json")),
            (rates.empty, Fault("empty")),
        ]
        cumulative = 0.0
        for rate, fault in edges:
            cumulative += rate
            if roll < cumulative:
                return fault
        return None

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append(entry)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry) + "\n")

    def _protocol_error(self, http: web.Request, body: dict[str, Any]) -> Rejection | None:
        """What the Messages API refuses before anything else: no key, no version, no max_tokens."""
        if not (http.headers.get("x-api-key") or http.headers.get("authorization")):
            return Rejection(401, error_body("anthropic", 401, "x-api-key header is required"))
        if not http.headers.get("anthropic-version"):
            return Rejection(400, error_body("anthropic", 400, "anthropic-version: header is required"))
        if not isinstance(body.get("max_tokens"), int):
            return Rejection(400, error_body("anthropic", 400, "max_tokens: Field required"))
        return None

    def _behaviour_rejection(self, request: dict[str, Any], body: dict[str, Any], behaviour: Behaviour | None,
                             wire: WireFormat, now: float) -> Rejection | None:
        """The error ``behaviour`` answers this request with, if any (a 429 counts as served)."""
        if behaviour is None:
            return None
        model = str(request.get("model"))
        limit = behaviour.rate_limit
        if limit is not None:
            with self._lock:
                served = self._rate_limited.get(model, 0)
                limited = ((limit.requests is None or served < limit.requests)
                           and (limit.until is None or now < limit.until))
                if limited:
                    self._rate_limited[model] = served + 1
            if limited:
                return rate_limit_rejection(limit, wire, model, now)
        if behaviour.prompt_filtered:
            if wire == "anthropic":
                return Rejection(400, error_body(wire, 400, "Output blocked by content filtering policy"))
            filtered = {"error": {"message": AZURE_PROMPT_FILTERED, "type": None, "param": "prompt",
                                  "code": "content_filter", "status": 400,
                                  "innererror": {"code": "ResponsibleAIPolicyViolation",
                                                 "content_filter_result": _filter_results(True)}}}
            return Rejection(400, filtered)
        if behaviour.rejects_json_schema:
            if wire == "anthropic" and (body.get("output_format") or (body.get("output_config") or {}).get("format")):
                return Rejection(400, error_body(wire, 400, "output_format: Extra inputs are not permitted"))
            if wire == "openai" and (request.get("response_format") or {}).get("type") == "json_schema":
                return Rejection(400, error_body(wire, 400, JSON_SCHEMA_UNSUPPORTED, kind="invalid_request_error",
                                                 param="response_format"))
        return None

    async def _handle_openai(self, http: web.Request) -> web.StreamResponse:
        return await self._serve(http, "openai")

    async def _handle_anthropic(self, http: web.Request) -> web.StreamResponse:
        return await self._serve(http, "anthropic")

    async def _serve(self, http: web.Request, wire: WireFormat) -> web.StreamResponse:
        received = time.time()
        body = await http.json()
        tool = None
        rejection = self._protocol_error(http, body) if wire == "anthropic" else None
        request = body
        if wire == "anthropic":
            request, tool = from_anthropic(body, self.known_schemas)
        behaviour = self.behaviours.get(str(request.get("model")))
        fault = self._draw_fault() if rejection is None else None
        if rejection is None and fault is None:
            rejection = self._behaviour_rejection(request, body, behaviour, wire, received)
        status = rejection.status if rejection else fault.status if fault and fault.kind == "status" else 200
        entry = {
            "time": received,
            "wire": wire,
            "model": request.get("model"),
            "fingerprint": request_fingerprint(request),
            "messages": request.get("messages"),
            "response_format": request.get("response_format"),
            # Everything else the request set (sampling parameters), as the provider received it.
            "params": {k: v for k, v in request.items() if k not in ("model", "messages", "response_format")},
            "fault": fault.kind if fault else None,
            "status": status,
            # What the client authenticated with: lets a test prove a key from the environment was used.
            "authorization": http.headers.get("Authorization"),
            "headers": {name: http.headers[name] for name in _LOGGED_HEADERS if name in http.headers},
            # What the reply billed; filled in when one is sent (errors bill nothing).
            "billed": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0},
        }
        self._log(entry)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if rejection is not None:
                return web.json_response(rejection.body, status=rejection.status, headers=rejection.headers)
            if fault is not None and fault.kind != "empty":
                if fault.kind == "status":
                    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                    kind = "injected" if wire == "openai" else None  # the Messages API names its error types
                    return web.json_response(error_body(wire, fault.status, f"injected {fault.status}", kind=kind),
                                             status=fault.status, headers=headers)
                if fault.kind == "hang":
                    await asyncio.sleep(self.hang_s)
                    return web.json_response(error_body(wire, 504, "hung"), status=504)
                return web.Response(text="<html>upstream garbage</html>", content_type="application/json")
            shaping = behaviour or Behaviour()
            if fault is not None:  # an injected empty reply
                shaping = Behaviour(content="", served_model=shaping.served_model,
                                    system_fingerprint=shaping.system_fingerprint)
            try:
                answer = shaping.content if shaping.content is not None else self.responder(request)
                reply = shape_reply(request, answer, shaping)
            except Exception as exc:  # a broken script is a server error, visible to the test
                entry["status"] = 500
                return web.json_response(error_body(wire, 500, f"responder failed: {exc}"), status=500)
            entry["billed"] = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                               "reasoning_tokens": reply.reasoning_tokens, "cached_tokens": reply.cached_tokens}
            entry["finish"] = reply.finish
            return web.json_response(anthropic_body(reply, tool) if wire == "anthropic" else openai_body(reply))
        finally:
            self.inflight -= 1


def main(argv: list[str] | None = None) -> None:
    """Serve scripted replies on loopback until interrupted (``--responder echo`` for echoes)."""
    parser = argparse.ArgumentParser(description="A scripted model server (OpenAI chat completions and Anthropic "
                                                 "Messages API) for dry runs of a config.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--responder", choices=sorted(RESPONDERS), default="dry-run")
    parser.add_argument("--log", default=None, help="append every request to this JSONL file")
    args = parser.parse_args(argv)
    server = ScriptedLLMServer(responder=RESPONDERS[args.responder], latency_s=args.latency,
                               host=args.host, port=args.port, log_path=args.log).start()
    print(f"scripted model server at {server.url} (set api_base: {server.url}; for anthropic/ models "
          f"api_base: {server.anthropic_url}); Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


RESPONDERS: dict[str, Responder] = {"dry-run": dry_run_responder, "echo": echo_responder}


if __name__ == "__main__":  # pragma: no cover
    main()
