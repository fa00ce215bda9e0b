"""A fake OpenAI-compatible chat server for tests and benchmarks.

Real sockets, real HTTP: the gateway talks to it exactly as to a provider. Replies are
scripted by a Python callable; faults (5xx, 429 with Retry-After, hung requests, 200 with
a body that is not JSON, empty content) are injected by rate or queued one by one. Every
request is logged (optionally to a JSONL file, so a test can count calls across a killed
process).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
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


def echo_responder(request: dict[str, Any]) -> str:
    return "echo: " + last_user_text(request)[:200]


@dataclass
class ScriptedLLMServer:
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

        self._thread = threading.Thread(target=run, name="fake-llm", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake LLM server did not start")
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


def main() -> None:  # pragma: no cover - manual use: python -m refusalbench.tasks.scripted_server --port 8099
    import argparse

    parser = argparse.ArgumentParser(description="Serve a fake OpenAI-compatible chat API on loopback.")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = ScriptedLLMServer(latency_s=args.latency, port=args.port).start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
