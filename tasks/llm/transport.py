"""One attempt of a chat completion, as the gateway makes it: through LiteLLM, or posted directly.

LiteLLM reaches any provider, but spends milliseconds of CPU per call (parameter mapping,
the OpenAI SDK's request building and response models, logging and cost hooks) on the
gateway's single event-loop thread; with hundreds of calls in flight that thread, not the
provider, sets the pace. For the calls where LiteLLM would send the request body unchanged
anyway — an unpriced, self-hosted model behind an OpenAI-compatible ``api_base`` (llama.cpp,
vLLM, the scripted server; its provider profile says ``direct_http``) with plain sampling
parameters — the gateway posts that same body itself over one shared aiohttp session
(:class:`DirectClient`). Everything else (hosted providers, priced models, OpenAI's own model
families, which LiteLLM rewrites, any other parameter) goes through LiteLLM.

Both paths fail the same way: a :class:`CallFailed` that says whether another attempt is
worth it. Timeouts, dropped connections, replies that are not JSON and every 5xx are; a 4xx is
when the model's provider profile lists it (by default 408/409/425/429). The HTTP status and
the wait the provider announced (``rate_limits.announced_wait``: ``Retry-After`` as seconds or an
HTTP-date, ``retry-after-ms``, the reset headers) travel with the failure.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, NamedTuple

from refusalbench.tasks.llm.context_errors import provider_message
from refusalbench.tasks.llm.http_post import PostClient
from refusalbench.tasks.llm.litellm_import import cost_map
from refusalbench.tasks.llm.litellm_import import litellm_module as litellm_module
from refusalbench.tasks.llm.providers import ProviderProfile, profile_for, provider_prefix
from refusalbench.tasks.llm.rate_limits import announced_wait
from refusalbench.tasks.llm.reply_outcomes import TOO_LONG

# The parameters LiteLLM passes through unchanged, with plain string messages, to a provider whose
# profile says ``direct_http`` (its plain OpenAI and hosted-vLLM chat configs).
PASS_THROUGH_PARAMS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "stop",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
    }
)
# OpenAI's own model names: LiteLLM rewrites their parameters (o-series, GPT-5) even behind an api_base.
_OPENAI_FAMILIES = re.compile(r"^(o\d|gpt-|chatgpt|ft:|text-|davinci|babbage|codex|computer-use)")
# Statuses aiohttp follows as a redirect: the lean client hands such a call to it.
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# The exception names LiteLLM gives these statuses, so error messages read the same on both paths.
_STATUS_NAMES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "Timeout",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class CallFailed(Exception):
    """A failed attempt: whether another attempt is worth it, how long the provider asked us to
    wait, and the HTTP status when there was one (a 429 is a rate limit, not an error)."""

    def __init__(self, message: str, *, retriable: bool, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.retriable = retriable
        self.retry_after = retry_after
        self.status = status

    @property
    def rate_limited(self) -> bool:
        return self.status == 429


class Reply(NamedTuple):
    """What an attempt brought back, the same on both paths."""

    text: Any
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    finish_reason: str | None
    # The reply's metadata (:func:`litellm_metadata`, :func:`json_metadata`): reasoning from the
    # provider's own field (inline ``<think>`` text stays in ``text``: the gateway splits it per model).
    reasoning: str | None = None
    reasoning_tokens: int | None = None
    served_model: str | None = None
    system_fingerprint: str | None = None
    # What the provider said when it withheld the reply: OpenAI's refusal channel, or the message of
    # a 400 saying the content was filtered (:func:`filtered_reply`). The gateway's outcome reads it.
    refusal: str | None = None
    cached_tokens: int | None = None  # prompt tokens read from the provider's prompt cache
    outcome: str | None = None  # what the provider's error said (:func:`too_long_reply`); None: the reply's own
    # Prompt tokens written to it (Anthropic's cache_creation_input_tokens, billed above the input price).
    cache_write_tokens: int | None = None

    def metadata(self) -> dict[str, Any]:
        """What the call cache keeps of a reply besides its text, tokens and cost: the reasoning from the
        provider's own field (inline reasoning stays in the text), reasoning tokens, who served it."""
        return {
            "reasoning": self.reasoning,
            "reasoning_tokens": self.reasoning_tokens,
            "served_model": self.served_model,
            "system_fingerprint": self.system_fingerprint,
        }


