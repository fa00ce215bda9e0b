"""The scripted model server's Bedrock: batch inference's control plane, and InvokeModel for Claude and Nova models.

Shaped like Bedrock (``ScriptedLLMServer`` registers the routes; ``server.bedrock_batches`` is the
:class:`BedrockBatchDesk` a test scripts):

- ``POST /model-invocation-job`` (CreateModelInvocationJob: ``jobName``, ``roleArn``, ``modelId``,
  ``inputDataConfig.s3InputDataConfig.s3Uri``, ``outputDataConfig.s3OutputDataConfig.s3Uri``,
  ``clientRequestToken``): the input JSONL is read from S3 then (``{"recordId", "modelInput"}`` per
  line; a missing file is a ValidationException); the answer is the job's ARN.
- ``GET /model-invocation-job/{ARN or id}`` (GetModelInvocationJob): ``status`` Submitted → InProgress
  (while ``delay_s`` runs) → Completed, PartiallyCompleted (some records errored) or Expired (some
  were not processed); when it ends, the output is written to S3 as Bedrock writes it:
  ``<output prefix><job id>/<input file name>.out`` (``recordId``, ``modelInput`` and ``modelOutput``
  or ``error`` per record) and ``manifest.json.out`` (the counts).
- ``POST /model-invocation-job/{ARN or id}/stop`` (StopModelInvocationJob): a running job is Stopped,
  its records unanswered.

S3 is whatever endpoint boto3 finds (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``: moto's server in
the tests). Each record's ``modelInput`` is an InvokeModel body, a Claude model's (the Messages API's,
with ``anthropic_version``) or a Nova model's (``nova_wire``), and is answered by :func:`answer_invoke`,
as the synchronous InvokeModel route (``cloud_wires``, ``/model/{id}/invoke``) answers the same body:
the same responder and
:class:`Behaviour`, logged in ``server.calls`` (``wire: bedrock``; a record with ``batch``, the job's
ARN, and ``custom_id``, its recordId). ``server.batches.fail`` scripts errored or expired records too.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from refusalbench.tasks.llm.anthropic_wire import ANTHROPIC
from refusalbench.tasks.llm.nova_wire import NOVA, bedrock_error
from refusalbench.tasks.llm.provider_wire import Behaviour, Outcome, Wire, content_digest, shape_reply
from refusalbench.tasks.llm.scripted_replies import request_fingerprint

ARN_PREFIX = "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/"


def _iso(moment: float | None) -> str | None:
    return datetime.fromtimestamp(moment, UTC).isoformat() if moment is not None else None


def _error(status: int, kind: str, message: str) -> web.Response:
    error = bedrock_error(status, kind, message)
    return web.json_response(error.body, status=status, headers=error.headers)


def invoke_wire(model: str, body: dict[str, Any]) -> Wire | None:
    """The wire of an InvokeModel ``body`` the server answers: Claude's or Nova's (None: neither)."""
    if "anthropic_version" in body:
        return ANTHROPIC
    return NOVA if "nova" in model.lower() else None


def answer_invoke(server: Any, model: str, body: dict[str, Any], job: str | None = None, record: str = "") -> Outcome:
    """A Claude or Nova InvokeModel ``body`` to ``model`` answered as the server's other routes answer
    a request: (result kind, HTTP status, reply or error body); a batch record (``job``: its ARN) may be
    scripted to fail. A body of another model is a ValidationException."""
    wire = invoke_wire(model, body)
    if wire is None:
        return "errored", 400, {"message": f"the scripted server answers Claude and Nova bodies only, not {model}'s"}
    request, tool = wire.read_request(body, server.known_schemas)
    request["model"] = model
    behaviour: Behaviour | None = server.behaviours.get(model)
    failure = server.batches._failure(record) if job is not None else None
    now = time.time()
    entry: dict[str, Any] = {
        "time": now,
        "wire": "bedrock",
        "model": model,
        "fingerprint": request_fingerprint(request),
        "messages": request.get("messages"),
        "response_format": request.get("response_format"),
        "params": {k: v for k, v in request.items() if k not in ("model", "messages", "response_format")},
        "fault": failure,
        "status": 200,
        "headers": {},
        "billed": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0},
        "inflight": 0,
        **({"batch": job, "custom_id": record} if job is not None else {}),
    }
    try:
        if failure == "expired":
            entry["status"] = None
            return "expired", 0, {}
        if failure == "errored":
            entry["status"] = 500
            return "errored", 500, {"message": "injected batch record failure"}
        rejection = wire.request_error(body) or server._behaviour_rejection(request, body, behaviour, wire, now)
        if rejection is not None:
            entry["status"] = rejection.status
            return "errored", rejection.status, rejection.body
        shaping = behaviour or Behaviour()
        try:
            reply = shape_reply(
                request, shaping.content if shaping.content is not None else server.responder(request), shaping
            )
        except Exception as exc:  # a broken script is a failed request, visible to the test
            entry["status"] = 500
            return "errored", 500, {"message": f"responder failed: {exc}"}
        entry["billed"] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "reasoning_tokens": reply.reasoning_tokens,
            "cached_tokens": reply.cached_tokens,
        }
        entry["finish"] = reply.finish
        return "succeeded", 200, wire.reply_body(reply, tool)
    finally:
        entry["finished"] = time.time()
        server._log(entry)


@dataclass
class BedrockJob:
    """One model invocation job as the server keeps it."""

    arn: str
    request: dict[str, Any]  # the CreateModelInvocationJob body
    records: list[dict[str, Any]]  # the input file's lines
    created_at: float
    status: str = "Submitted"
    ended_at: float | None = None
    looks: int = 0  # GetModelInvocationJob requests so far (a client polling)
    stopped: bool = False
    settling: bool = False  # its records are being answered (still InProgress to a look)

    @property
    def job_id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]

    def uri(self, config: str) -> str:
        """The S3 address of ``inputDataConfig`` or ``outputDataConfig``."""
        section = self.request[config]
        return str(section["s3InputDataConfig" if config == "inputDataConfig" else "s3OutputDataConfig"]["s3Uri"])

    def description(self) -> dict[str, Any]:
        """GetModelInvocationJob's answer."""
        return {
            "jobArn": self.arn,
            "jobName": self.request["jobName"],
            "modelId": self.request["modelId"],
            "roleArn": self.request["roleArn"],
            "clientRequestToken": self.request.get("clientRequestToken"),
            "status": self.status,
            "submitTime": _iso(self.created_at),
            "lastModifiedTime": _iso(self.ended_at or self.created_at),
            "endTime": _iso(self.ended_at),
            "inputDataConfig": self.request["inputDataConfig"],
            "outputDataConfig": self.request["outputDataConfig"],
            "timeoutDurationInHours": self.request.get("timeoutDurationInHours", 24),
        }


