"""Provider profiles: a provider's quirks live in one registered profile that every caller asks."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.integrations.inspect.bridge import litellm_kwargs
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.local_models import check_available, model_status
from refusalbench.tasks.llm.providers import (
    PROVIDERS,
    RETRIED_4XX,
    ProviderProfile,
    profile_for,
    register_provider,
    response_format_for,
    structured_mode,
)
from refusalbench.tasks.llm.transport import classify, direct_model_name
from refusalbench.tasks.refusalbench.plan.estimate import plan_run


class Verdict(BaseModel):
    verdict: str
    score: int


@pytest.fixture
def acme():
    """A made-up host speaking OpenAI's format, added the way a user adds one: one profile, one decorator."""

    @register_provider("acme")
    class Acme(ProviderProfile):
        """Acme's hosted models: JSON mode only, a key of their own even on a custom endpoint,
        ``max_completion_tokens`` instead of ``max_tokens``, and a 404 while a model loads."""

        structured_output = "json_object"
        key_env = ("ACME_API_KEY",)
        keyless_endpoints = False
        direct_http = True
        retriable_statuses = RETRIED_4XX | {404}

        def rewrite_params(self, params):
            out = dict(params)
            if "max_tokens" in out:
                out["max_completion_tokens"] = out.pop("max_tokens")
            return out

    yield Acme
    PROVIDERS.remove("acme")


def test_availability_reports_the_profiles_credential_variable(acme, monkeypatch):
    cfg = ModelConfig(model="acme/big-1", api_base="http://127.0.0.1:9/v1")
    monkeypatch.delenv("ACME_API_KEY", raising=False)
    row = model_status("big", cfg)
    assert row["available"] is False and row["credentials"] == "missing"
    assert row["reason"] == "no acme credentials found (set ACME_API_KEY)"
    assert check_available(["big"], {"big": cfg}, probe=False) == {"big": row["reason"]}

    monkeypatch.setenv("ACME_API_KEY", "acme-secret")
    present = model_status("big", cfg)
    assert present["available"] is True and present["credentials"] == "present"
    assert "acme-secret" not in str(present)


def test_the_gateway_sends_what_the_profile_says(acme, fake_llm, monkeypatch):
    monkeypatch.setenv("ACME_API_KEY", "acme-secret")
    fake_llm.responder = lambda request: '{"verdict": "PASS", "score": 4}'
    fake_llm.fail_next(1, status=404)  # retriable for acme only
    cfg = ModelConfig(model="acme/big-1", api_base=fake_llm.url, params={"max_tokens": 64, "temperature": 0.0})
    result = Gateway({"m": cfg}, backoff_base_s=0.01).complete(
        "m", [{"role": "user", "content": "judge"}], schema=Verdict
    )
    assert result.ok and result.parsed == Verdict(verdict="PASS", score=4)
    assert result.attempts == 2 and len(fake_llm.calls) == 2
    sent = fake_llm.calls[-1]
    assert sent["model"] == "big-1"  # posted directly: acme speaks OpenAI's format
    assert sent["response_format"] == {"type": "json_object"}  # JSON mode: no schema in the request
    assert sent["params"] == {"max_completion_tokens": 64, "temperature": 0.0}
    assert sent["authorization"] == "Bearer acme-secret"  # the profile's variable, not a placeholder


def test_litellms_errors_are_retried_as_the_profile_says(acme):
    import litellm

    not_found = litellm.NotFoundError("model is loading", model="big-1", llm_provider="openai")
    assert classify(not_found, acme()).retriable
    assert not classify(not_found, profile_for("openai/big-1")).retriable
    limited = litellm.RateLimitError("slow down", model="big-1", llm_provider="openai")
    assert classify(limited, acme()).retriable and classify(limited, profile_for("openai/big-1")).retriable


def test_the_default_profile_neither_retries_a_404_nor_rewrites(fake_llm):
    fake_llm.fail_next(1, status=404)
    cfg = ModelConfig(model="openai/fake", api_base=fake_llm.url, params={"max_tokens": 64})
    result = Gateway({"m": cfg}, backoff_base_s=0.01).complete("m", [{"role": "user", "content": "hi"}])
    assert not result.ok and result.attempts == 1
    assert fake_llm.calls[-1]["params"] == {"max_tokens": 64}


