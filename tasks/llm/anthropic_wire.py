"""The Anthropic wire: a Messages API request read as chat completions (``from_anthropic``), its
required headers and ``max_tokens``, its replies, errors and 429 headers, explicit (marked) prompt
caching and the message batches API's job object and results, for the scripted model server
(``provider_wire.Wire`` says what a wire holds)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from refusalbench.tasks.llm.provider_wire import (
    INLINE_REASONING,
    BatchJob,
    Outcome,
    RateLimit,
    Rejection,
    ShapedReply,
    Wire,
    inline_text,
)
from refusalbench.tasks.llm.scripted_prompt_cache import ScriptedPromptCache

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
    if isinstance(title := schema.get("title"), str):
        return title
    keys = set(schema.get("properties") or {})
    return next(
        (name for name, known_schema in known.items() if set(known_schema.get("properties") or {}) == keys), fallback
    )


def _json_schema_format(schema: dict[str, Any], known: dict[str, dict[str, Any]], fallback: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": _schema_name(schema, known, fallback), "schema": schema}}


def from_anthropic(
    body: dict[str, Any], known_schemas: dict[str, dict[str, Any]] | None = None
) -> tuple[dict[str, Any], str | None]:
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


def _iso(moment: float | None) -> str | None:
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class AnthropicWire(Wire):
    """The Anthropic Messages API and its message batches API."""

    name = "anthropic"
    batch_missing = "batch not found"

    def read_request(
        self, body: dict[str, Any], known_schemas: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], str | None]:
        return from_anthropic(body, known_schemas)

    def header_error(self, headers: Mapping[str, str]) -> Rejection | None:
        if not (headers.get("x-api-key") or headers.get("authorization")):
            return Rejection(401, self.error_body(401, "x-api-key header is required"))
        if not headers.get("anthropic-version"):
            return Rejection(400, self.error_body(400, "anthropic-version: header is required"))
        return None

    def request_error(self, body: dict[str, Any]) -> Rejection | None:
        if not isinstance(body.get("max_tokens"), int):
            return Rejection(400, self.error_body(400, "max_tokens: Field required"))
        return None

    def error_body(self, status: int, message: str, *, kind: str | None = None, **fields: Any) -> dict[str, Any]:
        # The Messages API names every error's type; OpenAI's extra fields have no place here.
        error_type = kind or _ANTHROPIC_ERROR_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": f"req_{hashlib.sha256(message.encode()).hexdigest()[:24]}",
        }

    def reply_body(self, reply: ShapedReply, tool: str | None) -> dict[str, Any]:
        blocks: list[dict[str, Any]] = []
        if reply.reasoning and reply.reasoning_in not in INLINE_REASONING:
            signature = base64.b64encode(hashlib.sha256(reply.reasoning.encode()).digest()).decode()
            blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": signature})
        text = inline_text(reply)
        structured = None
        if tool is not None and reply.finish in ("stop", "length"):
            try:
                structured = json.loads(text)
            except ValueError:
                structured = None  # not JSON: the model answered in text instead of calling the tool
        if isinstance(structured, dict):
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{hashlib.sha256(text.encode()).hexdigest()[:20]}",
                    "name": tool,
                    "input": structured,
                }
            )
        elif text:
            blocks.append({"type": "text", "text": text})
        stop_reason = {
            "stop": "tool_use" if isinstance(structured, dict) else "end_turn",
            "length": "max_tokens",
            "content_filter": "refusal",
            "refusal": "refusal",
        }[reply.finish]
        return {
            "id": f"msg_{hashlib.sha256(text.encode()).hexdigest()[:24]}",
            "type": "message",
            "role": "assistant",
            "model": reply.served_model,
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.prompt_tokens - reply.cached_tokens - reply.cache_write_tokens,
                "output_tokens": reply.completion_tokens,
                "cache_creation_input_tokens": reply.cache_write_tokens,
                "cache_read_input_tokens": reply.cached_tokens,
                "service_tier": "standard",
            },
        }

    def structured_output_rejection(self, request: dict[str, Any], body: dict[str, Any]) -> Rejection | None:
        if not (body.get("output_format") or (body.get("output_config") or {}).get("format")):
            return None  # a forced tool still works
        return Rejection(400, self.error_body(400, "output_format: Extra inputs are not permitted"))

    def prompt_filtered_rejection(self) -> Rejection:
        return Rejection(400, self.error_body(400, "Output blocked by content filtering policy"))

    def context_length_rejection(self, prompt_tokens: int) -> Rejection:
        # The Messages API's body: invalid_request_error, "prompt is too long: N tokens > M maximum".
        message = f"prompt is too long: {prompt_tokens} tokens > {prompt_tokens - 1} maximum"
        return Rejection(400, self.error_body(400, message, kind="invalid_request_error"))

    def _rate_limited(
        self, limit: RateLimit, kind: str, wait: float, reset_at: float, model: str, headers: dict[str, str]
    ) -> Rejection:
        reset = datetime.fromtimestamp(math.ceil(reset_at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for name in ("requests", "tokens"):
            headers[f"anthropic-ratelimit-{name}-limit"] = "50" if name == "requests" else "40000"
            headers[f"anthropic-ratelimit-{name}-remaining"] = "0" if name == kind else "49"
            headers[f"anthropic-ratelimit-{name}-reset"] = reset
        message = f"This request would exceed the rate limit for your organization of 50 {kind} per minute."
        return Rejection(429, self.error_body(429, message), headers)

    def cached_prefix(
        self,
        cache: ScriptedPromptCache,
        body: dict[str, Any],
        request: dict[str, Any],
        reply: ShapedReply,
        entry: dict[str, Any],
    ) -> tuple[int, int]:
        # Explicit caching: marks live only in block lists, so a request without one has none.
        if not (
            isinstance(body.get("system"), list)
            or any(isinstance(m.get("content"), list) for m in body.get("messages") or [])
        ):
            return 0, 0
        read, written, marked = cache.anthropic(body)
        if marked:
            entry["cache_control"] = marked
        return read, written

    def batch_object(self, job: BatchJob, base_url: str) -> dict[str, Any]:
        outcomes = job.outcomes or {}
        counts = {
            name: sum(kind == name for kind, _, _ in outcomes.values())
            for name in ("succeeded", "errored", "canceled", "expired")
        }
        ended = job.outcomes is not None
        return {
            "id": job.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": {"processing": 0 if ended else len(job.requests), **counts},
            "ended_at": _iso(job.ended_at),
            "created_at": _iso(job.created_at),
            "expires_at": _iso(job.created_at + 86400),
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": (f"{base_url}/v1/messages/batches/{job.id}/results" if ended else None),
        }

    @staticmethod
    def batch_results(outcomes: dict[str, Outcome]) -> bytes:
        """A finished job's results as ``/v1/messages/batches/{id}/results`` sends them (JSONL)."""
        lines = []
        for custom_id, (kind, _, reply) in outcomes.items():
            result: dict[str, Any] = {"type": kind}
            if kind == "succeeded":
                result["message"] = reply
            elif kind == "errored":
                result["error"] = reply
            lines.append(json.dumps({"custom_id": custom_id, "result": result}))
        return ("\n".join(lines) + "\n").encode()


ANTHROPIC = AnthropicWire()
