"""A provider's own "context too long" 400 is the row's ``too_long`` outcome, not a failed call.

Each provider words it its own way; each provider profile reads its own wording
(``tasks/llm/context_errors.py``). Against the scripted server, over real HTTP, through the
gateway: OpenAI's body on the gateway's direct path and through LiteLLM, Anthropic's on the
Messages API, Bedrock's ValidationException on the Converse route and the Gemini API's
INVALID_ARGUMENT on generateContent (Vertex AI words it the same).
"""

from __future__ import annotations

import pytest

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.context_errors import (
    AnthropicPromptTooLong,
    BedrockInputTooLong,
    GoogleTokenLimit,
)
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.providers import profile_for
from refusalbench.tasks.llm.scripted_server import Behaviour, ScriptedLLMServer
from refusalbench.tasks.llm.structured_outputs import JudgeSingleOutput

QUESTION = [{"role": "user", "content": "Summarise these four long documents for me, please."}]

# name -> (LiteLLM model string, how its api_base is found on the server, the provider's words in the error)
PROVIDERS = {
    "gpt": ("openai/gpt", "url", "maximum context length"),
    "claude": ("anthropic/claude", "anthropic_url", "prompt is too long"),
    "nova": ("bedrock/amazon.nova-pro-v1:0", "anthropic_url", "Input is too long"),
    "gemini-pro": ("gemini/gemini-pro", "anthropic_url", "exceeds the maximum number of tokens"),
}


@pytest.fixture
def aws_and_google_keys(monkeypatch):
    """Credentials LiteLLM signs and sends with (any value: the scripted server checks none)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASCRIPTED")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "scripted")
    monkeypatch.setenv("AWS_REGION_NAME", "us-east-1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "scripted")
    monkeypatch.setenv("GEMINI_API_KEY", "scripted")


def gateway_for(server: ScriptedLLMServer, names, cache=None) -> Gateway:
    models = {
        name: ModelConfig(
            model=PROVIDERS[name][0], api_base=getattr(server, PROVIDERS[name][1]), params={"max_tokens": 40}
        )
        for name in names
    }
    return Gateway(models, cache)


@pytest.mark.usefixtures("aws_and_google_keys")
@pytest.mark.parametrize("structured", [False, True], ids=["text", "structured"])
def test_each_providers_context_length_400_is_too_long(structured):
    behaviours = {model.split("/", 1)[1]: Behaviour(too_long=True) for model, _, _ in PROVIDERS.values()}
    with ScriptedLLMServer(behaviours=behaviours) as server:
        gateway = gateway_for(server, PROVIDERS)
        for name, (model, _, words) in PROVIDERS.items():
            served = model.split("/", 1)[1]
            result = gateway.complete(name, QUESTION, schema=JudgeSingleOutput if structured else None)
            assert (result.outcome, result.error_kind) == ("too_long", "too_long"), (name, result.error)
            assert result.error.startswith("too_long: the prompt does not fit the model's context window")
            assert words in result.error, (name, result.error)
            assert result.parsed is None and result.text is None
            (call,) = server.calls_for(served)  # sent once: the same prompt is too long again
            assert call["status"] == 400 and result.attempts == 1
            assert result.prompt_tokens is None and result.cost_usd is None  # an error bills nothing
        stats = gateway.stats_snapshot()
        assert all(stats[name].get("too_long") == 1 and not stats[name].get("errors") for name in PROVIDERS)
        assert {c["wire"] for c in server.calls} == {"openai", "anthropic", "bedrock", "gemini"}


def test_openais_400_is_too_long_on_the_direct_path_and_through_litellm():
    with ScriptedLLMServer(behaviours={"gpt": Behaviour(too_long=True)}) as server:
        for direct in (True, False):
            gateway = gateway_for(server, ["gpt"])
            gateway.direct_http = direct
            result = gateway.complete("gpt", QUESTION)
            assert result.outcome == "too_long" and "maximum context length" in result.error, (direct, result.error)
        assert [c["status"] for c in server.calls_for("gpt")] == [400, 400]


def test_a_too_long_reply_is_kept_for_a_target_and_asked_again_for_a_structured_role(tmp_path):
    with ScriptedLLMServer(behaviours={"claude": Behaviour(too_long=True)}) as server:
        cache = SQLiteCache(tmp_path / "calls.sqlite")
        for _ in range(2):
            gateway_for(server, ["claude"], cache).complete("claude", QUESTION)
        assert len(server.calls_for("claude")) == 1  # a target's outcome is its measurement: cached
        for _ in range(2):
            gateway_for(server, ["claude"], cache).complete("claude", QUESTION, schema=JudgeSingleOutput)
        assert len(server.calls_for("claude")) == 3  # never served from the cache as a structured success


def test_each_profile_reads_its_own_providers_words_and_no_other_400():
    openai = '{"error": {"message": "This model\'s maximum context length is 8192 tokens", "code": "context_length_exceeded"}}'
    anthropic = '{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 9 > 8"}}'
    bedrock = "ValidationException: Input is too long for requested model."
    bedrock_tokens = "ValidationException: Too many input tokens. Max input tokens: 8192"
    google = '{"error": {"code": 400, "message": "The input token count (9) exceeds the maximum number of tokens allowed (8).", "status": "INVALID_ARGUMENT"}}'
    other = '{"error": {"message": "Invalid value for temperature", "code": "invalid_value"}}'
    expected = {
        "openai/gpt-4o": {openai},
        "azure/gpt-4o": {openai},
        "anthropic/claude-sonnet-4": {anthropic},
        "bedrock/amazon.nova-pro-v1:0": {bedrock, bedrock_tokens, anthropic},
        "gemini/gemini-2.5-pro": {google},
        "vertex_ai/gemini-2.5-pro": {google, anthropic},
    }
    for model, own in expected.items():
        profile = profile_for(model)
        for message in (openai, anthropic, bedrock, bedrock_tokens, google, other):
            assert profile.context_too_long(400, message) == (message in own), (model, message)
        assert not profile.context_too_long(429, next(iter(own)))  # a rate limit is never too long
    assert (
        profile_for("bedrock/x").context_length_error is BedrockInputTooLong
        and profile_for("anthropic/x").context_length_error is AnthropicPromptTooLong
        and profile_for("gemini/x").context_length_error is GoogleTokenLimit
    )


def test_another_400_stays_a_failed_call():
    with ScriptedLLMServer() as server:
        server.fail_next(1, status=400)
        result = gateway_for(server, ["gpt"]).complete("gpt", QUESTION)
        assert result.outcome == "call_error" and "HTTP 400" in result.error
