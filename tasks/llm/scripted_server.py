"""A scripted model server: dry runs of a config without spending money, and the test suite's provider.

It speaks the OpenAI chat-completions API (``POST /v1/chat/completions``), the Anthropic
Messages API (``POST /v1/messages``) and the OpenAI embeddings API (``POST /v1/embeddings``:
deterministic vectors hashed from each text's words, ``scripted_embedding``). Start it, point the models of a config at it and run the
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

Each provider's wire format is one class (``provider_wire.Wire``; ``openai_wire.OPENAI``,
``anthropic_wire.ANTHROPIC``; ``ROUTES`` maps each route to its wire; Bedrock's and the Gemini API's
context-length 400 on routes of their own: ``cloud_wires``); :class:`Behaviour` lives in
``provider_wire``, the responders in ``scripted_replies``; all are importable from here too. The
batch APIs (OpenAI files + batches, Anthropic message batches; ``server.batches``) are in
``scripted_batches``; Bedrock's model invocation jobs (``server.bedrock_batches``) in ``scripted_bedrock_batches``;
Vertex AI batch prediction and its Cloud Storage (``server.vertex``) in ``scripted_vertex_batches``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from refusalbench.tasks.llm.anthropic_wire import ANTHROPIC, JSON_TOOL_NAME, AnthropicWire, from_anthropic  # noqa: F401

# Every public name of the two modules below is importable from here, as the tests and docs use it.
from refusalbench.tasks.llm.cloud_wires import cloud_routes
from refusalbench.tasks.llm.openai_wire import OPENAI, OpenAIWire  # noqa: F401
from refusalbench.tasks.llm.provider_wire import (  # noqa: F401
    AZURE_PROMPT_FILTERED,
    CANNED_REFUSAL,
    JSON_SCHEMA_UNSUPPORTED,
    Behaviour,
    Finish,
    RateLimit,
    RateLimitForm,
    ReasoningPlace,
    Rejection,
    ShapedReply,
    Wire,
    WireFormat,
    embeddings_body,
    go_duration,
    scripted_embedding,
    scripted_prompt_tokens,
    shape_reply,
)
from refusalbench.tasks.llm.scripted_batches import BatchDesk
from refusalbench.tasks.llm.scripted_bedrock_batches import BedrockBatchDesk
from refusalbench.tasks.llm.scripted_prompt_cache import ScriptedPromptCache
from refusalbench.tasks.llm.scripted_replies import (  # noqa: F401
    Responder,
    dry_run_responder,
    echo_responder,
    example_for_schema,
    fenced,
    last_user_text,
    request_fingerprint,
    requested_schema,
    scripted_classification,
    scripted_judge_reply,
)
from refusalbench.tasks.llm.scripted_vertex_batches import VertexDesk


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


# ---------------------------------------------------------------- the server

# The synchronous routes and the wire each one speaks, and each wire by its name (``calls[i]["wire"]``).
ROUTES: dict[str, Wire] = {"/v1/chat/completions": OPENAI, "/chat/completions": OPENAI, "/v1/messages": ANTHROPIC}
WIRES: dict[str, Wire] = {wire.name: wire for wire in (OPENAI, ANTHROPIC)}

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
    reply billed; zero for errors), ``inflight`` (requests in flight at the server as it arrived,
    itself included; ``max_inflight`` is the peak), ``finished`` (when the reply or error went out)
    and, for a reply, its ``finish``; a Messages API request with ``cache_control`` marks has
    ``cache_control`` (where they were: ``system[0]``, ``messages[i][block]``) and, when it wrote its prefix to
    the scripted prompt cache, ``cache_written`` (tokens)."""

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
    # Cached prompt prefixes reported as the providers do (``scripted_prompt_cache``): marked ones on the
    # Messages API, repeated ones on chat completions, from 1,024 tokens (``prompt_cache.min_tokens``).
    prompt_cache: ScriptedPromptCache = field(default_factory=ScriptedPromptCache)

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
        self.batches = BatchDesk(self)  # the batch APIs' jobs, delay and scripted failures (scripted_batches)
        self.vertex = VertexDesk(self)  # Vertex AI's batch prediction jobs and Cloud Storage objects
        self.bedrock_batches = BedrockBatchDesk(self)  # Bedrock's model invocation jobs (scripted_bedrock_batches)

    # ------------------------------------------------------------ control

    @property
    def url(self) -> str:
        """The ``api_base`` of OpenAI-style models."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        """The ``api_base`` of ``anthropic/`` models (LiteLLM appends ``/v1/messages``)."""
        return f"http://{self.host}:{self.port}"

    def fail_next(
        self, count: int = 1, *, status: int = 500, retry_after: float | None = None, kind: str = "status"
    ) -> None:
        for _ in range(count):
            self._queued.append(Fault(kind=kind, status=status, retry_after=retry_after))

    def calls_for(self, model: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["model"] == model]

    def peak_inflight(self, model: str | None = None) -> int:
        """The most requests (to ``model``, or to all) in flight at once, from each request's arrival
        to its reply (``time`` to ``finished``): what a provider's concurrency limit counts."""
        edges = sorted(
            edge
            for c in self.calls
            if model is None or c["model"] == model
            for edge in ((c["time"], 1), (c.get("finished", float("inf")), -1))
        )
        peak = level = 0
        for _, step in edges:  # at one instant a reply (-1) sorts before an arrival (+1)
            level += step
            peak = max(peak, level)
        return peak

    def busiest_window(self, seconds: float, model: str | None = None) -> int:
        """The most requests (to ``model``, or to all) that arrived within any ``seconds`` long
        window: what a provider's requests-per-minute limit counts, with ``seconds=60``."""
        times = sorted(c["time"] for c in self.calls if model is None or c["model"] == model)
        most, first = 0, 0
        for last, arrived in enumerate(times):
            while arrived - times[first] >= seconds:
                first += 1
            most = max(most, last - first + 1)
        return most

    def billed(self, model: str | None = None) -> dict[str, int]:
        """Tokens billed so far (to ``model``, or to all): prompt, completion, reasoning, cached."""
        total = {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0}
        for call in self.calls:
            if model is None or call["model"] == model:
                for key, value in (call.get("billed") or {}).items():
                    total[key] += value
        return total

    def start(self) -> ScriptedLLMServer:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            for path, wire in ROUTES.items():
                app.router.add_post(path, self._route(wire))
            app.router.add_post("/v1/embeddings", self._handle_embeddings)
            app.router.add_post("/embeddings", self._handle_embeddings)
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            self.batches.register(app)
            self.vertex.register(app)
            self.bedrock_batches.register(app)
            cloud_routes(self, app)  # Bedrock's and the Gemini API's routes: their context-length 400
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

    def __enter__(self) -> ScriptedLLMServer:
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

    def _behaviour_rejection(
        self, request: dict[str, Any], body: dict[str, Any], behaviour: Behaviour | None, wire: Wire, now: float
    ) -> Rejection | None:
        """The error ``behaviour`` answers this request with, if any (a 429 counts as served)."""
        if behaviour is None:
            return None
        model = str(request.get("model"))
        limit = behaviour.rate_limit
        if limit is not None:
            with self._lock:
                served = self._rate_limited.get(model, 0)
                limited = (limit.requests is None or served < limit.requests) and (
                    limit.until is None or now < limit.until
                )
                if limited:
                    self._rate_limited[model] = served + 1
            if limited:
                return wire.rate_limit_rejection(limit, model, now)
        if behaviour.prompt_filtered:
            return wire.prompt_filtered_rejection()
        if behaviour.too_long:
            return wire.context_length_rejection(scripted_prompt_tokens(request))
        if behaviour.rejects_json_schema:
            return wire.structured_output_rejection(request, body)
        return None

    def _route(self, wire: Wire) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The handler of a synchronous route that speaks ``wire``."""

        async def handle(http: web.Request) -> web.StreamResponse:
            return await self._serve(http, wire)

        return handle

    async def _handle_embeddings(self, http: web.Request) -> web.StreamResponse:
        """``POST /v1/embeddings``: a ``scripted_embedding`` per input text (queued and drawn faults
        apply; the call is logged with ``wire: embeddings`` and its ``input`` texts)."""
        body = await http.json()
        texts = [body.get("input")] if isinstance(body.get("input"), str) else body.get("input")
        fault = self._draw_fault()
        entry = {
            "time": time.time(),
            "wire": "embeddings",
            "model": body.get("model"),
            "input": texts,
            "messages": None,
            "response_format": None,
            "params": {k: v for k, v in body.items() if k not in ("model", "input")},
            "fault": fault.kind if fault else None,
            "status": fault.status if fault else 200,
            "authorization": http.headers.get("Authorization"),
            "headers": {},
            "billed": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0},
        }
        try:
            self._log(entry)
            if fault is not None and fault.kind == "status":
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                return web.json_response(
                    OPENAI.error_body(fault.status, f"injected {fault.status}", kind="injected"),
                    status=fault.status,
                    headers=headers,
                )
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                entry["status"] = 400
                return web.json_response(
                    OPENAI.error_body(
                        400,
                        "input must be a string or a list of strings",
                        kind="invalid_request_error",
                        param="input",
                    ),
                    status=400,
                )
            dimensions = body.get("dimensions") if isinstance(body.get("dimensions"), int) else None
            vectors = [scripted_embedding(t, *([dimensions] if dimensions else [])) for t in texts]
            entry["billed"]["prompt_tokens"] = tokens = sum(len(t.split()) for t in texts)
            return web.json_response(
                embeddings_body(str(body.get("model")), vectors, body.get("encoding_format"), tokens)
            )
        finally:
            entry["finished"] = time.time()

    async def _serve(self, http: web.Request, wire: Wire) -> web.StreamResponse:
        received = time.time()
        body = await http.json()
        rejection = wire.protocol_error(http.headers, body)
        request, tool = wire.read_request(body, self.known_schemas)
        behaviour = self.behaviours.get(str(request.get("model")))
        fault = self._draw_fault() if rejection is None else None
        if rejection is None and fault is None:
            rejection = self._behaviour_rejection(request, body, behaviour, wire, received)
        status = rejection.status if rejection else fault.status if fault and fault.kind == "status" else 200
        entry = {
            "time": received,
            "wire": wire.name,
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
        # In flight at this server (all models): the peak is what a provider's concurrency limit sees.
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        entry["inflight"] = self.inflight
        try:
            self._log(entry)
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if rejection is not None:
                return web.json_response(rejection.body, status=rejection.status, headers=rejection.headers)
            if fault is not None and fault.kind != "empty":
                if fault.kind == "status":
                    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                    return web.json_response(
                        wire.error_body(fault.status, f"injected {fault.status}", kind=wire.injected_error_kind),
                        status=fault.status,
                        headers=headers,
                    )
                if fault.kind == "hang":
                    await asyncio.sleep(self.hang_s)
                    return web.json_response(wire.error_body(504, "hung"), status=504)
                return web.Response(text="<html>upstream garbage</html>", content_type="application/json")
            shaping = behaviour or Behaviour()
            if fault is not None:  # an injected empty reply
                shaping = Behaviour(
                    content="", served_model=shaping.served_model, system_fingerprint=shaping.system_fingerprint
                )
            try:
                answer = shaping.content if shaping.content is not None else self.responder(request)
                reply = shape_reply(request, answer, shaping)
                wire.apply_prompt_cache(self.prompt_cache, body, request, reply, entry)
            except Exception as exc:  # a broken script is a server error, visible to the test
                entry["status"] = 500
                return web.json_response(wire.error_body(500, f"responder failed: {exc}"), status=500)
            entry["billed"] = {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "reasoning_tokens": reply.reasoning_tokens,
                "cached_tokens": reply.cached_tokens,
            }
            entry["finish"] = reply.finish
            return web.json_response(wire.reply_body(reply, tool))
        finally:
            self.inflight -= 1
            entry["finished"] = time.time()


def main(argv: list[str] | None = None) -> None:
    """Serve scripted replies on loopback until interrupted (``--responder echo`` for echoes)."""
    parser = argparse.ArgumentParser(
        description="A scripted model server (OpenAI chat completions and Anthropic "
        "Messages API) for dry runs of a config."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--responder", choices=sorted(RESPONDERS), default="dry-run")
    parser.add_argument("--log", default=None, help="append every request to this JSONL file")
    args = parser.parse_args(argv)
    server = ScriptedLLMServer(
        responder=RESPONDERS[args.responder], latency_s=args.latency, host=args.host, port=args.port, log_path=args.log
    ).start()
    print(
        f"scripted model server at {server.url} (set api_base: {server.url}; for anthropic/ models "
        f"api_base: {server.anthropic_url}); Ctrl-C stops it",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


RESPONDERS: dict[str, Responder] = {"dry-run": dry_run_responder, "echo": echo_responder}


if __name__ == "__main__":  # pragma: no cover
    main()
