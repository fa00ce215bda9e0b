"""What an attempt of a call sends, and what its prompt takes from the model's window and ``tpm`` budget.

The gateway's synchronous path posts :func:`build_request` (the direct path's body, or LiteLLM's
messages and parameters); the batch path writes its request lines from the same request.
"""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.calls import CallSpec, json_schema, schema_name
from refusalbench.tasks.llm.context_limits import context_window, overflow, prompt_tokens
from refusalbench.tasks.llm.prompt_cache import marked_messages
from refusalbench.tasks.llm.providers import (
    SCHEMA_MODES,
    ProviderProfile,
    StructuredMode,
    profile_for,
    response_format_for,
    structured_mode,
)
from refusalbench.tasks.llm.transport import Request, direct_model


def build_request(
    spec: CallSpec, cfg: ModelConfig, api_base: str | None, mode: StructuredMode | None, *, direct_http: bool
) -> Request:
    """What an attempt of ``spec`` sends to ``api_base`` in structured-output ``mode`` (None: the profile's);
    ``direct_http`` False keeps every call on LiteLLM."""
    profile = profile_for(cfg.model, api_base)
    params = profile.rewrite_params({**cfg.params, **spec.params})
    api_key = profile.api_key(cfg, api_base)
    response_format = None
    if spec.schema_ is not None:
        response_format = response_format_for(
            mode or structured_mode(cfg, profile), schema_name(spec.schema_), json_schema(spec.schema_)
        )
    direct = direct_model(cfg.model, api_base, params, spec.messages) if direct_http and api_key else None
    if direct is not None:
        body = {"messages": spec.messages, "model": direct, **params}
        if response_format is not None:
            body["response_format"] = response_format
        return Request(api_base, profile, api_key, direct, body, spec.messages, {})
    kwargs: dict[str, Any] = dict(params)
    if api_base:
        kwargs["api_base"] = api_base
    if api_key:
        kwargs["api_key"] = api_key
    if cfg.extra_headers:
        kwargs["extra_headers"] = cfg.extra_headers
    if response_format is not None:
        kwargs["response_format"] = response_format
    # cache_control: not in the key
    messages = marked_messages(profile, cfg.model, spec.messages, spec.shared_chars, spec.shared_by)
    return Request(api_base, profile, api_key, None, None, messages, kwargs)


def too_long(spec: CallSpec, cfg: ModelConfig, profile: ProviderProfile, mode: StructuredMode | None) -> str | None:
    """Why this call's prompt does not fit the model's context window (``context_limits``), or None."""
    if context_window(cfg) is None:  # nothing to check against (most self-hosted models): no schema to build
        return None
    schema = json_schema(spec.schema_) if spec.schema_ is not None and mode in SCHEMA_MODES else None
    budget = profile.max_output_tokens({**cfg.params, **spec.params})
    return overflow(cfg, spec.messages, budget, schema)


def tpm_tokens(spec: CallSpec, cfg: ModelConfig, profile: ProviderProfile) -> int:
    """What a request takes from the model's ``tpm`` budget: its prompt's tokens plus its max_tokens."""
    if not cfg.tpm:
        return 0
    budget = profile.max_output_tokens({**cfg.params, **spec.params})
    return prompt_tokens(cfg.model, spec.messages) + (budget or 0)
