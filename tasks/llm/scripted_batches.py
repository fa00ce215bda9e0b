"""The scripted model server's batch APIs: OpenAI files + batches and Anthropic message batches.

Shaped like the real providers (``ScriptedLLMServer`` registers the routes; ``server.batches`` is
the :class:`BatchDesk` a test scripts):

- OpenAI: ``POST /v1/files`` (multipart upload, ``purpose=batch``, one request per JSONL line:
  ``custom_id``, ``method``, ``url``, ``body``), ``POST /v1/batches`` (``input_file_id``,
  ``endpoint``, ``completion_window``), ``GET /v1/batches/{id}`` (``status`` validating →
  in_progress → completed, or expired; ``request_counts``; ``output_file_id`` /
  ``error_file_id``), ``GET /v1/files/{id}/content`` (the output JSONL: ``custom_id`` and
  ``response.status_code`` / ``response.body``; the error file: failed and expired requests);
  the same paths without ``/v1`` too.
- Anthropic: ``POST /v1/messages/batches`` (``requests``: ``custom_id`` and the Messages API
  ``params``), ``GET /v1/messages/batches/{id}`` (``processing_status`` in_progress → ended,
  ``request_counts`` processing/succeeded/errored/canceled/expired, ``results_url``),
  ``GET /v1/messages/batches/{id}/results`` (JSONL; ``result.type`` succeeded / errored /
  expired / canceled).

Each request inside a batch is answered by the same responder and :class:`Behaviour` as the
synchronous route, so a batch's replies equal a synchronous run's; it is logged in
``server.calls`` like a synchronous request, with ``batch`` set to its job's id (so ``calls_for``
and ``billed`` count it). A job completes ``delay_s`` seconds after it was created (the requests
are answered then); :meth:`BatchDesk.fail` scripts requests the batch errors or lets expire.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from refusalbench.tasks.llm.anthropic_wire import ANTHROPIC
from refusalbench.tasks.llm.openai_wire import OPENAI
from refusalbench.tasks.llm.provider_wire import (  # noqa: F401  (BatchJob: importable from here too)
    BatchJob,
    Behaviour,
    Outcome,
    Rejection,
    Wire,
    content_digest,
    shape_reply,
)
from refusalbench.tasks.llm.scripted_replies import request_fingerprint

FailureKind = Literal["errored", "expired"]
_NO_BILL = {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0}


def _reject(rejection: Rejection) -> web.Response:
    return web.json_response(rejection.body, status=rejection.status, headers=rejection.headers)


@dataclass
class BatchDesk:
    """The server's batch jobs and uploaded files, and what a test scripts about them:
    ``delay_s`` (seconds from creation to completion) and :meth:`fail`."""

    server: Any  # the ScriptedLLMServer (not imported: it imports this module)
    delay_s: float = 0.0
    jobs: list[BatchJob] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._files: dict[str, bytes] = {}
        self._failing: dict[str, FailureKind] = {}
        self._failing_fraction: tuple[float, FailureKind] | None = None
        self._lock = threading.Lock()

    def fail(
        self, custom_ids: list[str] | None = None, fraction: float | None = None, kind: FailureKind = "errored"
    ) -> None:
        """Make the batch fail these requests (by ``custom_id``), or a ``fraction`` of all (chosen by
        a hash of the custom_id, so the same ones each time): ``errored`` (a 500 for that request)
        or ``expired`` (not processed within the window: the OpenAI job ends ``expired``)."""
        for custom_id in custom_ids or []:
            self._failing[custom_id] = kind
        if fraction is not None:
            self._failing_fraction = (fraction, kind)

    def clear_failures(self) -> None:
        self._failing.clear()
        self._failing_fraction = None

    def job(self, job_id: str) -> BatchJob | None:
        return next((job for job in self.jobs if job.id == job_id), None)

    # ------------------------------------------------------------ routes

    def register(self, app: web.Application) -> None:
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/files", self._upload)
            app.router.add_get(f"{prefix}/files/{{file_id}}", self._file)
            app.router.add_get(f"{prefix}/files/{{file_id}}/content", self._file_content)
            app.router.add_post(f"{prefix}/batches", self._create_openai)
            app.router.add_get(f"{prefix}/batches/{{batch_id}}", self._retrieve(OPENAI))
            app.router.add_post(f"{prefix}/batches/{{batch_id}}/cancel", self._cancel)
        app.router.add_post("/v1/messages/batches", self._create_anthropic)
        app.router.add_post("/v1/messages/batches/{batch_id}/cancel", self._cancel)
        app.router.add_get("/v1/messages/batches/{batch_id}", self._retrieve(ANTHROPIC))
        app.router.add_get("/v1/messages/batches/{batch_id}/results", self._anthropic_results)

    # ------------------------------------------------------------ OpenAI files + batches

    async def _upload(self, http: web.Request) -> web.Response:
        form = await http.post()
        upload = form.get("file")
        if form.get("purpose") != "batch" or not isinstance(upload, web.FileField):  # absent, or a plain field
            return web.json_response(
                OPENAI.error_body(400, "a file with purpose=batch is required", kind="invalid_request_error"),
                status=400,
            )
        content = upload.file.read()
        file_id = f"file-{content_digest(content, time.time())[:24]}"
        with self._lock:
            self._files[file_id] = content
        return web.json_response(self._file_object(file_id, len(content), upload.filename or "batch.jsonl"))

    @staticmethod
    def _file_object(file_id: str, size: int, filename: str, purpose: str = "batch") -> dict[str, Any]:
        return {
            "id": file_id,
            "object": "file",
            "bytes": size,
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }

    async def _file(self, http: web.Request) -> web.Response:
        file_id = http.match_info["file_id"]
        content = self._files.get(file_id)
        if content is None:
            return web.json_response(OPENAI.error_body(404, f"No such File object: {file_id}"), status=404)
        return web.json_response(self._file_object(file_id, len(content), f"{file_id}.jsonl"))

    async def _file_content(self, http: web.Request) -> web.Response:
        content = self._files.get(http.match_info["file_id"])
        if content is None:
            return web.json_response(OPENAI.error_body(404, "No such File object"), status=404)
        return web.Response(body=content, content_type="application/octet-stream")

    async def _create_openai(self, http: web.Request) -> web.Response:
        body = await http.json()
        content = self._files.get(str(body.get("input_file_id")))
        if content is None:
            return web.json_response(OPENAI.error_body(404, "input_file_id: no such file"), status=404)
        lines = [json.loads(line) for line in content.decode("utf-8").splitlines() if line.strip()]
        job = BatchJob(
            id=f"batch_{content_digest(body, time.time())[:24]}",
            wire=OPENAI,
            requests={line["custom_id"]: line["body"] for line in lines},
            created_at=time.time(),
            input_file_id=body["input_file_id"],
            endpoint=str(body.get("endpoint")),
        )
        with self._lock:
            self.jobs.append(job)
        return web.json_response(OPENAI.batch_object(job, _base_url(http)))

    def _retrieve(self, wire: Wire) -> Callable[[web.Request], Awaitable[web.Response]]:
        """The handler of ``GET .../batches/{id}`` on ``wire``'s batch API (a client polling)."""

        async def retrieve(http: web.Request) -> web.Response:
            job = self.job(http.match_info["batch_id"])
            if job is None or job.wire is not wire:
                return web.json_response(wire.error_body(404, wire.batch_missing), status=404)
            job.looks += 1
            self._settle(job)
            return web.json_response(wire.batch_object(job, _base_url(http)))

        return retrieve

    # ------------------------------------------------------------ Anthropic message batches

    async def _create_anthropic(self, http: web.Request) -> web.Response:
        rejection = ANTHROPIC.header_error(http.headers)
        if rejection is not None:
            return _reject(rejection)
        body = await http.json()
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            return web.json_response(ANTHROPIC.error_body(400, "requests: Field required"), status=400)
        job = BatchJob(
            id=f"msgbatch_{content_digest(body, time.time())[:24]}",
            wire=ANTHROPIC,
            requests={r["custom_id"]: r["params"] for r in requests},
            created_at=time.time(),
            endpoint="/v1/messages",
        )
        with self._lock:
            self.jobs.append(job)
        return web.json_response(ANTHROPIC.batch_object(job, _base_url(http)))

    async def _anthropic_results(self, http: web.Request) -> web.Response:
        job = self.job(http.match_info["batch_id"])
        if job is None or job.wire is not ANTHROPIC:
            return web.json_response(ANTHROPIC.error_body(404, ANTHROPIC.batch_missing), status=404)
        self._settle(job)
        if job.outcomes is None:
            return web.json_response(ANTHROPIC.error_body(400, f"Batch {job.id} is still in_progress"), status=400)
        return web.Response(body=ANTHROPIC.batch_results(job.outcomes), content_type="application/binary")

    async def _cancel(self, http: web.Request) -> web.Response:
        """Cancel a job: the requests not answered yet are not processed (Anthropic: ``canceled``)."""
        job = self.job(http.match_info["batch_id"])
        if job is None:  # worded as OpenAI's on either batch API
            return web.json_response(OPENAI.error_body(404, OPENAI.batch_missing), status=404)
        with self._lock:
            if job.outcomes is None:
                job.outcomes, job.ended_at = {cid: ("canceled", 0, {}) for cid in job.requests}, time.time()
        return web.json_response(job.wire.batch_object(job, _base_url(http)))

    # ------------------------------------------------------------ answering a batch

    def _failure(self, custom_id: str) -> FailureKind | None:
        if custom_id in self._failing:
            return self._failing[custom_id]
        if self._failing_fraction is not None:
            share, kind = self._failing_fraction
            if int(hashlib.sha256(custom_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share:
                return kind
        return None

    def _settle(self, job: BatchJob) -> None:
        """Answer the job's requests once its delay has passed (each logged like a synchronous request)."""
        with self._lock:
            if job.outcomes is not None or time.time() < job.created_at + self.delay_s:
                return
            job.outcomes = {}  # claimed: a concurrent look sees it settling, not twice
        outcomes = {custom_id: self._answer(job, custom_id, body) for custom_id, body in job.requests.items()}
        files = job.wire.batch_files(job, outcomes)
        with self._lock:
            for name, lines in files.items():
                if lines:
                    file_id = f"file-{content_digest(job.id, name)[:24]}"
                    self._files[file_id] = ("\n".join(lines) + "\n").encode()
                    setattr(job, name, file_id)
        job.ended_at = time.time()
        job.outcomes = outcomes

    def _answer(self, job: BatchJob, custom_id: str, body: dict[str, Any]) -> Outcome:
        """One request of ``job`` answered as the synchronous route would answer it: (result kind, HTTP
        status, reply or error body)."""
        server = self.server
        request, tool = job.wire.read_request(body, server.known_schemas)
        behaviour = server.behaviours.get(str(request.get("model")))
        failure = self._failure(custom_id)
        now = time.time()
        entry: dict[str, Any] = {
            "time": now,
            "wire": job.wire.name,
            "model": request.get("model"),
            "fingerprint": request_fingerprint(request),
            "messages": request.get("messages"),
            "response_format": request.get("response_format"),
            "params": {k: v for k, v in request.items() if k not in ("model", "messages", "response_format")},
            "fault": None,
            "status": 200,
            "authorization": None,
            "headers": {},
            "billed": dict(_NO_BILL),
            "inflight": 0,
            "batch": job.id,
            "custom_id": custom_id,
        }
        try:
            if failure == "expired":
                entry.update(status=None, fault="expired")
                return "expired", 0, {}
            if failure == "errored":
                entry.update(status=500, fault="errored")
                return "errored", 500, job.wire.error_body(500, "injected batch item failure", kind="api_error")
            # The body's own faults only: a batch request carries no headers of its own.
            rejection = job.wire.request_error(body) or server._behaviour_rejection(
                request, body, behaviour, job.wire, now
            )
            if rejection is not None:
                entry["status"] = rejection.status
                return "errored", rejection.status, rejection.body
            shaping = behaviour or Behaviour()
            try:
                answer = shaping.content if shaping.content is not None else server.responder(request)
                reply = shape_reply(request, answer, shaping)
            except Exception as exc:  # a broken script is a failed request, visible to the test
                entry["status"] = 500
                return "errored", 500, job.wire.error_body(500, f"responder failed: {exc}")
            entry["billed"] = {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "reasoning_tokens": reply.reasoning_tokens,
                "cached_tokens": reply.cached_tokens,
            }
            entry["finish"] = reply.finish
            return "succeeded", 200, job.wire.reply_body(reply, tool)
        finally:
            entry["finished"] = time.time()
            server._log(entry)


def _base_url(http: web.Request) -> str:
    """The server's own address as the client reached it (for links in a batch object)."""
    return f"{http.scheme}://{http.host}"