class Request(NamedTuple):
    """What one attempt sends (``Gateway._request``), on the direct path (``body``, posted as is) or
    through LiteLLM (``messages`` and ``kwargs``: the parameters, endpoint, key, headers, response
    format); the batch path writes its request lines from the same."""

    api_base: str | None
    profile: ProviderProfile
    api_key: str | None
    direct: str | None  # the model name the direct path posts; None: through LiteLLM
    body: dict[str, Any] | None
    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]


# ---------------------------------------------------------------- through LiteLLM


async def litellm_completion(
    model: str,
    messages: list[dict[str, str]],
    timeout_s: float,
    kwargs: dict[str, Any],
    profile: ProviderProfile | None = None,
) -> Reply:
    """One attempt through LiteLLM; ``profile`` (default: the model's, at ``kwargs['api_base']``)
    says which failures are worth another."""
    litellm = litellm_module()
    try:
        response = await litellm.acompletion(
            model=model,
            messages=messages,
            timeout=timeout_s,
            max_retries=0,  # the SDK must not retry behind our back: attempts stay bounded
            num_retries=0,
            **kwargs,
        )
    except Exception as exc:  # provider errors of every kind become a CallFailed, except a content filter's
        profile = profile or profile_for(model, kwargs.get("api_base"))
        status = getattr(exc, "status_code", None)
        if profile.context_too_long(status, str(exc)):
            words = _first_line(provider_message(str(exc)))  # the provider's own words, not LiteLLM's wrapping
            return too_long_reply(f"HTTP {status or 400} {type(exc).__name__}: {words}")
        if profile.blocks_content(status, str(exc)):
            return filtered_reply(f"HTTP 400 {type(exc).__name__}: {_first_line(str(exc))}")
        raise classify(exc, profile) from None
    return litellm_reply(response)


def litellm_reply(response: Any) -> Reply:
    """A LiteLLM response as a :class:`Reply` (the batch path reads its results through this too)."""
    litellm = litellm_module()
    try:
        choice = response.choices[0]
        text = choice.message.content
    except (AttributeError, IndexError, TypeError):
        raise CallFailed("malformed reply: no choices", retriable=True) from None
    usage = getattr(response, "usage", None)
    try:
        cost = float(litellm.completion_cost(completion_response=response))
    except Exception:  # unknown price (local models): cost is unknown, not zero
        cost = None
    return Reply(
        text,
        getattr(usage, "prompt_tokens", None),
        getattr(usage, "completion_tokens", None),
        cost,
        getattr(choice, "finish_reason", None),
        **litellm_metadata(response, choice),
        refusal=litellm_refusal(choice),
    )


def litellm_refusal(choice: Any) -> str | None:
    """OpenAI's refusal channel as LiteLLM passes it on (``message.refusal``, or among the
    provider's own fields): the text of a refusal the provider sent instead of content."""
    message = getattr(choice, "message", None)
    extra = getattr(message, "provider_specific_fields", None) or {}
    return _first_text(getattr(message, "refusal", None), extra.get("refusal") if isinstance(extra, dict) else None)


def filtered_reply(message: str) -> Reply:
    """A 400 whose body says the provider's content filter blocked the prompt, as the reply it
    stands for: no content, finish reason ``content_filter``, nothing billed (an error bills nothing)."""
    return Reply(None, None, None, None, "content_filter", refusal=message)