def _bucket_key(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


@dataclass
class BedrockBatchDesk:
    """The server's Bedrock jobs, and what a test scripts about them: ``delay_s`` (seconds from
    creation to the end) and ``s3_endpoint`` (None: boto3's own from the environment)."""

    server: Any  # the ScriptedLLMServer (not imported: it imports this module)
    delay_s: float = 0.0
    s3_endpoint: str | None = None
    jobs: list[BedrockJob] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def register(self, app: web.Application) -> None:
        app.router.add_post("/model-invocation-job", self._create)
        app.router.add_post("/model-invocation-job/{job:.+}/stop", self._stop)
        app.router.add_get("/model-invocation-job/{job:.+}", self._get)

    def job(self, identifier: str) -> BedrockJob | None:
        name = unquote(identifier)
        return next((job for job in self.jobs if name in (job.arn, job.job_id)), None)

    def _s3(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.s3_endpoint, region_name="us-east-1")

    async def _create(self, http: web.Request) -> web.Response:
        body = await http.json()
        missing = [
            k for k in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig") if not body.get(k)
        ]
        if missing:
            return _error(400, "ValidationException", f"{missing[0]} is required")
        token = body.get("clientRequestToken")
        known = next((j for j in self.jobs if token and j.request.get("clientRequestToken") == token), None)
        if known is not None:  # the same request again: the same job
            return web.json_response({"jobArn": known.arn})
        bucket, key = _bucket_key(str(body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]))
        try:
            data = await asyncio.to_thread(lambda: self._s3().get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:
            return _error(400, "ValidationException", f"the input s3://{bucket}/{key} cannot be read: {exc}")
        records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
        job = BedrockJob(ARN_PREFIX + content_digest(body, time.time())[:12], body, records, time.time())
        with self._lock:
            self.jobs.append(job)
        return web.json_response({"jobArn": job.arn})

    async def _get(self, http: web.Request) -> web.Response:
        job = self.job(http.match_info["job"])
        if job is None:
            return _error(404, "ResourceNotFoundException", "The specified job was not found")
        job.looks += 1
        await asyncio.to_thread(self._settle, job)
        return web.json_response(job.description())

    async def _stop(self, http: web.Request) -> web.Response:
        job = self.job(http.match_info["job"])
        if job is None:
            return _error(404, "ResourceNotFoundException", "The specified job was not found")
        with self._lock:
            if job.ended_at is not None or job.settling:
                return _error(400, "ValidationException", f"job {job.job_id} is {job.status}: it cannot be stopped")
            job.stopped, job.status, job.ended_at = True, "Stopped", time.time()
        return web.json_response({})

    def _settle(self, job: BedrockJob) -> None:
        """End the job once its delay has passed: each record answered, the output written to S3."""
        with self._lock:
            if job.stopped or job.ended_at is not None or job.settling:
                return
            job.status = "InProgress"
            if time.time() < job.created_at + self.delay_s:
                return
            job.settling = True  # claimed: a concurrent look does not answer the records twice
        lines, counts = [], {"succeeded": 0, "errored": 0, "expired": 0}
        for record in job.records:
            kind, status, answer = answer_invoke(
                self.server, job.request["modelId"], record["modelInput"], job.arn, record.get("recordId", "")
            )
            counts[kind] += 1
            if kind == "succeeded":
                lines.append({**record, "modelOutput": answer})
            elif kind == "errored":
                message = answer.get("message") or json.dumps(answer)
                lines.append({**record, "error": {"errorCode": status, "errorMessage": message}})
        bucket, key = _bucket_key(job.uri("outputDataConfig"))
        folder = f"{key.rstrip('/')}/{job.job_id}/".lstrip("/")
        name = _bucket_key(job.uri("inputDataConfig"))[1].rsplit("/", 1)[-1]
        manifest = {
            "totalRecordCount": len(job.records),
            "processedRecordCount": counts["succeeded"] + counts["errored"],
            "successRecordCount": counts["succeeded"],
            "errorRecordCount": counts["errored"],
        }
        s3 = self._s3()
        s3.put_object(Bucket=bucket, Key=f"{folder}{name}.out", Body="".join(json.dumps(x) + "\n" for x in lines))
        s3.put_object(Bucket=bucket, Key=f"{folder}manifest.json.out", Body=json.dumps(manifest))
        ended = "Expired" if counts["expired"] else "PartiallyCompleted" if counts["errored"] else "Completed"
        with self._lock:
            job.status, job.ended_at = ended, time.time()
