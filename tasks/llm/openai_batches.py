"""OpenAI's batch API: a JSONL file of requests uploaded, a job created on it, its output and error files read.

Spoken through LiteLLM's files + batches functions (``acreate_file``, ``acreate_batch``,
``aretrieve_batch``, ``acancel_batch``, ``afile_content``), for OpenAI and the servers that speak
its format (vLLM, LiteLLM's proxy, the scripted server).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from refusalbench.tasks.llm.batch_protocol import BatchRequest, LiteLLMBatches, failed_result, litellm_body
from refusalbench.tasks.llm.litellm_import import litellm_module

ENDPOINT = "/v1/chat/completions"


class OpenAIBatches(LiteLLMBatches):
    """OpenAI's files + batches API: one line ``{custom_id, method, url, body}`` per request."""

    def line(self, custom_id: str, request: BatchRequest) -> dict[str, Any]:
        """The JSONL line of a request: the direct path's body as posted, or the body LiteLLM would send."""
        if request.body is not None:
            body = request.body
        else:
            body = litellm_body(self.cfg, request)[0]
            body.update(body.pop("extra_body", None) or {})  # the OpenAI SDK merges extra_body into the body
            body.pop("stream", None)
        return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body}

    async def submit(self, lines: Sequence[tuple[str, BatchRequest]]) -> str:
        litellm = litellm_module()
        data = "".join(json.dumps(self.line(custom_id, request)) + "\n" for custom_id, request in lines).encode()
        upload = await litellm.acreate_file(
            file=("batch.jsonl", data, "application/jsonl"), purpose="batch", **self.auth()
        )
        job = await litellm.acreate_batch(
            completion_window="24h", endpoint=ENDPOINT, input_file_id=upload.id, **self.auth()
        )
        return str(job.id)

    async def cancel(self, job_id: str) -> None:
        await litellm_module().acancel_batch(batch_id=job_id, **self.auth())

    def read_line(self, row: dict[str, Any], replies: dict[str, dict[str, Any]]) -> None:
        response = row.get("response") or {}
        if response.get("status_code") == 200 and isinstance(response.get("body"), dict):
            replies[row["custom_id"]] = response["body"]
        elif isinstance(response.get("status_code"), int) and response.get("body") is not None:
            replies[row["custom_id"]] = failed_result(response["status_code"], response["body"])

    def response(self, request: BatchRequest, body: dict[str, Any]) -> Any:
        from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import (
            convert_to_model_response_object,
        )

        return convert_to_model_response_object(
            response_object=body, model_response_object=litellm_module().ModelResponse()
        )
