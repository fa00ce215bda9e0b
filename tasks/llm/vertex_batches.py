"""Vertex AI batch prediction: request lines uploaded to Cloud Storage, a batch prediction job made of them,
its predictions files read back from Cloud Storage.

LiteLLM speaks Vertex batches only in OpenAI's batch format, uploading through a Cloud Storage client of
its own whose address cannot be changed, so this module speaks both REST APIs itself (httpx):

- Cloud Storage's JSON API (``batch.vertex.storage_url``): ``POST upload/storage/v1/b/{bucket}/o`` (one
  media upload: the JSONL of requests), ``GET storage/v1/b/{bucket}/o?prefix=`` (the files a job wrote)
  and ``GET storage/v1/b/{bucket}/o/{object}?alt=media`` (one file's content);
- Vertex AI's ``batchPredictionJobs`` (the model's ``api_base``, else the region's
  ``aiplatform.googleapis.com``): create, get (``state``; ``outputInfo.gcsOutputDirectory``), ``:cancel``.

Each line is ``{"custom_id", "request"}``, the request what the synchronous call would send: Gemini's
GenerateContentRequest as LiteLLM's Vertex adapter builds it, or for Claude on Vertex AI (publisher
``anthropic``) the Messages API body with Vertex's ``anthropic_version``. Vertex AI writes each line back
with its ``response`` (or a ``status`` saying why there is none); the custom id is read from the line,
and for Gemini also from two request labels, since the request is echoed whole. A reply is read by
LiteLLM's own transformation of the synchronous reply. Every request carries a bearer token: the
model's ``api_key_env`` variable if it names one, else Google's application default credentials.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

from refusalbench.tasks.core.config import CONFIG_CHECKS, ModelConfig, RunConfig
from refusalbench.tasks.core.config_sections import VertexBatchConfig
from refusalbench.tasks.llm.batch_protocol import BatchProtocol, BatchRequest, JobState, failed_result, litellm_body
from refusalbench.tasks.llm.litellm_import import litellm_module

PREFIX = "vertex_ai/"
DEFAULT_LOCATION = "us-central1"  # LiteLLM's, so jobs run where the model's synchronous calls go
ANTHROPIC_VERSION = "vertex-2023-10-16"  # the Messages API version Vertex AI takes for Claude
# A request key is 64 hex digits and a label value at most 63 characters: the key goes in two halves.
KEY_LABELS = ("refusalbench_key_1", "refusalbench_key_2")
# A job's state in the batch path's words (batch_protocol.FINISHED); the rest are still running.
STATES = {
    "JOB_STATE_SUCCEEDED": "completed",
    "JOB_STATE_PARTIALLY_SUCCEEDED": "completed",
    "JOB_STATE_FAILED": "failed",
    "JOB_STATE_CANCELLED": "cancelled",
    "JOB_STATE_EXPIRED": "expired",
}


class VertexError(RuntimeError):
    """A Vertex AI or Cloud Storage request answered with an error status (read by ``unknown_job``)."""

    def __init__(self, status_code: int, message: str):
        super().__init__(f"HTTP {status_code}: {message[:300]}")
        self.status_code = status_code


def vertex_settings(cfg: ModelConfig) -> tuple[VertexBatchConfig, str, str]:
    """The model's ``batch.vertex``, its project and its region; ValueError naming what is missing."""
    settings = cfg.batch.vertex
    if settings is None:
        raise ValueError(f"{cfg.model} in mode batch needs batch.vertex (gcs_uri and project)")
    project = settings.project or cfg.params.get("vertex_project") or cfg.params.get("vertex_ai_project")
    if not project:
        raise ValueError(f"{cfg.model} in mode batch needs batch.vertex.project (or params.vertex_project)")
    location = settings.location or cfg.params.get("vertex_location") or DEFAULT_LOCATION
    return settings, str(project), str(location)


@CONFIG_CHECKS.register("batch.vertex")
def check_vertex_batches(config: RunConfig) -> list[tuple[str, str]]:
    """A ``vertex_ai/`` model that sends any stage in batch mode needs where its jobs run and keep files."""
    problems = []
    for name, cfg in config.models.items():
        batched = cfg.mode == "batch" or (isinstance(cfg.mode, dict) and "batch" in cfg.mode.values())
        if cfg.model.startswith(PREFIX) and batched:
            try:
                vertex_settings(cfg)
            except ValueError as exc:
                field = "mode" if cfg.batch.vertex is None else "batch.vertex"  # the line that asks, else the section
                problems.append((f"models.{name}.{field}", str(exc)))
    return problems


