"""Provider profiles: everything that differs between LiteLLM providers, one profile per provider.

A model's profile is found from the prefix of its model string (``anthropic/claude-...`` ->
``anthropic``; no profile: ``default``), and for ``openai/`` from its ``api_base`` too: an endpoint of
its own is an OpenAI-compatible server (llama.cpp, vLLM, the scripted server), not OpenAI. The
gateway, ``models list``, the inspect integration and ``plan`` ask the profile, never a provider's name:

- structured output: how the provider takes a response schema (:data:`StructuredMode`; the 400s saying
  it does not make the gateway fall back for the run), made a request by :func:`response_format_for`;
- credentials: the variables (and files) LiteLLM reads them from, and whether an endpoint without a key is keyless;
- the request: parameter rewrites, and whether the gateway may post the request itself
  (:mod:`transport`'s direct path: the provider speaks OpenAI's chat-completions format unchanged);
- failures: which HTTP statuses are worth another attempt, and how a 400 says the prompt does not fit
  the context window (``context_length_error``, one class per wording: :mod:`context_errors`);
- reasoning: where its reasoning models put their reasoning (:data:`ReasoningMode`), so the
  gateway splits it off the answer before anything parses it (a model's ``reasoning`` overrides);
- prompt caching: whether the shared prefix of a prompt is marked cacheable (:data:`PromptCaching`,
  ``prompt_cache``) or left to the provider's automatic caching, and the shortest prefix it caches;
- batches: the class speaking the provider's batch API (:class:`~batch_protocol.BatchProtocol`,
  ``batch_protocol``), or None where the gateway speaks none (``mode: batch`` is then sent synchronously);
- embeddings: whether the embedding client may post a request itself (``direct_embeddings``).

A new provider is one subclass that sets what differs, plus one decorator::

    @register_provider("acme")
    class Acme(ProviderProfile):
        \"\"\"Acme's hosted models: JSON mode only, key in ACME_API_KEY.\"\"\"
        structured_output = "json_object"
        key_env = ("ACME_API_KEY",)

A profile outside this module lives in a plugin (``tasks/core/plugins.py``: an entry point or a module the
config lists under ``plugins:``), loaded before the config is validated and in every process that calls models.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from refusalbench.tasks.core.config import ModelConfig, ReasoningMode
from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.llm.anthropic_batches import AnthropicMessageBatches
from refusalbench.tasks.llm.batch_protocol import BatchProtocol
from refusalbench.tasks.llm.bedrock_batches import BedrockBatchInference
from refusalbench.tasks.llm.context_errors import (
    AnthropicPromptTooLong,
    BedrockInputTooLong,
    ContextLengthError,
    GoogleTokenLimit,
    OpenAICompatibleContextLength,
    OpenAIContextLength,
    VertexContextLength,
)
from refusalbench.tasks.llm.openai_batches import OpenAIBatches
from refusalbench.tasks.llm.vertex_batches import VertexBatchPrediction

StructuredMode = Literal["json_schema", "json_object", "tool", "none"]
# How a provider caches prompt prefixes (``prompt_cache``): explicit: what the request marks ``cache_control``
# (Anthropic, Bedrock); automatic: long repeated prefixes by itself (OpenAI, Azure, DeepSeek); none: not at all.
PromptCaching = Literal["explicit", "automatic", "none"]
# Claude models whose smallest cacheable prefix is not 1,024 tokens: (a part of the model name, tokens).
CLAUDE_CACHE_MINIMUMS: tuple[tuple[str, int], ...] = (("haiku-4-5", 4096), ("opus-4-5", 4096), ("opus-4-6", 4096))
CLAUDE_CACHE_MINIMUMS += (("sonnet-4-6", 2048), ("3-5-haiku", 2048), ("3-haiku", 2048))
# The modes from the most to the least the request says about its output (a fallback only moves down).
MODES_BY_STRENGTH: tuple[StructuredMode, ...] = ("json_schema", "tool", "json_object", "none")
# The modes in which the whole JSON schema travels with the request.
SCHEMA_MODES: frozenset[str] = frozenset({"json_schema", "tool"})
# 4xx statuses worth another attempt (every 5xx is): timeout, conflict, too early, rate limit.
RETRIED_4XX: frozenset[int] = frozenset({408, 409, 425, 429})
# OpenAI-compatible servers without auth still need a non-empty key in the SDK.
PLACEHOLDER_KEY = "no-key"
DEFAULT_PROFILE = "default"


class ProviderProfile:
    """What calling one provider takes. Subclass it, set what differs and register it under the
    provider's LiteLLM prefix; the class attributes below are the defaults, which fit a provider
    LiteLLM knows and that honours a JSON-schema ``response_format``."""

    # ------------------------------------------------------------ structured output
    # How a response schema reaches the provider:
    #   json_schema  response_format {type: json_schema} with the schema (OpenAI, Gemini, vLLM, llama.cpp);
    #   tool         the provider takes a schema only as a forced tool call: LiteLLM's adapter turns the
    #                json_schema response_format into one and the tool's arguments back into the reply
    #                (Anthropic, Bedrock); a model thinking at the same time cannot, see ``json_schema: false``;
    #   json_object  response_format {type: json_object}: valid JSON, the schema only in the prompt;
    #   none         no response_format at all: the prompt alone asks for JSON.
    # A model's ``json_schema: false`` lowers json_schema and tool to json_object (:func:`structured_mode`).
    structured_output: StructuredMode = "json_schema"
    # A provider (or one of its models) that does not take a mode answers it with a 400 naming it
    # (the words below, lower case; OpenAI-compatible servers name ``response_format``, the
    # Messages API ``output_format``, tool-less models ``tool_choice``). The gateway then falls
    # back to the next mode once, for the rest of the run, and sends the call again in it.
    structured_fallbacks: dict[str, StructuredMode] = {
        "json_schema": "json_object",
        "tool": "json_object",
        "json_object": "none",
    }
    structured_rejection_markers: dict[str, tuple[str, ...]] = {
        "json_schema": ("response_format", "json_schema", "output_format", "output_config", "structured output"),
        "tool": (
            "response_format",
            "json_schema",
            "output_format",
            "output_config",
            "structured output",
            "tool_choice",
            "tool use",
            "tool_use",
            "tools",
            "function call",
        ),
        "json_object": ("response_format", "json_object", "json mode", "json_mode"),
    }

    def rejects_structured_output(self, status: int | None, message: str, mode: StructuredMode) -> bool:
        """Whether an error answered with ``status`` and ``message`` says the provider does not take
        structured output in ``mode`` (then :meth:`fallback_mode` is tried instead)."""
        if status not in (400, 422) or self.fallback_mode(mode) is None:
            return False
        text = message.lower()
        return any(marker in text for marker in self.structured_rejection_markers.get(mode, ()))

    def fallback_mode(self, mode: StructuredMode) -> StructuredMode | None:
        """The mode to use once ``mode`` has been rejected; None when there is nothing simpler."""
        return self.structured_fallbacks.get(mode)

    # ------------------------------------------------------------ credentials
    # Variables holding the provider's API key, in the order LiteLLM reads them; the gateway sends
    # the first one set (so the direct path and LiteLLM authenticate alike).
    key_env: tuple[str, ...] = ()
    # Other variables that supply credentials instead of a key (a default chain: AWS profile, Google ADC).
    credential_env: tuple[str, ...] = ()
    # Files that supply them too (``~`` expanded).
    credential_files: tuple[str, ...] = ()
    # A model with its own ``api_base`` and no ``api_key_env`` is a server without auth: it needs no
    # credentials and gets a placeholder key. False where an endpoint of one's own still signs
    # requests with the provider's credentials (Azure, Bedrock, Vertex AI).
    keyless_endpoints: bool = True

    # ------------------------------------------------------------ the request
    # The provider speaks OpenAI's chat-completions format unchanged, so the gateway may post the
    # body itself behind an api_base (transport.direct_model decides per call).
    direct_http: bool = False
    # Where an endpoint lists its models, below the model's ``api_base`` (the availability probe):
    # OpenAI's format puts /v1 in the api_base, Anthropic's api_base is the host root.
    models_path: str = "/models"
    # The profile to use instead when the model has an ``api_base`` of its own (``openai/`` + an
    # endpoint is an OpenAI-compatible server, not OpenAI).
    own_endpoint_profile: str | None = None

    def rewrite_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The sampling parameters as this provider wants them (renamed, dropped, added); a new dict.
        The cache key is made from the parameters before this rewrite."""
        return dict(params)

    def max_output_tokens(self, params: dict[str, Any]) -> int | None:
        """The output token limit ``params`` set (OpenAI's two spellings), before any rewrite."""
        value = params.get("max_tokens", params.get("max_completion_tokens"))
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    # ------------------------------------------------------------ reasoning
    # Where the provider's reasoning models put their reasoning (tasks/llm/reasoning.py):
    #   field       in a field of its own (reasoning_content, reasoning, thinking blocks): the text is the answer;
    #   think_tags  possibly also inline, "<think>…</think>" (or only "…</think>") before the answer: split off;
    #   none        the text is taken as it is.
    # Hosted APIs answer in a field; servers of open models (vLLM without a reasoning parser,
    # llama.cpp, Ollama) often write DeepSeek-R1's and Qwen3's tags into the text, and splitting
    # them is harmless where none come.
    reasoning: ReasoningMode = "field"

    # ------------------------------------------------------------ prompt caching
    # How the provider discounts a prompt prefix it has seen (:data:`PromptCaching`); marking never changes the key.
    prompt_caching: PromptCaching = "none"
    # The shortest prefix it caches, in tokens; the (model-name part, tokens) pairs first (``prompt_cache``).
    prompt_cache_min_tokens: int = 1024
    prompt_cache_min_by_model: tuple[tuple[str, int], ...] = ()

    def marks_prompt_cache(self, model: str) -> bool:
        """Whether calls to ``model`` (a LiteLLM model string) carry ``cache_control`` on their shared prefix."""
        return self.prompt_caching == "explicit"

    # ------------------------------------------------------------ batches and embeddings
    # The class speaking the provider's batch API (``mode: batch``; ``batch_calls`` makes one per model
    # and batch run), or None: the gateway speaks none of its batch APIs, so those models are sent
    # synchronously. Its ``price_share`` is the batch discount ``plan`` assumes where neither the config
    # nor LiteLLM's map prices batch tokens.
    batch_protocol: type[BatchProtocol] | None = None
    # The embedding endpoint behind an ``api_base`` takes the very body LiteLLM would send (OpenAI's
    # format), so the embedding client may post it itself (``embedding_calls``) instead of through LiteLLM.
    direct_embeddings: bool = False

    # ------------------------------------------------------------ failures
    # 4xx statuses worth another attempt; every 5xx, timeout, dropped connection and non-JSON reply is anyway.
    retriable_statuses: frozenset[int] = RETRIED_4XX

    def retriable_status(self, status: int) -> bool:
        """Whether an attempt answered with HTTP ``status`` is worth another."""
        return not 400 <= status < 500 or status in self.retriable_statuses

    # Words of a 429 saying the quota or credit is spent (OpenAI: insufficient_quota): no wait cures it. Lower case.
    quota_markers: tuple[str, ...] = ("insufficient_quota", "exceeded your current quota", "credit balance is too low")

    def quota_exhausted(self, message: str) -> bool:
        """Whether a 429's ``message`` says the quota is spent rather than the rate exceeded."""
        text = message.lower()
        return any(marker in text for marker in self.quota_markers)

    # Words of a 400's body saying the provider's content filter blocked the prompt or the reply
    # (Azure: code "content_filter", "content management policy"; Anthropic: "Output blocked by
    # content filtering policy"; OpenAI-compatible gateways: "content policy"). Lower case.
    content_filter_markers: tuple[str, ...] = (
        "content_filter",
        "content filter",
        "content management policy",
        "content filtering policy",
        "content policy",
        "responsibleaipolicyviolation",
    )

    # How the provider's error says the prompt is longer than the model's window: OpenAI's wording by
    # default (OpenAI-compatible servers imitate it); a provider with its own sets its class.
    context_length_error: type[ContextLengthError] = OpenAIContextLength

    def context_too_long(self, status: int | None, message: str) -> bool:
        """Whether an error answered with ``status`` and ``message`` says the prompt does not fit the
        model's context window: then the row is ``too_long``, not a failed call."""
        return self.context_length_error.matches(status, message)

    def blocks_content(self, status: int | None, message: str) -> bool:
        """Whether an error answered with ``status`` and ``message`` says the content was filtered:
        then the row is ``provider_blocked``, not a failed call."""
        if status not in (None, 400):
            return False
        text = message.lower()
        return any(marker in text for marker in self.content_filter_markers)

    # ------------------------------------------------------------ derived answers

    def keyless(self, api_base: str | None) -> bool:
        """Whether a model reached at ``api_base`` without a key of its own is a server without auth."""
        return bool(api_base) and self.keyless_endpoints

    def api_key(self, cfg: ModelConfig, api_base: str | None) -> str | None:
        """The key to send, or None to leave the provider's own variables to LiteLLM. Never logged."""
        if cfg.api_key_env:
            return os.environ.get(cfg.api_key_env)
        if self.keyless(api_base):
            return PLACEHOLDER_KEY
        return next((os.environ[name] for name in self.key_env if os.environ.get(name)), None)

    def credentials(self, cfg: ModelConfig, api_base: str | None) -> tuple[str, str | None]:
        """('present' | 'missing' | 'not needed' | 'default chain', why when missing), as ``models list``
        shows it. Only presence is checked: no value is read into the answer."""
        if cfg.api_key_env:
            if os.environ.get(cfg.api_key_env):
                return "present", None
            return "missing", f"environment variable {cfg.api_key_env} is not set"
        if self.keyless(api_base):
            return "not needed", None
        names = self.key_env + self.credential_env
        if not names and not self.credential_files:
            return "not needed", None
        if any(os.environ.get(name) for name in self.key_env):
            return "present", None
        if any(os.environ.get(name) for name in self.credential_env) or any(
            Path(file).expanduser().exists() for file in self.credential_files
        ):
            return "default chain", None
        wanted = names[0] if len(names) == 1 else f"one of {', '.join(names)}"
        return "missing", f"no {provider_prefix(cfg.model) or 'provider'} credentials found (set {wanted})"


