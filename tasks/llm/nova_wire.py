"""The Amazon Nova wire on Bedrock: Nova's InvokeModel body (``system``, ``messages`` of ``{"text"}``
blocks, ``inferenceConfig``, ``toolConfig``) read as chat completions, and its reply (``output.message``,
``stopReason``, ``usage``) and errors, for the scripted server's InvokeModel route and Bedrock batch
jobs (``scripted_bedrock_batches``). Converse's reply has the same shape, so LiteLLM reads both alike."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from refusalbench.tasks.llm.anthropic_wire import JSON_TOOL_NAME, _json_schema_format
from refusalbench.tasks.llm.provider_wire import (
    INLINE_REASONING,
    BatchJob,
    RateLimit,
    Rejection,
    ShapedReply,
    Wire,
    inline_text,
)
from refusalbench.tasks.llm.scripted_prompt_cache import ScriptedPromptCache

# Bedrock names an error's type in a header (the body holds only its message), as the AWS SDKs read it.
ERROR_TYPE = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
TOO_LONG = "Input is too long for requested model."
# Nova's inferenceConfig fields under their chat-completions names.
INFERENCE_FIELDS = {"maxTokens": "max_tokens", "temperature": "temperature", "topP": "top_p", "stopSequences": "stop"}


def bedrock_error(status: int, kind: str, message: str) -> Rejection:
    """Bedrock's error for any model: the message in the body, its type (``kind``) in a header."""
    return Rejection(status, {"message": message}, {"x-amzn-ErrorType": kind + ERROR_TYPE})


def _text_of(blocks: Any) -> str:
    """The text blocks of a Nova content (or system) list, joined."""
    if not isinstance(blocks, list):
        return str(blocks or "")
    return "\n".join(str(b["text"]) for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))


def from_nova(body: dict[str, Any], known_schemas: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """A Nova body as the chat-completions dict responders read, and the tool a structured reply calls:
    the offered ``json_tool_call`` tool (or a forced one) becomes a JSON-schema ``response_format``."""
    messages = [{"role": "system", "content": _text_of(body["system"])}] if body.get("system") else []
    messages += [{"role": m.get("role"), "content": _text_of(m.get("content"))} for m in body.get("messages", [])]
    request: dict[str, Any] = {"messages": messages}
    for field, name in INFERENCE_FIELDS.items():
        if field in (body.get("inferenceConfig") or {}):
            request[name] = body["inferenceConfig"][field]
    tools = (body.get("toolConfig") or {}).get("tools") or []
    forced = ((body.get("toolConfig") or {}).get("toolChoice") or {}).get("tool", {}).get("name")
    for tool in tools:
        spec = tool.get("toolSpec") or {}
        schema = (spec.get("inputSchema") or {}).get("json")
        if spec.get("name") == (forced or JSON_TOOL_NAME) and isinstance(schema, dict):
            request["response_format"] = _json_schema_format(schema, known_schemas, spec["name"])
            return request, spec["name"]
    return request, None


class NovaWire(Wire):
    """Amazon Nova's InvokeModel on Bedrock (its batch jobs carry the same bodies)."""

    name = "bedrock"
    batch_missing = "The specified job was not found"

    def read_request(
        self, body: dict[str, Any], known_schemas: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], str | None]:
        return from_nova(body, known_schemas)

    def request_error(self, body: dict[str, Any]) -> Rejection | None:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return Rejection(400, self.error_body(400, "Malformed input request: messages is required"))
        return None

    def error_body(self, status: int, message: str, *, kind: str | None = None, **fields: Any) -> dict[str, Any]:
        return {"message": message}

    def reply_body(self, reply: ShapedReply, tool: str | None) -> dict[str, Any]:
        blocks: list[dict[str, Any]] = []
        if reply.reasoning and reply.reasoning_in not in INLINE_REASONING:
            blocks.append({"reasoningContent": {"reasoningText": {"text": reply.reasoning}}})
        text = inline_text(reply)
        structured = None
        if tool is not None and reply.finish in ("stop", "length"):
            try:
                structured = json.loads(text)
            except ValueError:
                structured = None  # not JSON: the model answered in text instead of calling the tool
        if isinstance(structured, dict):
            use_id = f"tooluse_{hashlib.sha256(text.encode()).hexdigest()[:20]}"
            blocks.append({"toolUse": {"toolUseId": use_id, "name": tool, "input": structured}})
        elif text:
            blocks.append({"text": text})
        stop_reason = {
            "stop": "tool_use" if isinstance(structured, dict) else "end_turn",
            "length": "max_tokens",
            "content_filter": "content_filtered",
            "refusal": "content_filtered",
        }[reply.finish]
        uncached = reply.prompt_tokens - reply.cached_tokens - reply.cache_write_tokens
        return {
            "output": {"message": {"role": "assistant", "content": blocks}},
            "stopReason": stop_reason,
            "usage": {
                "inputTokens": uncached,
                "outputTokens": reply.completion_tokens,
                "totalTokens": reply.prompt_tokens + reply.completion_tokens,
                "cacheReadInputTokenCount": reply.cached_tokens,
                "cacheWriteInputTokenCount": reply.cache_write_tokens,
            },
        }

    def structured_output_rejection(self, request: dict[str, Any], body: dict[str, Any]) -> Rejection | None:
        return None  # Nova carries a schema as a tool, which it takes

    def prompt_filtered_rejection(self) -> Rejection:
        return bedrock_error(400, "ValidationException", "The request was blocked by content filtering.")

    def context_length_rejection(self, prompt_tokens: int) -> Rejection:
        return bedrock_error(400, "ValidationException", TOO_LONG)

    def _rate_limited(
        self, limit: RateLimit, kind: str, wait: float, reset_at: float, model: str, headers: dict[str, str]
    ) -> Rejection:
        rejection = bedrock_error(429, "ThrottlingException", "Too many requests, please wait before trying again.")
        return Rejection(429, rejection.body, {**rejection.headers, **headers})

    def cached_prefix(
        self,
        cache: ScriptedPromptCache,
        body: dict[str, Any],
        request: dict[str, Any],
        reply: ShapedReply,
        entry: dict[str, Any],
    ) -> tuple[int, int]:
        return 0, 0  # the scripted Nova route keeps no prompt cache

    def batch_object(self, job: BatchJob, base_url: str) -> dict[str, Any]:
        raise NotImplementedError("Bedrock's jobs are served by scripted_bedrock_batches.BedrockBatchDesk")


NOVA = NovaWire()