def gcs_parts(uri: str) -> tuple[str, str]:
    """(bucket, object name or prefix) of a ``gs://`` URI."""
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name.strip("/")


class VertexBatchPrediction(BatchProtocol):
    """Vertex AI's batch prediction jobs for Gemini (publisher ``google``) and Claude (publisher ``anthropic``)."""

    def __init__(self, cfg: ModelConfig, request: BatchRequest) -> None:
        super().__init__(cfg, request)
        self.name = str(litellm_module().get_llm_provider(cfg.model)[0])
        self.publisher = "anthropic" if "claude" in self.name.lower() else "google"
        self.credentials: Any = None  # the application default credentials, once a call needed them

    # ------------------------------------------------------------ the wire

    def root(self, location: str) -> str:
        """Where Vertex AI's REST API is: the model's api_base (a proxy, the scripted server) or the region's host."""
        if self.api_base:
            return self.api_base.rstrip("/")
        host = "aiplatform.googleapis.com" if location == "global" else f"{location}-aiplatform.googleapis.com"
        return f"https://{host}"

    def token(self) -> str:
        """The bearer token: the model's ``api_key_env`` value, else the application default credentials'."""
        if self.api_key:
            return self.api_key
        try:
            import google.auth
            import google.auth.transport.requests
        except ImportError as exc:
            raise RuntimeError(
                "Vertex AI batches need a token: set api_key_env to a variable holding one, or install google-auth"
            ) from exc
        if self.credentials is None:
            self.credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        if not self.credentials.valid:  # never fetched, or expired during a long wait
            self.credentials.refresh(google.auth.transport.requests.Request())
        return str(self.credentials.token)

    async def call(self, method: str, url: str, **kwargs: Any) -> Any:
        """One request with the bearer token; the answer (JSON, or bytes for ``alt=media``), or VertexError."""
        import httpx

        token = self.api_key or await asyncio.to_thread(self.token)  # a refresh is blocking I/O: off the loop
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        async with httpx.AsyncClient(timeout=max(self.cfg.timeout_s, 60)) as client:
            answer = await client.request(method, url, headers=headers, **kwargs)
        if answer.status_code >= 400:
            raise VertexError(answer.status_code, answer.text)
        if kwargs.get("params", {}).get("alt") == "media":
            return answer.content
        return answer.json() if answer.content else {}

    # ------------------------------------------------------------ requests

    def optional_params(self, request: BatchRequest) -> dict[str, Any]:
        """LiteLLM's Gemini parameters of the request (its mapping of the OpenAI-style ones)."""
        from litellm.utils import get_optional_params

        params = {k: v for k, v in request.kwargs.items() if k not in ("api_base", "api_key", "extra_headers")}
        params = {k: v for k, v in params.items() if not k.startswith("vertex_")}  # where to send it, not what
        return dict(get_optional_params(model=self.name, custom_llm_provider="vertex_ai", **params))

    def body(self, custom_id: str, request: BatchRequest) -> dict[str, Any]:
        """The request of one line, as the synchronous call's body."""
        if self.publisher == "anthropic":
            body, _ = litellm_body(self.cfg, request)
            body.pop("model", None)  # named by the job
            body.setdefault("anthropic_version", ANTHROPIC_VERSION)
            return body
        from litellm.llms.vertex_ai.gemini.transformation import _transform_request_body

        body = dict(
            _transform_request_body(
                messages=[dict(m) for m in request.messages],  # type: ignore[misc]
                model=self.name,
                optional_params=self.optional_params(request),
                custom_llm_provider="vertex_ai",
                litellm_params={},
                cached_content=None,
            )
        )
        half = (len(custom_id) + 1) // 2
        body["labels"] = {**body.get("labels", {}), KEY_LABELS[0]: custom_id[:half], KEY_LABELS[1]: custom_id[half:]}
        return body

    async def submit(self, lines: Sequence[tuple[str, BatchRequest]]) -> str:
        settings, project, location = vertex_settings(self.cfg)
        bucket, prefix = gcs_parts(settings.gcs_uri)
        digest = hashlib.sha256(f"{time.time()}:{lines[0][0]}".encode()).hexdigest()[:8]
        run = f"refusalbench-{time.strftime('%Y%m%dT%H%M%S')}-{digest}"  # one folder per job
        folder = f"{prefix}/{run}" if prefix else run
        data = "".join(
            json.dumps({"custom_id": cid, "request": self.body(cid, request)}) + "\n" for cid, request in lines
        ).encode()
        await self.call(
            "POST",
            f"{settings.storage_url.rstrip('/')}/upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": f"{folder}/requests.jsonl"},
            content=data,
            headers={"Content-Type": "application/jsonl"},
        )
        job = await self.call(
            "POST",
            f"{self.root(location)}/v1/projects/{project}/locations/{location}/batchPredictionJobs",
            json={
                "displayName": run,
                "model": f"publishers/{self.publisher}/models/{self.name}",
                "inputConfig": {
                    "instancesFormat": "jsonl",
                    "gcsSource": {"uris": [f"gs://{bucket}/{folder}/requests.jsonl"]},
                },
                "outputConfig": {
                    "predictionsFormat": "jsonl",
                    "gcsDestination": {"outputUriPrefix": f"gs://{bucket}/{folder}/output"},
                },
            },
        )
        return str(job["name"])  # projects/{p}/locations/{l}/batchPredictionJobs/{id}: all a look needs

    # ------------------------------------------------------------ the job

    def job_url(self, job_id: str) -> str:
        location = job_id.split("/locations/")[1].split("/")[0] if "/locations/" in job_id else DEFAULT_LOCATION
        return f"{self.root(location)}/v1/{job_id}"

    async def look(self, job_id: str) -> JobState:
        job = await self.call("GET", self.job_url(job_id))
        directory = (job.get("outputInfo") or {}).get("gcsOutputDirectory")
        return JobState(STATES.get(str(job.get("state")), "in_progress"), (directory,) if directory else ())

    async def cancel(self, job_id: str) -> None:
        await self.call("POST", self.job_url(job_id) + ":cancel", json={})

    async def results(self, job: JobState) -> dict[str, dict[str, Any]]:
        settings = vertex_settings(self.cfg)[0]
        storage = settings.storage_url.rstrip("/")
        replies: dict[str, dict[str, Any]] = {}
        for directory in job.result_files:
            bucket, folder = gcs_parts(directory)
            names, page = [], None
            while True:  # the listing comes in pages
                listing = await self.call(
                    "GET",
                    f"{storage}/storage/v1/b/{bucket}/o",
                    params={"prefix": folder + "/", **({"pageToken": page} if page else {})},
                )
                names += [item["name"] for item in listing.get("items", []) if item["name"].endswith(".jsonl")]
                if not (page := listing.get("nextPageToken")):
                    break
            for name in names:  # predictions.jsonl, or several predictions*.jsonl for a large job
                content = await self.call(
                    "GET", f"{storage}/storage/v1/b/{bucket}/o/{quote(name, safe='')}", params={"alt": "media"}
                )
                for line in content.decode("utf-8").splitlines():
                    if line.strip():
                        self.read_line(json.loads(line), replies)
        return replies

    @staticmethod
    def read_line(row: dict[str, Any], replies: dict[str, dict[str, Any]]) -> None:
        """Add one predictions line to ``replies`` if it holds a response (an error's line has only ``status``)."""
        labels = (row.get("request") or {}).get("labels") or {}
        custom_id = row.get("custom_id") or "".join(str(labels.get(name, "")) for name in KEY_LABELS)
        response = row.get("response")
        if not custom_id:
            return
        if isinstance(response, dict) and response and not row.get("status"):
            replies[str(custom_id)] = response
        elif row.get("status"):  # the error, in Vertex AI's words: a prompt over the window is too_long
            replies[str(custom_id)] = failed_result(None, row["status"])

    def response(self, request: BatchRequest, body: dict[str, Any]) -> Any:
        import httpx

        litellm = litellm_module()
        if self.publisher == "anthropic":
            from litellm.llms.anthropic.chat.transformation import AnthropicConfig

            return AnthropicConfig().transform_parsed_response(
                completion_response=body,
                raw_response=httpx.Response(200, json=body),
                model_response=litellm.ModelResponse(),
                json_mode=litellm_body(self.cfg, request)[1],
            )
        from litellm.llms.vertex_ai.gemini.vertex_and_google_ai_studio_gemini import VertexGeminiConfig

        return VertexGeminiConfig()._transform_google_generate_content_to_openai_model_response(
            completion_response=body,
            model_response=litellm.ModelResponse(),
            model=self.name,
            logging_obj=SimpleNamespace(optional_params=self.optional_params(request)),  # type: ignore[arg-type]
            raw_response=httpx.Response(200, json=body),
        )