PROVIDERS: Registry[type[ProviderProfile]] = Registry("provider profile")
Profile = TypeVar("Profile", bound=type[ProviderProfile])


def register_provider(prefix: str, *, replace: bool = False) -> Callable[[Profile], Profile]:
    """Decorator: make the decorated :class:`ProviderProfile` subclass the profile of models
    whose LiteLLM model string starts with ``<prefix>/``."""
    return PROVIDERS.register(prefix, replace=replace)


def provider_prefix(model: str) -> str | None:
    """The LiteLLM provider prefix of a model string (``bedrock/amazon.nova-pro-v1:0`` -> ``bedrock``);
    None for a bare name, whose provider LiteLLM infers."""
    return model.split("/", 1)[0] if "/" in model else None


def profile_for(model: str, api_base: str | None = None) -> ProviderProfile:
    """The profile of a LiteLLM model string reached at ``api_base`` (None: the provider's own endpoint)."""
    prefix = provider_prefix(model)
    profile = PROVIDERS.get(prefix or DEFAULT_PROFILE) or PROVIDERS[DEFAULT_PROFILE]
    if api_base and profile.own_endpoint_profile:
        profile = PROVIDERS[profile.own_endpoint_profile]
    return profile()


def structured_mode(cfg: ModelConfig, profile: ProviderProfile) -> StructuredMode:
    """How this model asks for a schema: the profile's mode, lowered to json_object by ``json_schema: false``."""
    mode = profile.structured_output
    if not cfg.json_schema and mode in SCHEMA_MODES:
        return "json_object"
    return mode


