"""Anthropic's Message Batches API: the requests posted in one JSON body, the results one JSONL file.

LiteLLM retrieves a message batch and reads its results, but cannot create or cancel one (its
``AnthropicBatchesConfig`` raises NotImplementedError), so those two requests are posted here,
to LiteLLM's own URL for them with LiteLLM's headers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from refusalbench.tasks.llm.batch_protocol import BatchRequest, LiteLLMBatches, failed_result, litellm_body
from refusalbench.tasks.llm.litellm_import import litellm_module


class AnthropicMessageBatches(LiteLLMBatches):
    """Anthropic's message batches: one ``{custom_id, params}`` per request, ``params`` the Messages API body."""

    async def submit(self, lines: Sequence[tuple[str, BatchRequest]]) -> str:
        requests = [
            {"custom_id": custom_id, "params": litellm_body(self.cfg, request)[0]} for custom_id, request in lines
        ]
        return str((await self.post("", {"requests": requests}))["id"])

    async def cancel(self, job_id: str) -> None:
        await self.post(f"/{job_id}/cancel", None)

    def result_files(self, job: Any) -> tuple[str, ...]:
        return tuple(filter(None, (job.output_file_id,)))  # one file: every request's result, errors included

    def read_line(self, row: dict[str, Any], replies: dict[str, dict[str, Any]]) -> None:
        result = row.get("result") or {}
        if result.get("type") == "succeeded":
            replies[row["custom_id"]] = result["message"]
        elif result.get("type") == "errored" and result.get("error") is not None:
            replies[row["custom_id"]] = failed_result(None, result["error"])

    def response(self, request: BatchRequest, body: dict[str, Any]) -> Any:
        import httpx
        from litellm.llms.anthropic.chat.transformation import AnthropicConfig

        json_mode = litellm_body(self.cfg, request)[1]  # whether the reply's JSON tool is the answer
        return AnthropicConfig().transform_parsed_response(
            completion_response=body,
            raw_response=httpx.Response(200, json=body),
            model_response=litellm_module().ModelResponse(),
            json_mode=json_mode,
        )

    async def post(self, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        """POST to the message batches endpoint (+ ``path``) with LiteLLM's URL and headers for it."""
        import aiohttp
        from litellm.llms.anthropic.batches.transformation import AnthropicBatchesConfig
        from litellm.llms.anthropic.common_utils import AnthropicModelInfo

        config = AnthropicBatchesConfig()  # type: ignore[no-untyped-call]
        api_key = self.api_key or AnthropicModelInfo.get_api_key()
        url = config.get_complete_batch_url(self.api_base, api_key, self.cfg.model, {}, {}, {}) + path
        headers = config.validate_environment(
            {**self.cfg.extra_headers}, self.cfg.model, [], {}, {}, api_key, self.api_base
        )
        timeout = aiohttp.ClientTimeout(total=max(self.cfg.timeout_s, 60))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            data = json.dumps(payload) if payload is not None else None
            async with session.post(url, data=data, headers=headers) as answer:
                raw = await answer.text()
                if answer.status >= 400:
                    raise RuntimeError(f"HTTP {answer.status}: {raw[:300]}")
        answer_body: dict[str, Any] = json.loads(raw)
        return answer_body
