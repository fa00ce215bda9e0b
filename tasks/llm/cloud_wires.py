"""AWS Bedrock's and the Gemini API's routes on the scripted server: their context-length 400, word for word.

LiteLLM reaches Bedrock at ``{api_base}/model/{model id}/converse`` (or ``/invoke``; requests
signed with any AWS keys) and the Gemini API at ``{api_base}/models/{model}:generateContent``
(Vertex AI answers in the same shape), so a test points a ``bedrock/`` or ``gemini/`` model's
``api_base`` at the scripted server. These routes script only what the provider profiles must
read from those providers: a model whose :class:`~provider_wire.Behaviour` says ``too_long`` gets
the provider's own 400 for a prompt over the window; any other request gets a 501 saying the
route scripts nothing else. Every request is logged in ``server.calls`` (``wire``: ``bedrock`` or
``gemini``), like the other routes'. A Claude model's InvokeModel body (the Messages API's, with
``anthropic_version``) and a Nova model's InvokeModel or Converse body (``nova_wire``: the two share
one shape) are answered with the server's responder (``scripted_bedrock_batches.answer_invoke``).
"""

from __future__ import annotations

import time
from typing import Any, Protocol
from urllib.parse import unquote

from aiohttp import web

from refusalbench.tasks.llm.nova_wire import TOO_LONG, bedrock_error
from refusalbench.tasks.llm.provider_wire import Behaviour, Rejection
from refusalbench.tasks.llm.scripted_bedrock_batches import answer_invoke, invoke_wire


class Server(Protocol):
    """What these routes use of ``scripted_server.ScriptedLLMServer``: its behaviours and its call log."""

    behaviours: dict[str, Behaviour]

    def _log(self, entry: dict[str, Any]) -> None: ...


def bedrock_context_length(prompt_tokens: int) -> Rejection:
    """Bedrock's 400 for a prompt over the model's window: a ValidationException, "Input is too long"."""
    return bedrock_error(400, "ValidationException", TOO_LONG)


def gemini_context_length(prompt_tokens: int) -> Rejection:
    """The Gemini API's (and Vertex AI's) 400: INVALID_ARGUMENT, the input token count over the maximum."""
    message = (
        f"The input token count ({prompt_tokens}) exceeds the maximum number of tokens allowed ({prompt_tokens - 1})."
    )
    return Rejection(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})


def _words(value: Any) -> int:
    """Whitespace-separated words in a Converse or Gemini body's text parts (nested lists and dicts)."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return sum(_words(v) for k, v in value.items() if k in ("text", "content", "parts", "contents", "messages"))
    if isinstance(value, list):
        return sum(_words(v) for v in value)
    return 0


def cloud_routes(server: Server, app: web.Application) -> None:
    """Add Bedrock's Converse route and the Gemini API's generateContent routes to ``app``."""

    def route(wire: str, rejection: Any) -> Any:
        async def handle(http: web.Request) -> web.StreamResponse:
            body = await http.json()
            model = unquote(http.match_info["model"]).split(":generateContent")[0]
            behaviour = server.behaviours.get(model)
            prompt_tokens = _words(body.get("messages") or body.get("contents") or []) + _words(body.get("system"))
            entry: dict[str, Any] = {"time": time.time(), "wire": wire, "model": model, "fault": None}
            entry |= {"messages": None, "response_format": None, "params": {}, "headers": {}, "billed": {}}
            if behaviour is not None and behaviour.too_long:
                answer: Rejection = rejection(prompt_tokens)
            elif wire == "bedrock" and invoke_wire(model, body) is not None:  # Claude's or Nova's body: answered
                _, status, reply = answer_invoke(server, model, body)
                return web.json_response(reply, status=status)
            else:
                answer = Rejection(501, {"message": f"the scripted {wire} route answers only a too_long model"})
            entry |= {"status": answer.status, "finished": time.time()}
            server._log(entry)
            return web.json_response(answer.body, status=answer.status, headers=answer.headers)

        return handle

    for action in ("converse", "invoke"):  # LiteLLM calls most Bedrock models through Converse, some through invoke
        app.router.add_post(f"/model/{{model}}/{action}", route("bedrock", bedrock_context_length))
    for prefix in ("", "/v1beta"):
        app.router.add_post(prefix + "/models/{model}", route("gemini", gemini_context_length))
