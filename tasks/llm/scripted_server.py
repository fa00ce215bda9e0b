"""A scripted OpenAI-compatible model server: dry runs of a config without spending money.

Start it, point the models of a config at it (``api_base: http://127.0.0.1:8099/v1``) and run
the config: every stage runs for real, over HTTP, and no provider is called::

    python -m refusalbench.tasks.llm.scripted_server --port 8099

Its default replies (``dry_run_responder``) fit each role: a request that names a JSON schema
(generators, verifiers, judges, the KnowOrNot helper stages) gets a small valid object for that
schema; a KnowOrNot evaluator prompt that asks for ``<tag>label</tag>`` gets one of the listed
labels; anything else (targets) gets a short answer. Replies depend only on the request, so a
second run is served from the call cache like any other.

The test suite uses the same server (``ScriptedLLMServer``) as its model double: replies come
from any Python callable, faults (5xx, 429 with Retry-After, hung requests, 200 with a body that
is not JSON, empty content) are injected by rate or queued one by one, and every request is
logged (optionally to a JSONL file, so a test can count calls across a killed process).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

Responder = Callable[[dict[str, Any]], str]


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


def last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def request_fingerprint(request: dict[str, Any]) -> str:
    blob = json.dumps({"model": request.get("model"), "messages": request.get("messages")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def schema_name(request: dict[str, Any]) -> str | None:
    """The name of the JSON schema a request asks for (e.g. ``VerifierOutput``), if any."""
    fmt = request.get("response_format") or {}
    return (fmt.get("json_schema") or {}).get("name")


def fenced(text: str, tag: str) -> list[str]:
    """Contents of <tag ...>...</tag> blocks in a rendered prompt."""
    return [m.strip() for m in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", text, flags=re.DOTALL)]


def echo_responder(request: dict[str, Any]) -> str:
    return "echo: " + last_user_text(request)[:200]


def example_for_schema(schema: dict[str, Any], label: str = "scripted") -> Any:
    """The smallest value that satisfies a (references-inlined) JSON schema.

    Booleans are true and enums take their first value, so verifiers say PASS; numbers take their
    minimum; strings carry ``label`` so replies to different requests differ.
    """
    if "enum" in schema:
        return schema["enum"][0]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return example_for_schema(next((o for o in options if o.get("type") != "null"), options[0]), label)
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: example_for_schema(sub, f"{label} {name}") for name, sub in properties.items()}
    if kind == "array":
        count = max(1, schema.get("minItems", 1))
        return [example_for_schema(schema.get("items", {}), f"{label} {i + 1}") for i in range(count)]
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "null":
        return None
    return label


# The last lines of a KnowOrNot evaluator prompt list the allowed verdicts as <tag>label</tag>.
_LABEL_LINE = re.compile(r"^<([A-Za-z_][\w-]*)>([^<>\n]+)</\1>\s*$", re.MULTILINE)


def dry_run_responder(request: dict[str, Any]) -> str:
    """A plausible reply for any role, decided by the request alone (see the module docstring)."""
    fingerprint = request_fingerprint(request)
    schema = ((request.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if isinstance(schema, dict):
        return json.dumps(example_for_schema(schema, f"scripted {fingerprint[:6]}"))
    labels = _LABEL_LINE.findall(last_user_text(request))
    if labels:
        tag = labels[-1][0]
        choices = [label for name, label in labels if name == tag]
        # Spread the verdicts over the labels, so a dry run reaches every branch that depends on them.
        return f"Scripted verdict. <{tag}>{choices[int(fingerprint, 16) % len(choices)]}</{tag}>"
    return f"Scripted answer {fingerprint[:6]}."


@dataclass
class ScriptedLLMServer:
    """The server, on a background thread; ``responder`` decides every reply (tests swap it freely)."""

    responder: Responder = echo_responder
    latency_s: float = 0.0
    faults: FaultRates = field(default_factory=FaultRates)
    seed: int = 0
    hang_s: float = 60.0
    log_path: str | Path | None = None
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._queued: deque[Fault] = deque()
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.inflight = 0
        self.max_inflight = 0

    # ------------------------------------------------------------ control

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def fail_next(self, count: int = 1, *, status: int = 500, retry_after: float | None = None, kind: str = "status") -> None:
        for _ in range(count):
            self._queued.append(Fault(kind=kind, status=status, retry_after=retry_after))

    def calls_for(self, model: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["model"] == model]

    def start(self) -> "ScriptedLLMServer":
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/chat/completions", self._handle)
            app.router.add_post("/chat/completions", self._handle)
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
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

    def __enter__(self) -> "ScriptedLLMServer":
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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        fault = self._draw_fault()
        entry = {
            "time": time.time(),
            "model": body.get("model"),
            "fingerprint": request_fingerprint(body),
            "messages": body.get("messages"),
            "response_format": body.get("response_format"),
            "fault": fault.kind if fault else None,
            "status": fault.status if fault and fault.kind == "status" else 200,
            # What the client authenticated with: lets a test prove a key from the environment was used.
            "authorization": request.headers.get("Authorization"),
        }
        self._log(entry)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if fault is not None:
                if fault.kind == "status":
                    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                    return web.json_response(
                        {"error": {"message": f"injected {fault.status}", "type": "injected"}}, status=fault.status, headers=headers
                    )
                if fault.kind == "hang":
                    await asyncio.sleep(self.hang_s)
                    return web.json_response({"error": {"message": "hung"}}, status=504)
                if fault.kind == "not_json":
                    return web.Response(text="<html>upstream garbage</html>", content_type="application/json")
                if fault.kind == "empty":
                    return web.json_response(self._completion(body, ""))
            try:
                text = self.responder(body)
            except Exception as exc:  # a broken script is a server error, visible to the test
                return web.json_response({"error": {"message": f"responder failed: {exc}"}}, status=500)
            return web.json_response(self._completion(body, text))
        finally:
            self.inflight -= 1

    @staticmethod
    def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(text.split()),
                "total_tokens": prompt_tokens + len(text.split()),
            },
        }


def main(argv: list[str] | None = None) -> None:
    """Serve scripted replies on loopback until interrupted (``--responder echo`` for echoes)."""
    parser = argparse.ArgumentParser(description="A scripted OpenAI-compatible model server for dry runs of a config.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--responder", choices=sorted(RESPONDERS), default="dry-run")
    parser.add_argument("--log", default=None, help="append every request to this JSONL file")
    args = parser.parse_args(argv)
    server = ScriptedLLMServer(responder=RESPONDERS[args.responder], latency_s=args.latency,
                               host=args.host, port=args.port, log_path=args.log).start()
    print(f"scripted model server at {server.url} (set api_base: {server.url}); Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


RESPONDERS: dict[str, Responder] = {"dry-run": dry_run_responder, "echo": echo_responder}


if __name__ == "__main__":  # pragma: no cover
    main()