def reasoning_mode(cfg: ModelConfig, profile: ProviderProfile) -> ReasoningMode:
    """Where this model's reasoning comes: the model's own ``reasoning`` setting, else its profile's."""
    return cfg.reasoning or profile.reasoning


def response_format_for(
    mode: StructuredMode, name: str, schema: dict[str, Any], *, strict: bool = False
) -> dict[str, Any] | None:
    """The ``response_format`` that asks for ``schema`` in ``mode``; None when nothing is sent.

    Non-strict by default: llama.cpp's server honours the schema, and OpenAI's strict mode
    rejects the optional fields some outputs have.
    """
    if mode in SCHEMA_MODES:
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}
    if mode == "json_object":
        return {"type": "json_object"}
    return None


# ---------------------------------------------------------------- the built-in profiles


@register_provider(DEFAULT_PROFILE)
class DefaultProvider(ProviderProfile):
    """Any provider without a profile of its own: a JSON-schema response_format, LiteLLM finds the
    credentials (nothing to check beforehand)."""


@register_provider("openai")
class OpenAI(ProviderProfile):
    """OpenAI's API. LiteLLM rewrites the parameters of OpenAI's own model families; the direct
    path skips those (transport.direct_model_name)."""

    key_env = ("OPENAI_API_KEY",)
    direct_http = True
    own_endpoint_profile = "openai_compatible"
    prompt_caching = "automatic"  # prefixes of 1,024 tokens and more, in 128-token steps
    batch_protocol = OpenAIBatches