def test_a_built_in_json_mode_provider_through_litellms_own_adapter(fake_llm):
    """DeepSeek's API rejects a JSON schema; its profile asks for JSON mode, sent by LiteLLM's deepseek code."""
    fake_llm.responder = lambda request: '{"verdict": "FAIL", "score": 1}'
    cfg = ModelConfig(model="deepseek/deepseek-chat", api_base=fake_llm.url)
    result = Gateway({"m": cfg}, backoff_base_s=0.01).complete("m", [{"role": "user", "content": "x"}], schema=Verdict)
    assert result.ok and result.parsed == Verdict(verdict="FAIL", score=1)
    assert fake_llm.calls[-1]["model"] == "deepseek-chat"
    assert fake_llm.calls[-1]["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    ("model", "json_schema", "expected"),
    [
        ("openai/gpt-4o", True, "json_schema"),
        ("openai/gpt-4o", False, "json_object"),  # the model config's json_schema: false lowers the profile's mode
        ("bedrock/us.anthropic.claude-sonnet-4-20250514-v1:0", True, "tool"),
        ("bedrock/us.anthropic.claude-sonnet-4-20250514-v1:0", False, "json_object"),
        ("deepseek/deepseek-chat", True, "json_object"),
        ("some_new_provider/x", True, "json_schema"),  # no profile of its own: the default
    ],
)
def test_structured_mode_is_the_profiles_unless_the_config_says_no_schema(model, json_schema, expected):
    cfg = ModelConfig(model=model, json_schema=json_schema)
    assert structured_mode(cfg, profile_for(cfg.model, cfg.api_base)) == expected


def test_one_response_format_builder_for_every_mode():
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}}
    sent_as_schema = {"type": "json_schema", "json_schema": {"name": "Verdict", "schema": schema, "strict": False}}
    assert response_format_for("json_schema", "Verdict", schema) == sent_as_schema
    assert response_format_for("tool", "Verdict", schema) == sent_as_schema  # LiteLLM's adapter makes it a tool call
    assert response_format_for("json_object", "Verdict", schema) == {"type": "json_object"}
    assert response_format_for("none", "Verdict", schema) is None


def test_the_endpoint_picks_the_profile_and_the_credentials():
    # openai/ at OpenAI needs OpenAI's key; openai/ at an endpoint of its own is a keyless OpenAI-compatible server.
    assert profile_for("openai/gpt-4o").key_env == ("OPENAI_API_KEY",)
    compatible = profile_for("openai/qwen", "http://127.0.0.1:8080/v1")
    assert compatible.key_env == () and compatible.direct_http
    assert compatible.api_key(ModelConfig(model="openai/qwen"), "http://127.0.0.1:8080/v1") == "no-key"
    # Bedrock signs with AWS credentials even behind an endpoint of its own: no placeholder key.
    bedrock = profile_for("bedrock/amazon.nova-pro-v1:0", "http://proxy:8080")
    assert bedrock.api_key(ModelConfig(model="bedrock/amazon.nova-pro-v1:0"), "http://proxy:8080") is None
    assert direct_model_name("bedrock/amazon.nova-pro-v1:0", "http://proxy:8080") is None


def test_the_inspect_bridge_shapes_its_calls_by_the_profile(acme):
    settings = {
        "max_tokens": 32,
        "response_schema": {"name": "Verdict", "json_schema": {"type": "object"}, "strict": False},
    }
    kwargs = litellm_kwargs("acme/big-1", settings, "http://127.0.0.1:9/v1", None)
    assert kwargs == {
        "max_completion_tokens": 32,
        "response_format": {"type": "json_object"},
        "api_base": "http://127.0.0.1:9/v1",
    }  # no placeholder key: acme endpoints need theirs
    compatible = litellm_kwargs("openai/judge", settings, "http://127.0.0.1:9/v1", None)
    assert compatible["response_format"]["type"] == "json_schema" and compatible["api_key"] == "no-key"


def test_plan_counts_the_schema_only_where_the_profile_sends_it(acme, tmp_path):
    from tests.refusalbench.test_plan import write_config

    cfg = write_config(tmp_path)
    with_schema = plan_run(cfg).stages["generate"].models["gen-b"].input_tokens
    cfg.models["gen-b"].json_schema = False
    without_schema = plan_run(cfg).stages["generate"].models["gen-b"].input_tokens
    cfg.models["gen-b"].json_schema = True
    cfg.models["gen-b"].model = "acme/gen-b"  # JSON mode by its profile
    assert plan_run(cfg).stages["generate"].models["gen-b"].input_tokens == without_schema < with_schema


def test_a_second_profile_for_a_prefix_is_an_error_unless_replacing(acme):
    with pytest.raises(ValueError, match="provider profile 'acme' is already registered"):
        register_provider("acme")(type("Other", (ProviderProfile,), {}))
    replaced = register_provider("acme", replace=True)(type("Other", (ProviderProfile,), {}))
    assert type(profile_for("acme/x")) is replaced