def too_long_reply(message: str) -> Reply:
    """A 400 saying the prompt does not fit the window, as a reply: outcome ``too_long``, the provider's words."""
    return Reply(None, None, None, None, None, refusal=message, outcome=TOO_LONG)


def litellm_metadata(response: Any, choice: Any) -> dict[str, Any]:
    """Reasoning, reasoning tokens, served model and fingerprint of a LiteLLM response.

    LiteLLM gives reasoning as ``reasoning_content`` (from DeepSeek's field, vLLM's ``reasoning``,
    a leading ``<think>`` block it split itself, or Anthropic's thinking blocks), and keeps the
    thinking blocks and the provider's own fields beside it; the first of them that has text wins.
    """
    message = getattr(choice, "message", None)
    extra = getattr(message, "provider_specific_fields", None) or {}
    blocks = getattr(message, "thinking_blocks", None) or []
    thinking = "\n\n".join(b.get("thinking") or "" for b in blocks if isinstance(b, dict)).strip()
    reasoning = _first_text(
        getattr(message, "reasoning_content", None),
        thinking,
        extra.get("reasoning_content") if isinstance(extra, dict) else None,
        extra.get("reasoning") if isinstance(extra, dict) else None,
    )
    usage = getattr(response, "usage", None)
    details = getattr(usage, "completion_tokens_details", None)
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    # LiteLLM reads Anthropic's cache_read_input_tokens into prompt_tokens_details.cached_tokens and
    # its cache_creation_input_tokens into cache_creation_tokens (and onto the usage itself).
    written = _count(getattr(prompt_details, "cache_creation_tokens", None))
    return {
        "reasoning": reasoning,
        "reasoning_tokens": _count(getattr(details, "reasoning_tokens", None)),
        "cached_tokens": _count(getattr(prompt_details, "cached_tokens", None)),
        "cache_write_tokens": written
        if written is not None
        else _count(getattr(usage, "cache_creation_input_tokens", None)),
        "served_model": _first_text(getattr(response, "model", None)),
        "system_fingerprint": _first_text(getattr(response, "system_fingerprint", None)),
    }


def json_metadata(reply: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """The same as :func:`litellm_metadata`, read from a chat-completions reply's raw JSON
    (``reasoning_content`` as DeepSeek and vLLM write it, ``reasoning`` as newer vLLM and OpenRouter do)."""
    message = _json_object(choice.get("message"))
    usage = _json_object(reply.get("usage"))
    details = _json_object(usage.get("completion_tokens_details"))
    prompt_details = _json_object(usage.get("prompt_tokens_details"))
    return {
        "reasoning": _first_text(message.get("reasoning_content"), message.get("reasoning")),
        "reasoning_tokens": _count(details.get("reasoning_tokens")),
        "cached_tokens": _count(prompt_details.get("cached_tokens")),
        "cache_write_tokens": _count(usage.get("cache_creation_input_tokens")),
        "served_model": _first_text(reply.get("model")),
        "system_fingerprint": _first_text(reply.get("system_fingerprint")),
    }


def _json_object(value: Any) -> dict[str, Any]:
    """``value`` where a reply's JSON holds an object there, else an empty one."""
    return value if isinstance(value, dict) else {}


def _first_text(*values: Any) -> str | None:
    """The first value that is a non-blank string (providers send null, "" or other types alike)."""
    return next((value for value in values if isinstance(value, str) and value.strip()), None)


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _retry_after_seconds(exc: BaseException) -> float | None:
    """The wait a LiteLLM exception's response headers announce (LiteLLM keeps them, lower-case,
    in ``litellm_response_headers``; ``response.headers`` is often empty)."""
    headers: dict[str, Any] = {}
    for source in (
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "headers", None),
        getattr(exc, "litellm_response_headers", None),
    ):
        try:
            headers.update({str(name).lower(): value for name, value in (source or {}).items()})
        except (AttributeError, TypeError):
            continue
    return announced_wait(headers)


