"""The scripted model server's Vertex AI batch prediction and the bit of Cloud Storage's JSON API it needs.

Shaped like Google's (``ScriptedLLMServer`` registers the routes; ``server.vertex`` is the
:class:`VertexDesk`; a vertex_ai model's ``api_base`` and ``batch.vertex.storage_url`` both point at the
server's root, ``server.anthropic_url``):

- Cloud Storage: ``POST /upload/storage/v1/b/{bucket}/o?uploadType=media&name=...`` (an object's bytes),
  ``GET /storage/v1/b/{bucket}/o?prefix=`` (``items``: the objects under a prefix) and
  ``GET /storage/v1/b/{bucket}/o/{object}?alt=media`` (an object's bytes);
- Vertex AI: ``POST /v1/projects/{p}/locations/{l}/batchPredictionJobs`` (``model``
  ``publishers/{google|anthropic}/models/{m}``, ``inputConfig.gcsSource.uris``: JSONL of
  ``{"custom_id", "request"}``; ``outputConfig.gcsDestination.outputUriPrefix``), ``GET .../{id}``
  (``state`` JOB_STATE_RUNNING → SUCCEEDED, PARTIALLY_SUCCEEDED, EXPIRED, FAILED or CANCELLED;
  ``outputInfo.gcsOutputDirectory``), ``POST .../{id}:cancel``. Every request needs a bearer token.

A finished job leaves ``predictions.jsonl`` in a folder of its own under the output prefix: each line
its ``custom_id`` and ``request`` as sent, with the ``response`` or, for a request that failed, a
``status`` saying why. Each request is answered by the server's responder and :class:`Behaviour` as
the synchronous route would answer it, logged in ``server.calls`` with ``batch`` set to the job's
name; Gemini's requests and replies are the :class:`GeminiWire`'s, Claude's the Messages API's. The
timing and the scripted failures are the other batch APIs' (``server.batches.delay_s``,
``server.batches.fail``), so a test scripts every batch API alike.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from refusalbench.tasks.llm.anthropic_wire import ANTHROPIC, _json_schema_format
from refusalbench.tasks.llm.cloud_wires import gemini_context_length
from refusalbench.tasks.llm.provider_wire import (
    INLINE_REASONING,
    BatchJob,
    RateLimit,
    Rejection,
    ShapedReply,
    Wire,
    inline_text,
)

# google.rpc.Code's name for each status an error is answered with.
GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED"}
FINISH_REASONS = {"stop": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY", "refusal": "SAFETY"}


def _text(content: Any) -> str:
    """The text of a Content (or a list of them): its parts' text joined."""
    if isinstance(content, list):
        return "\n".join(_text(c) for c in content)
    if isinstance(content, dict):
        return "".join(str(part.get("text", "")) for part in content.get("parts", []) if isinstance(part, dict))
    return str(content or "")


class GeminiWire(Wire):
    """Gemini's generateContent on Vertex AI: the request and reply of one line of a batch prediction job."""

    name = "gemini"
    batch_missing = "The BatchPredictionJob does not exist."

    def read_request(
        self, body: dict[str, Any], known_schemas: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], str | None]:
        messages = []
        if system := body.get("system_instruction") or body.get("systemInstruction"):
            messages.append({"role": "system", "content": _text(system)})
        for content in body.get("contents") or []:
            messages.append(
                {"role": "assistant" if content.get("role") == "model" else "user", "content": _text(content)}
            )
        config = body.get("generationConfig") or body.get("generation_config") or {}

        def setting(snake: str, camel: str) -> Any:
            return config.get(snake, config.get(camel))

        request: dict[str, Any] = {"model": body.get("model"), "messages": messages}
        schema = setting("response_json_schema", "responseJsonSchema") or setting("response_schema", "responseSchema")
        if isinstance(schema, dict):
            request["response_format"] = _json_schema_format(schema, known_schemas, "output")
        elif setting("response_mime_type", "responseMimeType") == "application/json":
            request["response_format"] = {"type": "json_object"}
        for ours, snake, camel in (("max_tokens", "max_output_tokens", "maxOutputTokens"), ("temperature",) * 3):
            if (value := setting(snake, camel)) is not None:
                request[ours] = value
        return request, None

    def error_body(self, status: int, message: str, *, kind: str | None = None, **fields: Any) -> dict[str, Any]:
        code = kind or GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
        return {"error": {"code": status, "message": message, "status": code}}

    def reply_body(self, reply: ShapedReply, tool: str | None) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        thoughts = 0
        if reply.reasoning and reply.reasoning_in not in INLINE_REASONING:
            parts.append({"text": reply.reasoning, "thought": True})
            thoughts = reply.reasoning_tokens
        text = inline_text(reply)
        parts.append({"text": text})
        usage = {
            "promptTokenCount": reply.prompt_tokens,
            "candidatesTokenCount": reply.completion_tokens - thoughts,
            "totalTokenCount": reply.prompt_tokens + reply.completion_tokens,
        }
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        if reply.cached_tokens:
            usage["cachedContentTokenCount"] = reply.cached_tokens
        return {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": FINISH_REASONS[reply.finish]}
            ],
            "usageMetadata": usage,
            "modelVersion": reply.served_model,
            "responseId": hashlib.sha256(text.encode()).hexdigest()[:20],
        }

    def structured_output_rejection(self, request: dict[str, Any], body: dict[str, Any]) -> Rejection | None:
        if "response_format" not in request:
            return None
        return Rejection(400, self.error_body(400, "response_schema is not supported for this model"))

    def prompt_filtered_rejection(self) -> Rejection:
        return Rejection(400, self.error_body(400, "The prompt was blocked by the content filter (PROHIBITED_CONTENT)"))

    def context_length_rejection(self, prompt_tokens: int) -> Rejection:
        return gemini_context_length(prompt_tokens)

    def _rate_limited(
        self, limit: RateLimit, kind: str, wait: float, reset_at: float, model: str, headers: dict[str, str]
    ) -> Rejection:
        message = f"Resource exhausted: quota of {kind} per minute for {model}. Please try again later."
        return Rejection(429, self.error_body(429, message), headers)

    def cached_prefix(self, cache: Any, body: Any, request: Any, reply: Any, entry: Any) -> tuple[int, int]:
        return 0, 0  # Gemini's implicit caching is not scripted

    def batch_object(self, job: BatchJob, base_url: str) -> dict[str, Any]:
        assert isinstance(job, VertexJob)
        return job.resource()


