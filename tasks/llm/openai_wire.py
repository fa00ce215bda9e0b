"""The OpenAI wire: chat-completions replies and errors, Azure's content filter, OpenAI's 429
headers, automatic prompt caching and the files + batches API's job object and result files, for
the scripted model server (``provider_wire.Wire`` says what a wire holds)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from refusalbench.tasks.llm.provider_wire import (
    AZURE_PROMPT_FILTERED,
    INLINE_REASONING,
    JSON_SCHEMA_UNSUPPORTED,
    BatchJob,
    Outcome,
    RateLimit,
    Rejection,
    ShapedReply,
    Wire,
    content_digest,
    go_duration,
    inline_text,
)
from refusalbench.tasks.llm.scripted_prompt_cache import ScriptedPromptCache

FILTER_CATEGORIES = ("hate", "self_harm", "sexual", "violence")


def filter_results(filtered: bool) -> dict[str, Any]:
    # Azure's verdict per category; a block names one (violence).
    hit = {name: filtered and name == "violence" for name in FILTER_CATEGORIES}
    return {name: {"filtered": hit[name], "severity": "medium" if hit[name] else "safe"} for name in FILTER_CATEGORIES}


class OpenAIWire(Wire):
    """The OpenAI chat-completions API, its files + batches API, and Azure's content filter."""

    name = "openai"
    injected_error_kind = "injected"
    batch_missing = "No such batch"

    def error_body(self, status: int, message: str, *, kind: str | None = None, **fields: Any) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": None} | fields}

    def reply_body(self, reply: ShapedReply, tool: str | None) -> dict[str, Any]:
        text = inline_text(reply)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reply.reasoning and reply.reasoning_in not in INLINE_REASONING:
            message["reasoning_content" if reply.reasoning_in == "field" else "reasoning"] = reply.reasoning
        finish_reason = {"stop": "stop", "length": "length", "content_filter": "content_filter", "refusal": "stop"}[
            reply.finish
        ]
        if reply.finish == "refusal":
            message.update(content=None, refusal=text)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
        if reply.reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
        if reply.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
        body: dict[str, Any] = {
            "id": f"chatcmpl-{hashlib.sha256(text.encode()).hexdigest()[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.served_model,
            "choices": [choice],
            "usage": usage,
        }
        if reply.finish == "content_filter":
            # Azure's shape: the output filter's verdict per category, content null when nothing was kept.
            message["content"] = text or None
            choice["content_filter_results"] = filter_results(True)
            body["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": filter_results(False)}]
        if reply.system_fingerprint is not None:
            body["system_fingerprint"] = reply.system_fingerprint
        return body

    def structured_output_rejection(self, request: dict[str, Any], body: dict[str, Any]) -> Rejection | None:
        if (request.get("response_format") or {}).get("type") != "json_schema":
            return None
        error = self.error_body(400, JSON_SCHEMA_UNSUPPORTED, kind="invalid_request_error", param="response_format")
        return Rejection(400, error)

    def prompt_filtered_rejection(self) -> Rejection:
        # Azure's body, word for word.
        filtered = {
            "error": {
                "message": AZURE_PROMPT_FILTERED,
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": filter_results(True)},
            }
        }
        return Rejection(400, filtered)

    def context_length_rejection(self, prompt_tokens: int) -> Rejection:
        # OpenAI's body for a prompt over the window: invalid_request_error, code context_length_exceeded.
        message = (
            f"This model's maximum context length is {prompt_tokens - 1} tokens. However, your messages resulted "
            f"in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
        return Rejection(
            400,
            self.error_body(
                400, message, kind="invalid_request_error", param="messages", code="context_length_exceeded"
            ),
        )

    def _rate_limited(
        self, limit: RateLimit, kind: str, wait: float, reset_at: float, model: str, headers: dict[str, str]
    ) -> Rejection:
        headers |= {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-requests": "0" if kind == "requests" else "59",
            "x-ratelimit-remaining-tokens": "0" if kind == "tokens" else "149000",
        }
        if limit.form in ("reset_requests", "reset_tokens"):
            headers[f"x-ratelimit-reset-{kind}"] = go_duration(wait)
        message = f"Rate limit reached for {kind} per min on model {model}. Please try again in {go_duration(wait)}."
        return Rejection(429, self.error_body(429, message, kind=kind, code="rate_limit_exceeded"), headers)

    def cached_prefix(
        self,
        cache: ScriptedPromptCache,
        body: dict[str, Any],
        request: dict[str, Any],
        reply: ShapedReply,
        entry: dict[str, Any],
    ) -> tuple[int, int]:
        # Automatic caching: nothing is marked or written; a prompt below the minimum has nothing to read.
        return (cache.openai(request), 0) if reply.prompt_tokens >= cache.min_tokens else (0, 0)

    def batch_object(self, job: BatchJob, base_url: str) -> dict[str, Any]:
        outcomes = job.outcomes or {}
        kinds = {kind for kind, _, _ in outcomes.values()}
        status = (
            "in_progress"
            if job.outcomes is None
            else "cancelled"
            if "canceled" in kinds
            else "expired"
            if "expired" in kinds
            else "completed"
        )
        ended = int(job.ended_at) if job.ended_at else None
        return {
            "id": job.id,
            "object": "batch",
            "endpoint": job.endpoint,
            "errors": None,
            "input_file_id": job.input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": job.output_file_id,
            "error_file_id": job.error_file_id,
            "created_at": int(job.created_at),
            "in_progress_at": int(job.created_at),
            "expires_at": int(job.created_at) + 86400,
            "finalizing_at": ended,
            "completed_at": ended if status == "completed" else None,
            "failed_at": None,
            "expired_at": ended if status == "expired" else None,
            "cancelling_at": ended if status == "cancelled" else None,
            "cancelled_at": ended if status == "cancelled" else None,
            "request_counts": {
                "total": len(job.requests),
                "completed": sum(kind == "succeeded" for kind, _, _ in outcomes.values()),
                "failed": sum(kind != "succeeded" for kind, _, _ in outcomes.values()),
            },
            "metadata": {},
        }

    def batch_files(self, job: BatchJob, outcomes: dict[str, Outcome]) -> dict[str, list[str]]:
        # The output file holds the answered requests, the error file the failed and expired ones.
        good = [self._batch_line(job, cid, out) for cid, out in outcomes.items() if out[0] == "succeeded"]
        bad = [self._batch_line(job, cid, out) for cid, out in outcomes.items() if out[0] in ("errored", "expired")]
        return {"output_file_id": good, "error_file_id": bad}

    @staticmethod
    def _batch_line(job: BatchJob, custom_id: str, outcome: Outcome) -> str:
        kind, status, reply = outcome
        line: dict[str, Any] = {
            "id": f"batch_req_{content_digest(job.id, custom_id)[:24]}",
            "custom_id": custom_id,
            "response": None,
            "error": None,
        }
        if kind == "expired":
            line["error"] = {
                "code": "batch_expired",
                "message": "This request could not be executed before the completion window expired.",
            }
        else:
            line["response"] = {
                "status_code": status,
                "request_id": f"req_{content_digest(custom_id)[:24]}",
                "body": reply,
            }
        return json.dumps(line)


OPENAI = OpenAIWire()