def classify(exc: BaseException, profile: ProviderProfile) -> CallFailed:
    """Decide whether an exception from LiteLLM is worth another attempt (statuses: as ``profile`` says)."""
    litellm = litellm_module()
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    message = f"{name}: {str(exc).splitlines()[0][:300] if str(exc) else ''}".strip()
    if status is not None:
        message = f"HTTP {status} {message}"
    retry_after = _retry_after_seconds(exc)
    not_retriable = (
        litellm.AuthenticationError,
        litellm.BadRequestError,
        litellm.NotFoundError,
        litellm.PermissionDeniedError,
        litellm.ContextWindowExceededError,
    )
    # An HTTP status is the provider profile's to judge; without one, the exception's kind decides.
    if isinstance(status, int):
        if not profile.retriable_status(status):
            return CallFailed(message, retriable=False, status=status)
    elif isinstance(exc, litellm.RateLimitError):
        status = 429
    elif isinstance(exc, not_retriable):
        return CallFailed(message, retriable=False)
    # 429, 5xx, timeouts, dropped connections and replies that did not decode: try again.
    return CallFailed(
        message, retriable=True, retry_after=retry_after, status=status if isinstance(status, int) else None
    )


# ---------------------------------------------------------------- direct


@functools.lru_cache(maxsize=1)
def _priced_models() -> frozenset[str]:
    """Model names LiteLLM's offline cost map prices (read from its JSON, without importing LiteLLM)."""
    return frozenset(cost_map())


def direct_model_name(model: str, api_base: str | None = None) -> str | None:
    """The model name to post when calls to ``model`` (a LiteLLM model string) may skip LiteLLM.

    Only models whose provider profile speaks OpenAI's format (``direct_http``), unpriced and
    outside OpenAI's own families: for those LiteLLM neither rewrites the request nor finds a
    price, so the direct path sends the same body and records the same unknown cost (None).
    """
    prefix = provider_prefix(model)
    if prefix is None or not profile_for(model, api_base).direct_http:
        return None
    return _unpriced_name(model, prefix)


def unpriced_model(model: str) -> bool:
    """Whether ``model`` is one the direct path may call, so LiteLLM's map has no price for it (the test
    the direct path's unknown cost rests on)."""
    return direct_model_name(model) is not None


@functools.cache
def _unpriced_name(model: str, prefix: str) -> str | None:
    """``model`` without its prefix, unless LiteLLM prices it or rewrites its family's parameters."""
    name = model[len(prefix) + 1 :]
    if not name or _OPENAI_FAMILIES.match(name):
        return None
    priced = _priced_models()
    if name in priced or model in priced or f"openai/{name}" in priced:
        return None
    return name


def direct_model(
    model: str, api_base: str | None, params: dict[str, Any], messages: list[dict[str, Any]]
) -> str | None:
    """The model name to post if this call can take the direct path, else None (LiteLLM then)."""
    if not api_base or not params.keys() <= PASS_THROUGH_PARAMS:
        return None
    if not all(isinstance(m.get("content"), str) and m.keys() <= {"role", "content"} for m in messages):
        return None
    return direct_model_name(model, api_base)


