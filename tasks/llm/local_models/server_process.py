"""The llama.cpp server process (``python -m refusalbench.tasks.llm.local_models --config_file ...``).

A thin ASGI shim in front of llama-cpp-python's server accepts OpenAI's ``response_format:
{type: json_schema}``, which the llama.cpp server only understands in its own
``{type: json_object, schema: ...}`` spelling, so callers can treat a local model like any other
OpenAI-compatible endpoint. The process also registers a plain prompt layout for base models
(``refusalbench-plain``) and exits when the process that started it goes away.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


def to_llama_response_format(response_format: Any) -> Any:
    """OpenAI ``{type: json_schema, json_schema: {schema}}`` -> llama.cpp ``{type: json_object, schema}``."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return response_format
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return {"type": "json_object", "schema": schema} if isinstance(schema, dict) else {"type": "json_object"}


def translate_request_body(body: bytes) -> bytes:
    """Rewrite a chat request's response_format for llama.cpp; anything unparsable passes through unchanged."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if not isinstance(payload, dict) or "response_format" not in payload:
        return body
    translated = to_llama_response_format(payload["response_format"])
    if translated is payload["response_format"]:
        return body
    payload["response_format"] = translated
    return json.dumps(payload).encode("utf-8")


# An ASGI ``receive``: the next message of the request (JSON-like dicts).
Receive = Callable[[], Awaitable[dict[str, Any]]]


class ResponseFormatShim:
    """ASGI middleware applying :func:`translate_request_body` to chat-completion requests."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Any) -> None:
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or not str(scope.get("path", "")).endswith("/chat/completions")
        ):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = translate_request_body(b"".join(chunks))
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        replayed = [{"type": "http.request", "body": body, "more_body": False}]
        await self.app({**scope, "headers": headers}, _replay(replayed, receive), send)


def _replay(messages: list[dict[str, Any]], receive: Receive) -> Receive:
    pending = list(messages)

    async def _receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return await receive()

    return _receive


# A prompt layout for base (not instruction-tuned) models, registered in the server process.
# Measured on gemma-3-270m: llama.cpp's "gemma" turn format drops system messages and made the
# base model echo the prompt, while this plain "...\nAnswer:" layout gave short, on-topic answers.
PLAIN_CHAT_FORMAT = "refusalbench-plain"
PLAIN_STOP = ["\n\n", "\nQuestion:"]


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def plain_prompt(messages: list[dict[str, Any]]) -> str:
    """System and user texts as paragraphs, earlier replies as 'Answer: ...', ending with 'Answer:'."""
    blocks: list[str] = []
    for message in messages:
        text = _message_text(message.get("content")).strip()
        if not text:
            continue
        blocks.append(f"Answer: {text}" if message.get("role") == "assistant" else text)
    return "\n\n".join(blocks) + "\nAnswer:"


def _register_chat_formats() -> None:
    from llama_cpp import llama_chat_format

    def plain(messages: list[dict[str, Any]], **_: Any) -> Any:
        return llama_chat_format.ChatFormatterResponse(prompt=plain_prompt(messages), stop=list(PLAIN_STOP))

    llama_chat_format.register_chat_format(PLAIN_CHAT_FORMAT)(plain)


def _exit_when_orphaned(parent_pid: int) -> None:
    """The server dies with the process that started it, even if that one was killed hard."""

    def _watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                # Not SIGTERM: uvicorn would wait for the reply being decoded (a minute on
                # a busy CPU), and nobody is left to read it.
                os._exit(1)

    threading.Thread(target=_watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Serve the models of ``--config_file`` (llama_cpp.server's config format) until stopped."""
    # uvicorn and llama_cpp come with the optional ``local`` extra: only this process needs them.
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ConfigFileSettings, ServerSettings

    parser = argparse.ArgumentParser(description="llama.cpp OpenAI-compatible server for RefusalBench")
    parser.add_argument("--config_file", required=True)
    parser.add_argument("--parent_pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.parent_pid:
        _exit_when_orphaned(args.parent_pid)
    _register_chat_formats()
    settings = ConfigFileSettings.model_validate_json(Path(args.config_file).read_text(encoding="utf-8"))
    app = create_app(server_settings=ServerSettings.model_validate(settings), model_settings=settings.models)
    uvicorn.run(ResponseFormatShim(app), host=settings.host, port=settings.port, log_level="warning")