@register_provider("openai_compatible")
class OpenAICompatible(ProviderProfile):
    """``openai/<name>`` behind an ``api_base`` of its own: llama.cpp, vLLM, any server speaking
    OpenAI's format, usually without auth."""

    direct_http = True
    reasoning = "think_tags"
    batch_protocol = OpenAIBatches  # the server's own /v1/batches, where it has one
    context_length_error = OpenAICompatibleContextLength
    direct_embeddings = True


@register_provider("hosted_vllm")
class HostedVLLM(OpenAICompatible):
    """vLLM's OpenAI-compatible server (an ``api_base`` is required)."""

    direct_embeddings = False  # LiteLLM's hosted_vllm embedding path is its own: left to it


@register_provider("litellm_proxy")
class LiteLLMProxy(ProviderProfile):
    """LiteLLM's proxy server: OpenAI's batch API in front of the models it routes to."""

    batch_protocol = OpenAIBatches


@register_provider("azure")
class Azure(ProviderProfile):
    """Azure OpenAI: the deployment's endpoint is its api_base, and it still needs Azure credentials."""

    key_env = ("AZURE_OPENAI_API_KEY", "AZURE_API_KEY")
    credential_env = ("AZURE_AD_TOKEN", "AZURE_CLIENT_SECRET")
    keyless_endpoints = False
    prompt_caching = "automatic"