GEMINI = GeminiWire()


@dataclass
class VertexJob(BatchJob):
    """A batch prediction job: its resource name (``id``), model, input lines and where it writes."""

    model: str = ""
    display_name: str = ""
    input_uri: str = ""
    output_prefix: str = ""
    lines: dict[str, dict[str, Any]] = field(default_factory=dict)  # custom id → the line as uploaded
    cancelled: bool = False

    def state(self) -> str:
        if self.cancelled:
            return "JOB_STATE_CANCELLED"
        if self.outcomes is None:
            return "JOB_STATE_RUNNING"
        kinds = {kind for kind, _, _ in self.outcomes.values()}
        if "expired" in kinds:
            return "JOB_STATE_EXPIRED"
        if "succeeded" not in kinds:
            return "JOB_STATE_FAILED"
        return "JOB_STATE_PARTIALLY_SUCCEEDED" if kinds - {"succeeded"} else "JOB_STATE_SUCCEEDED"

    def resource(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.id,
            "displayName": self.display_name,
            "model": self.model,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [self.input_uri]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": self.output_prefix}},
            "state": self.state(),
            "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at)),
        }
        if self.output_file_id:
            body["outputInfo"] = {"gcsOutputDirectory": self.output_file_id}
        return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response(GEMINI.error_body(status, message), status=status)