class DirectClient:
    """Posts chat completions: to ``http://`` endpoints over the lean keep-alive client (``http_post``),
    to ``https://`` ones (and wherever a reply redirects) over one aiohttp session, created on
    first use inside the gateway's loop."""

    def __init__(self) -> None:
        self._session: Any = None
        self._lean = PostClient()

    def _client(self) -> Any:
        if self._session is None:
            import aiohttp

            # No connection cap here: the gateway's per-model semaphores bound what is in flight.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
        return self._session

    async def close(self) -> None:
        self._lean.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(
        self, api_base: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float, profile: ProviderProfile
    ) -> Reply:
        """POST ``body`` to ``api_base``/chat/completions; the reply, or a :class:`CallFailed`
        (retried as ``profile`` says)."""
        url = api_base.rstrip("/") + "/chat/completions"
        data = json.dumps(body).encode()
        status, raw, reply_headers = (
            await self._post_lean(url, data, headers, timeout_s) if PostClient.handles(url) else (None, b"", None)
        )
        if status is None or status in _REDIRECTS:  # https, or a redirect: aiohttp follows it
            status, raw, reply_headers = await self._post_aiohttp(url, data, headers, timeout_s)
        retry_after = announced_wait(reply_headers) if status >= 400 else None
        if status >= 400 and profile.context_too_long(status, raw.decode("utf-8", "replace")):
            return too_long_reply(status_failure(status, raw, retry_after, profile).args[0])
        if status == 400 and profile.blocks_content(status, raw.decode("utf-8", "replace")):
            return filtered_reply(status_failure(status, raw, retry_after, profile).args[0])
        if status >= 400:
            raise status_failure(status, raw, retry_after, profile)
        try:
            reply = json.loads(raw)
        except ValueError:
            raise CallFailed(
                f"APIError: the reply is not JSON: {_first_line(raw.decode('utf-8', 'replace'))}", retriable=True
            ) from None
        return json_reply(reply)

    async def _post_lean(
        self, url: str, data: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes, dict[str, str]]:
        try:
            status, reply_headers, raw = await self._lean.post(
                url, data, headers, connect_timeout=timeout_s, read_timeout=timeout_s
            )
        except TimeoutError:
            raise CallFailed(f"Timeout: no reply within {timeout_s:g} s", retriable=True) from None
        except OSError as exc:  # refused, reset, dropped mid-reply: try again
            raise CallFailed(
                f"APIConnectionError: {type(exc).__name__}: {_first_line(str(exc))}", retriable=True
            ) from None
        return status, raw, reply_headers

    async def _post_aiohttp(
        self, url: str, data: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes, Any]:
        import aiohttp

        # Per phase, like the OpenAI SDK's timeout: no single connect or read may take longer.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        try:
            async with self._client().post(url, data=data, headers=headers, timeout=timeout) as answer:
                return answer.status, await answer.read(), answer.headers
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise CallFailed(f"Timeout: no reply within {timeout_s:g} s", retriable=True) from None
        except aiohttp.ClientError as exc:  # refused, reset, dropped mid-reply: try again
            raise CallFailed(
                f"APIConnectionError: {type(exc).__name__}: {_first_line(str(exc))}", retriable=True
            ) from None


def json_reply(reply: Any) -> Reply:
    """A chat completion's JSON as a :class:`Reply`, as the direct path reads it (and the batch path
    a direct-path request's batch result)."""
    try:
        choice = reply["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise CallFailed("malformed reply: no choices", retriable=True) from None
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    # Direct calls go only to models LiteLLM has no price for: cost unknown, as it would say.
    return Reply(
        text,
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        None,
        choice.get("finish_reason"),
        **json_metadata(reply, choice),
        refusal=_first_text((choice.get("message") or {}).get("refusal")),
    )


def status_failure(status: int, raw: bytes, retry_after: float | None, profile: ProviderProfile) -> CallFailed:
    """An HTTP error status as a CallFailed, retried as the LiteLLM path retries it (``retry_after``:
    the seconds the response's headers announced)."""
    detail = raw.decode("utf-8", "replace")
    try:
        error = json.loads(detail).get("error")
        detail = (error.get("message") if isinstance(error, dict) else error) or detail
    except (ValueError, AttributeError):
        pass
    name = _STATUS_NAMES.get(status, "ServiceUnavailableError" if status >= 500 else "APIError")
    message = f"HTTP {status} {name}: {_first_line(str(detail))}"
    if not profile.retriable_status(status):
        return CallFailed(message, retriable=False, status=status)
    return CallFailed(message, retriable=True, retry_after=retry_after, status=status)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else ""