@register_provider("anthropic")
class Anthropic(ProviderProfile):
    """Anthropic's Messages API."""

    structured_output = "tool"
    key_env = ("ANTHROPIC_API_KEY",)
    models_path = "/v1/models"
    prompt_caching = "explicit"  # cache_control blocks; reads at 0.1x the input price, writes at 1.25x
    prompt_cache_min_by_model = CLAUDE_CACHE_MINIMUMS
    batch_protocol = AnthropicMessageBatches
    context_length_error = AnthropicPromptTooLong


@register_provider("bedrock")
class Bedrock(ProviderProfile):
    """AWS Bedrock: credentials from the AWS default chain (region via AWS_REGION_NAME)."""

    structured_output = "tool"
    credential_env = (
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    )
    credential_files = ("~/.aws/credentials",)
    keyless_endpoints = False
    prompt_caching = "explicit"  # LiteLLM turns cache_control into Converse's cachePoint (Claude, Nova)
    batch_protocol = BedrockBatchInference  # takes Claude and Nova models; the others' are sent synchronously
    prompt_cache_min_by_model = CLAUDE_CACHE_MINIMUMS
    context_length_error = BedrockInputTooLong

    def marks_prompt_cache(self, model: str) -> bool:
        # Only Bedrock's Claude and Nova models take a cache point; others would reject the field.
        name = model.lower()
        return "anthropic." in name or "claude" in name or "nova" in name


@register_provider("vertex_ai")
class VertexAI(ProviderProfile):
    """Google Vertex AI: application default credentials and a project."""

    credential_env = ("GOOGLE_APPLICATION_CREDENTIALS", "VERTEXAI_PROJECT", "VERTEX_PROJECT", "GOOGLE_CLOUD_PROJECT")
    keyless_endpoints = False
    prompt_caching = "automatic"  # Gemini's implicit caching; Claude on Vertex AI caches marked prefixes
    prompt_cache_min_by_model = CLAUDE_CACHE_MINIMUMS
    context_length_error = VertexContextLength
    batch_protocol = VertexBatchPrediction  # batch prediction jobs on files in Cloud Storage (batch.vertex)

    def marks_prompt_cache(self, model: str) -> bool:
        # LiteLLM sends Claude on Vertex AI through Anthropic's Messages format, cache_control included;
        # Gemini would take the mark as a request to create a context cache: not marked.
        return "claude" in model.lower()


@register_provider("gemini")
class Gemini(ProviderProfile):
    """Google AI Studio (the Gemini API with a key)."""

    key_env = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
    context_length_error = GoogleTokenLimit


class OpenModelHost(ProviderProfile):
    """A host of open-weight models (not registered itself): some of its reasoning models write
    their reasoning inline in ``<think>`` tags."""

    reasoning = "think_tags"


@register_provider("together_ai")
class TogetherAI(OpenModelHost):
    key_env = ("TOGETHERAI_API_KEY", "TOGETHER_AI_TOKEN")


@register_provider("groq")
class Groq(OpenModelHost):
    key_env = ("GROQ_API_KEY",)


@register_provider("mistral")
class Mistral(ProviderProfile):
    key_env = ("MISTRAL_API_KEY",)


@register_provider("deepseek")
class DeepSeek(ProviderProfile):
    """DeepSeek's API answers a JSON-schema response_format with a 400: JSON mode only."""

    structured_output = "json_object"
    key_env = ("DEEPSEEK_API_KEY",)
    prompt_caching = "automatic"
    reasoning = "think_tags"  # R1 through third-party hosts and old API versions writes its tags inline


@register_provider("fireworks_ai")
class FireworksAI(OpenModelHost):
    key_env = ("FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY")


@register_provider("openrouter")
class OpenRouter(OpenModelHost):
    key_env = ("OPENROUTER_API_KEY",)


@register_provider("ollama")
class Ollama(ProviderProfile):
    """A local Ollama server (its own API, not OpenAI's format; LiteLLM maps the schema to ``format``)."""

    reasoning = "think_tags"


@register_provider("ollama_chat")
class OllamaChat(Ollama):
    """Ollama's chat endpoint."""