@dataclass
class VertexDesk:
    """The server's Cloud Storage objects (``objects``: (bucket, name) → bytes) and batch prediction jobs."""

    server: Any  # the ScriptedLLMServer (not imported: it imports this module)
    jobs: list[VertexJob] = field(default_factory=list)
    objects: dict[tuple[str, str], bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def register(self, app: web.Application) -> None:
        app.router.add_post("/upload/storage/v1/b/{bucket}/o", self._upload)
        app.router.add_get("/storage/v1/b/{bucket}/o", self._list)
        app.router.add_get("/storage/v1/b/{bucket}/o/{name:.+}", self._download)
        jobs = "/v1/projects/{project}/locations/{location}/batchPredictionJobs"
        app.router.add_post(jobs, self._create)
        app.router.add_get(jobs + "/{job}", self._get)
        app.router.add_post(jobs + "/{job}", self._cancel)  # {job} is "<id>:cancel"

    def job(self, name: str) -> VertexJob | None:
        return next((job for job in self.jobs if job.id == name), None)

    # ------------------------------------------------------------ Cloud Storage

    async def _upload(self, http: web.Request) -> web.Response:
        if not http.headers.get("Authorization", "").startswith("Bearer "):
            return _error(401, "Anonymous caller does not have storage.objects.create access.")
        name = http.query.get("name")
        if http.query.get("uploadType") != "media" or not name:
            return _error(400, "uploadType=media and a name are required")
        content = await http.read()
        with self._lock:
            self.objects[(http.match_info["bucket"], name)] = content
        return web.json_response({"bucket": http.match_info["bucket"], "name": name, "size": str(len(content))})

    async def _list(self, http: web.Request) -> web.Response:
        bucket, prefix = http.match_info["bucket"], http.query.get("prefix", "")
        items = [
            {"bucket": b, "name": n, "size": str(len(c))}
            for (b, n), c in sorted(self.objects.items())
            if b == bucket and n.startswith(prefix)
        ]
        return web.json_response({"kind": "storage#objects", **({"items": items} if items else {})})

    async def _download(self, http: web.Request) -> web.Response:
        content = self.objects.get((http.match_info["bucket"], http.match_info["name"]))
        if content is None:
            return _error(404, f"No such object: {http.match_info['bucket']}/{http.match_info['name']}")
        if http.query.get("alt") != "media":
            return web.json_response({"name": http.match_info["name"], "size": str(len(content))})
        return web.Response(body=content, content_type="application/octet-stream")

    # ------------------------------------------------------------ batch prediction jobs

    async def _create(self, http: web.Request) -> web.Response:
        if not http.headers.get("Authorization", "").startswith("Bearer "):
            return _error(401, "Request is missing required authentication credential.")
        body = await http.json()
        model = str(body.get("model", ""))
        publisher = model.split("/")[1] if model.startswith("publishers/") and model.count("/") == 3 else ""
        if publisher not in ("google", "anthropic"):
            return _error(400, f"model must be publishers/{{google|anthropic}}/models/{{model}}, not {model!r}")
        uris = ((body.get("inputConfig") or {}).get("gcsSource") or {}).get("uris") or []
        output = ((body.get("outputConfig") or {}).get("gcsDestination") or {}).get("outputUriPrefix")
        content = self.objects.get(tuple(uris[0].removeprefix("gs://").split("/", 1))) if uris else None
        if content is None or not output:
            return _error(400, "inputConfig.gcsSource.uris must name an uploaded object; outputUriPrefix is required")
        lines = [json.loads(line) for line in content.decode("utf-8").splitlines() if line.strip()]
        name = model.rsplit("/", 1)[1]
        number = int(hashlib.sha256(f"{time.time()}{uris}".encode()).hexdigest()[:15], 16)
        project, location = http.match_info["project"], http.match_info["location"]
        job = VertexJob(
            id=f"projects/{project}/locations/{location}/batchPredictionJobs/{number}",
            wire=ANTHROPIC if publisher == "anthropic" else GEMINI,
            # The model is named by the job, not the line: the responders read it from the request.
            requests={str(line.get("custom_id")): {**line["request"], "model": name} for line in lines},
            created_at=time.time(),
            model=model,
            display_name=str(body.get("displayName", "")),
            input_uri=uris[0],
            output_prefix=str(output).rstrip("/"),
            lines={str(line.get("custom_id")): line for line in lines},
        )
        with self._lock:
            self.jobs.append(job)
        return web.json_response(job.resource())

    async def _get(self, http: web.Request) -> web.Response:
        job = self.job(self._name(http))
        if job is None:
            return _error(404, GEMINI.batch_missing)
        job.looks += 1
        self._settle(job)
        return web.json_response(job.resource())

    async def _cancel(self, http: web.Request) -> web.Response:
        name = self._name(http)
        if not name.endswith(":cancel"):
            return _error(404, "only :cancel is posted to a job")
        job = self.job(name.removesuffix(":cancel"))
        if job is None:
            return _error(404, GEMINI.batch_missing)
        with self._lock:
            if job.outcomes is None:  # what has not been answered is not processed
                job.cancelled, job.ended_at = True, time.time()
                job.outcomes = {cid: ("canceled", 0, {}) for cid in job.requests}
        return web.json_response({})

    @staticmethod
    def _name(http: web.Request) -> str:
        info = http.match_info
        return f"projects/{info['project']}/locations/{info['location']}/batchPredictionJobs/{info['job']}"

    def _settle(self, job: VertexJob) -> None:
        """Answer the job's requests once the batches' delay has passed; write its predictions file."""
        desk = self.server.batches
        with self._lock:
            if job.outcomes is not None or time.time() < job.created_at + desk.delay_s:
                return
            job.outcomes = {}  # claimed: a concurrent look sees it settling, not twice
        outcomes = {cid: desk._answer(job, cid, body) for cid, body in job.requests.items()}
        rows = []
        for cid, (kind, _, answer) in outcomes.items():
            row = {**job.lines[cid], "processed_time": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
            if kind == "succeeded":
                rows.append(json.dumps({**row, "response": answer, "status": ""}))
            elif kind == "errored":  # Vertex AI words a failed line's error in its status
                rows.append(json.dumps({**row, "status": json.dumps((answer or {}).get("error", answer))}))
        bucket, _, prefix = job.output_prefix.removeprefix("gs://").partition("/")
        folder = f"{prefix}/prediction-model-{time.strftime('%Y-%m-%dT%H:%M:%S')}-{job.id.rsplit('/', 1)[1]}".lstrip(
            "/"
        )
        with self._lock:
            self.objects[(bucket, f"{folder}/predictions.jsonl")] = ("\n".join(rows) + "\n").encode()
            job.output_file_id = f"gs://{bucket}/{folder}"
        job.ended_at = time.time()
        job.outcomes = outcomes
