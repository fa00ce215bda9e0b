"""The scripted server behaves like real providers, seen through LiteLLM's real provider adapters.

Each scripted model has one :class:`Behaviour`; every test calls it through ``litellm.completion``
with ``openai/<model>`` (chat completions at ``server.url``) or ``anthropic/<model>`` (the
Messages API at ``server.anthropic_url``), and checks that the behaviour arrives where a client
of LiteLLM would look for it. Where LiteLLM itself loses part of a provider's reply, the test
says so: the gateway has to work with what arrives, not with what the provider sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from email.utils import parsedate_to_datetime

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")  # no fetch of LiteLLM's remote config

import litellm  # noqa: E402

from refusalbench.tasks.llm.scripted_server import (  # noqa: E402
    AZURE_PROMPT_FILTERED,
    CANNED_REFUSAL,
    JSON_SCHEMA_UNSUPPORTED,
    Behaviour,
    RateLimit,
    ScriptedLLMServer,
    go_duration,
    last_user_text,
    requested_schema,
)

litellm.suppress_debug_info = True

ANSWER = "The capital is Paris."
REASONING = "The passage names Paris. Should I answer REFUSE? No, it is stated."
JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"quality": {"type": "integer"}, "rationale": {"type": "string"}},
    "required": ["quality", "rationale"],
    "additionalProperties": False,
}
JUDGE_FORMAT = {"type": "json_schema", "json_schema": {"name": "JudgeOutput", "schema": JUDGE_SCHEMA, "strict": False}}
MESSAGES = [{"role": "system", "content": "Answer from the passage."}, {"role": "user", "content": "Where is it?"}]
PROMPT_WORDS = 7  # the scripted server bills a token per whitespace-separated word
# A Claude model that LiteLLM sends native structured output (output_format) and prices.
NATIVE_CLAUDE = "claude-sonnet-4-5-20250929"
WIRES = ["openai", "anthropic"]


def answer(request):
    if requested_schema(request):
        return json.dumps({"quality": 5, "rationale": "stated"})
    return ANSWER


@pytest.fixture(scope="module")
def server():
    with ScriptedLLMServer(responder=answer, known_schemas={"JudgeOutput": JUDGE_SCHEMA}) as running:
        yield running


def call(server, wire, model, behaviour=None, **kwargs):
    """One completion through LiteLLM's adapter for ``wire``, ``model`` scripted with ``behaviour``."""
    if behaviour is not None:
        server.behaviours[model] = behaviour
    api_base = server.url if wire == "openai" else server.anthropic_url
    return litellm.completion(
        model=f"{wire}/{model}",
        messages=kwargs.pop("messages", MESSAGES),
        api_base=api_base,
        api_key="sk-scripted",
        max_retries=0,
        num_retries=0,
        **{"max_tokens": 64, **kwargs},
    )


def failure(server, wire, model, behaviour=None, **kwargs) -> Exception:
    with pytest.raises(Exception) as raised:
        call(server, wire, model, behaviour, **kwargs)
    return raised.value


# ---------------------------------------------------------------- both wire formats


def test_an_anthropic_request_reaches_the_responder_in_the_chat_completions_shape(server):
    seen = []
    server.responder = lambda request: seen.append(request) or answer(request)
    try:
        reply = call(server, "anthropic", "claude-scripted", response_format=JUDGE_FORMAT)
    finally:
        server.responder = answer
    (request,) = seen
    assert request["model"] == "claude-scripted"
    assert request["messages"] == MESSAGES and last_user_text(request) == "Where is it?"
    # LiteLLM forces a tool for the schema; it arrives as the response_format responders read.
    assert requested_schema(request) == "JudgeOutput"
    assert request["response_format"]["json_schema"]["schema"]["properties"] == JUDGE_SCHEMA["properties"]
    assert json.loads(reply.choices[0].message.content) == {"quality": 5, "rationale": "stated"}
    assert reply.choices[0].finish_reason == "stop"  # LiteLLM turns the tool_use stop into "stop"
    (logged,) = server.calls_for("claude-scripted")
    assert logged["wire"] == "anthropic" and logged["status"] == 200
    assert logged["headers"] == {"x-api-key": "sk-scripted", "anthropic-version": "2023-06-01"}
    assert logged["params"]["tool_choice"] == {"type": "tool", "name": "json_tool_call"}


def test_native_structured_output_on_the_messages_api_arrives_as_text(server):
    reply = call(server, "anthropic", NATIVE_CLAUDE, response_format=JUDGE_FORMAT)
    assert json.loads(reply.choices[0].message.content)["quality"] == 5
    logged = server.calls_for(NATIVE_CLAUDE)[-1]
    assert "output_format" in logged["params"] and requested_schema(logged) == "JudgeOutput"
    assert reply._hidden_params["response_cost"] > 0  # a priced model: LiteLLM costs the billed usage


def test_the_messages_api_refuses_what_anthropic_refuses():
    with ScriptedLLMServer() as server:

        def post(headers, body):
            request = urllib.request.Request(
                f"{server.anthropic_url}/v1/messages",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json", **headers},
            )
            with pytest.raises(urllib.error.HTTPError) as raised:
                urllib.request.urlopen(request, timeout=5)
            return raised.value.code, json.loads(raised.value.read())

        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        status, error = post({"anthropic-version": "2023-06-01"}, body)
        assert status == 401 and error["error"]["type"] == "authentication_error"
        status, error = post({"x-api-key": "k"}, body)
        assert status == 400 and error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        status, error = post({"x-api-key": "k", "anthropic-version": "2023-06-01"}, {**body, "max_tokens": None})
        assert status == 400 and "max_tokens" in error["error"]["message"]
        assert [c["status"] for c in server.calls] == [401, 400, 400]


@pytest.mark.parametrize(
    "status, exception",
    [(529, litellm.InternalServerError), (429, litellm.RateLimitError), (500, litellm.InternalServerError)],
)
def test_injected_faults_are_worded_as_the_messages_api_words_them(server, status, exception):
    server.fail_next(status=status, retry_after=3)
    error = failure(server, "anthropic", f"claude-fault-{status}")
    assert isinstance(error, exception)
    expected_type = {529: "overloaded_error", 429: "rate_limit_error", 500: "api_error"}[status]
    assert f'"type": "{expected_type}"' in str(error)
    assert error.litellm_response_headers["retry-after"] == "3"
    # LiteLLM reports Anthropic's 529 (overloaded) as a 500: only the body still says "overloaded".
    assert error.status_code == (500 if status == 529 else status)
    assert server.calls_for(f"claude-fault-{status}")[-1]["status"] == status


def test_the_async_path_takes_the_same_adapters(server):
    server.behaviours["claude-async"] = Behaviour(reasoning=REASONING)

    async def both():
        return await asyncio.gather(
            *(
                litellm.acompletion(
                    model=f"{wire}/claude-async",
                    messages=MESSAGES,
                    api_key="sk-scripted",
                    max_tokens=64,
                    max_retries=0,
                    api_base=server.url if wire == "openai" else server.anthropic_url,
                )
                for wire in WIRES
            )
        )

    for reply in asyncio.run(both()):
        assert reply.choices[0].message.content == ANSWER
        assert reply.choices[0].message.reasoning_content == REASONING
    assert sorted(c["wire"] for c in server.calls_for("claude-async")) == ["anthropic", "openai"]


# ---------------------------------------------------------------- reasoning


def test_inline_think_tags_are_split_off_by_litellm_only_on_the_openai_adapter(server):
    behaviour = Behaviour(reasoning=REASONING, reasoning_in="think_tags")
    openai = call(server, "openai", "r1-inline", behaviour).choices[0].message
    # LiteLLM's OpenAI response conversion splits a leading <think>…</think> off the content.
    assert openai.reasoning_content.strip() == REASONING and openai.content.strip() == ANSWER
    anthropic = call(server, "anthropic", "r1-inline").choices[0].message
    assert anthropic.content == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
    assert getattr(anthropic, "reasoning_content", None) is None
    usage = server.calls_for("r1-inline")[-1]["billed"]
    assert usage["reasoning_tokens"] == 0  # the provider cannot tell inline reasoning apart
    assert usage["completion_tokens"] == len(REASONING.split()) + len(ANSWER.split())


def test_a_think_block_without_its_opening_tag_stays_in_the_content_on_both_adapters(server):
    behaviour = Behaviour(reasoning=REASONING, reasoning_in="think_end_only")
    for wire in WIRES:
        message = call(server, wire, "r1-template", behaviour).choices[0].message
        assert message.content == f"{REASONING}\n</think>\n\n{ANSWER}"
        assert getattr(message, "reasoning_content", None) is None


@pytest.mark.parametrize("place", ["field", "reasoning_field"])
def test_reasoning_in_its_own_field_arrives_as_reasoning_content(server, place):
    model = f"deepseek-{place}"
    reply = call(server, "openai", model, Behaviour(reasoning=REASONING, reasoning_in=place))
    message = reply.choices[0].message
    assert message.content == ANSWER and message.reasoning_content == REASONING
    assert reply.usage.completion_tokens_details.reasoning_tokens == len(REASONING.split())
    assert reply.usage.completion_tokens == len(REASONING.split()) + len(ANSWER.split())
    if place == "reasoning_field":  # vLLM's newer field name also stays in the provider's fields
        assert message.provider_specific_fields["reasoning"] == REASONING


def test_anthropic_thinking_arrives_as_thinking_blocks_and_reasoning_content(server):
    reply = call(server, "anthropic", "claude-thinking", Behaviour(reasoning=REASONING))
    message = reply.choices[0].message
    assert message.content == ANSWER and message.reasoning_content == REASONING
    (block,) = message.thinking_blocks
    assert block["type"] == "thinking" and block["thinking"] == REASONING and block["signature"]
    # Anthropic bills thinking inside output_tokens without a count of its own: LiteLLM estimates it.
    assert 0 < reply.usage.completion_tokens_details.reasoning_tokens <= reply.usage.completion_tokens
    assert reply.usage.completion_tokens == len(REASONING.split()) + len(ANSWER.split())


def test_reasoning_can_depend_on_the_request(server):
    behaviour = Behaviour(reasoning=lambda request: f"Draft for {last_user_text(request)}", reasoning_in="think_tags")
    message = call(server, "openai", "r1-draft", behaviour).choices[0].message
    assert message.reasoning_content.strip() == "Draft for Where is it?"


def test_structured_output_through_the_forced_tool_loses_the_thinking(server):
    reply = call(
        server, "anthropic", "claude-json-thinking", Behaviour(reasoning=REASONING), response_format=JUDGE_FORMAT
    )
    message = reply.choices[0].message
    assert json.loads(message.content)["quality"] == 5
    # LiteLLM replaces the message with the tool's JSON: the thinking block and text are dropped.
    assert getattr(message, "reasoning_content", None) is None and not getattr(message, "thinking_blocks", None)
    native = call(server, "anthropic", NATIVE_CLAUDE, Behaviour(reasoning=REASONING), response_format=JUDGE_FORMAT)
    assert native.choices[0].message.reasoning_content == REASONING  # native output_format keeps it


# ---------------------------------------------------------------- truncation


@pytest.mark.parametrize("wire", WIRES)
def test_a_budget_spent_on_reasoning_leaves_no_content(server, wire):
    reply = call(server, wire, "o-budget", Behaviour(reasoning=REASONING, content="", finish="length"), max_tokens=40)
    assert reply.choices[0].finish_reason == "length"
    assert not reply.choices[0].message.content  # "" on the OpenAI adapter, None on the Anthropic one
    assert reply.choices[0].message.reasoning_content == REASONING
    assert reply.usage.completion_tokens == 40  # the whole budget is billed
    assert server.calls_for("o-budget")[-1]["billed"] == {
        "prompt_tokens": PROMPT_WORDS,
        "completion_tokens": 40,
        "reasoning_tokens": 40,
        "cached_tokens": 0,
    }


def test_a_budget_spent_inside_inline_reasoning_leaves_an_unclosed_think_tag(server):
    behaviour = Behaviour(reasoning=REASONING, reasoning_in="think_tags", content="", finish="length")
    message = call(server, "openai", "r1-budget", behaviour).choices[0].message
    assert message.content == f"<think>\n{REASONING}"  # LiteLLM splits only a closed block
    assert getattr(message, "reasoning_content", None) is None


@pytest.mark.parametrize("wire", WIRES)
def test_a_truncated_answer_ends_with_length(server, wire):
    reply = call(server, wire, "small-budget", Behaviour(truncate_at=10, finish="length"), max_tokens=12)
    assert reply.choices[0].finish_reason == "length"  # Anthropic's stop_reason max_tokens
    assert reply.choices[0].message.content == ANSWER[:10]
    assert reply.usage.completion_tokens == 12


# ---------------------------------------------------------------- safety blocks


@pytest.mark.parametrize("wire", WIRES)
def test_a_safety_block_with_empty_content_is_a_content_filter_finish(server, wire):
    reply = call(server, wire, "filtered-empty", Behaviour(content="", finish="content_filter"))
    assert reply.choices[0].finish_reason == "content_filter"  # Anthropic's stop_reason refusal
    assert reply.choices[0].message.content is None
    assert reply.usage.prompt_tokens == PROMPT_WORDS  # the prompt is billed all the same
    assert server.calls_for("filtered-empty")[-1]["billed"]["prompt_tokens"] == PROMPT_WORDS


@pytest.mark.parametrize("wire", WIRES)
def test_a_safety_block_with_canned_text(server, wire):
    reply = call(server, wire, "filtered-canned", Behaviour(content=CANNED_REFUSAL, finish="content_filter"))
    assert reply.choices[0].finish_reason == "content_filter"
    assert reply.choices[0].message.content == CANNED_REFUSAL
    assert reply.usage.completion_tokens == len(CANNED_REFUSAL.split())


def test_the_refusal_channel_of_each_api(server):
    behaviour = Behaviour(content=CANNED_REFUSAL, finish="refusal")
    openai = call(server, "openai", "refuser", behaviour)
    # OpenAI's message.refusal: LiteLLM keeps it only among the provider's fields; finish is "stop".
    assert openai.choices[0].finish_reason == "stop" and openai.choices[0].message.content is None
    assert openai.choices[0].message.provider_specific_fields["refusal"] == CANNED_REFUSAL
    anthropic = call(server, "anthropic", "refuser")
    # Anthropic's stop_reason "refusal" becomes LiteLLM's "content_filter".
    assert anthropic.choices[0].finish_reason == "content_filter"
    assert anthropic.choices[0].message.content == CANNED_REFUSAL


def test_a_prompt_filtered_with_a_400(server):
    error = failure(server, "openai", "azure-filtered", Behaviour(prompt_filtered=True))
    assert isinstance(error, litellm.BadRequestError) and error.status_code == 400
    assert not isinstance(error, litellm.ContentPolicyViolationError)  # LiteLLM's openai/ does not tell it apart
    assert AZURE_PROMPT_FILTERED[:60] in str(error)  # only the message survives: error.body is None
    error = failure(server, "anthropic", "azure-filtered")
    assert isinstance(error, litellm.ContentPolicyViolationError) and error.status_code == 400
    assert "Output blocked by content filtering policy" in str(error)
    assert [c["billed"]["prompt_tokens"] for c in server.calls_for("azure-filtered")] == [0, 0]


# ---------------------------------------------------------------- structured-output fallbacks


def test_json_schema_rejected_while_json_object_works(server):
    error = failure(
        server, "openai", "json-object-only", Behaviour(rejects_json_schema=True), response_format=JUDGE_FORMAT
    )
    assert isinstance(error, litellm.BadRequestError) and error.status_code == 400
    assert error.body == {
        "message": JSON_SCHEMA_UNSUPPORTED,
        "type": "invalid_request_error",
        "param": "response_format",
        "code": None,
    }
    reply = call(server, "openai", "json-object-only", response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert [c["status"] for c in server.calls_for("json-object-only")] == [400, 200]


def test_output_format_rejected_on_the_messages_api_while_the_tool_path_works(server):
    server.behaviours["claude-tools-only"] = Behaviour(rejects_json_schema=True)
    reply = call(server, "anthropic", "claude-tools-only", response_format=JUDGE_FORMAT)  # forced tool
    assert json.loads(reply.choices[0].message.content)["quality"] == 5
    error = failure(
        server, "anthropic", NATIVE_CLAUDE, Behaviour(rejects_json_schema=True), response_format=JUDGE_FORMAT
    )
    assert isinstance(error, litellm.BadRequestError) and "output_format" in str(error)
    server.behaviours.pop(NATIVE_CLAUDE)


# ---------------------------------------------------------------- rate limits


def test_go_durations_read_as_openai_writes_them():
    assert [go_duration(s) for s in (0.25, 1, 2, 6.5, 360, 3723)] == ["250ms", "1s", "2s", "6.5s", "6m0s", "1h2m3s"]


@pytest.mark.parametrize("wire", WIRES)
def test_a_rate_limit_for_a_number_of_requests(server, wire):
    model = f"limited-twice-{wire}"
    server.behaviours[model] = Behaviour(rate_limit=RateLimit(form="seconds", wait_s=2, requests=2))
    for _ in range(2):
        error = failure(server, wire, model)
        assert isinstance(error, litellm.RateLimitError) and error.status_code == 429
        assert error.litellm_response_headers["retry-after"] == "2"
    assert call(server, wire, model).choices[0].message.content == ANSWER
    assert [c["status"] for c in server.calls_for(model)] == [429, 429, 200]
    assert [c["billed"]["prompt_tokens"] for c in server.calls_for(model)] == [0, 0, PROMPT_WORDS]


@pytest.mark.parametrize(
    "form, header, value",
    [
        ("ms", "retry-after-ms", "250"),
        ("reset_requests", "x-ratelimit-reset-requests", "250ms"),
        ("reset_tokens", "x-ratelimit-reset-tokens", "250ms"),
    ],
)
def test_rate_limit_headers_in_each_form_reach_the_exception(server, form, header, value):
    model = f"limited-{form}"
    error = failure(server, "openai", model, Behaviour(rate_limit=RateLimit(form=form, wait_s=0.25, requests=1)))
    headers = error.litellm_response_headers
    assert headers[header] == value
    assert "retry-after" not in headers  # only the form's own header
    kind = "tokens" if form == "reset_tokens" else "requests"
    assert headers[f"x-ratelimit-remaining-{kind}"] == "0"


def test_the_reset_header_with_minutes(server):
    error = failure(
        server, "openai", "limited-minutes", Behaviour(rate_limit=RateLimit(form="reset_tokens", wait_s=360))
    )
    assert error.litellm_response_headers["x-ratelimit-reset-tokens"] == "6m0s"


def test_anthropic_reset_headers_are_its_own(server):
    behaviour = Behaviour(rate_limit=RateLimit(form="reset_requests", wait_s=2, requests=1))
    error = failure(server, "anthropic", "claude-limited", behaviour)
    headers = error.litellm_response_headers
    assert "retry-after" not in headers and "x-ratelimit-reset-requests" not in headers
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")


@pytest.mark.parametrize("wire", WIRES)
def test_a_rate_limit_until_a_time_announced_as_an_http_date(server, wire):
    model = f"limited-until-{wire}"
    until = time.time() + 1.2
    error = failure(server, wire, model, Behaviour(rate_limit=RateLimit(form="http_date", until=until)))
    announced = parsedate_to_datetime(error.litellm_response_headers["retry-after"]).timestamp()
    assert until <= announced < until + 1  # rounded up to the whole second an HTTP-date can say
    while time.time() < until:
        assert isinstance(failure(server, wire, model), litellm.RateLimitError)
        time.sleep(0.3)
    assert call(server, wire, model).choices[0].message.content == ANSWER
    calls = server.calls_for(model)
    assert all(c["status"] == 429 for c in calls[:-1]) and calls[-1]["status"] == 200
    assert calls[-1]["time"] >= until


# ---------------------------------------------------------------- identity and billing


@pytest.mark.parametrize("wire", WIRES)
def test_the_served_model_and_fingerprint_differ_from_the_request_and_can_change(server, wire):
    model = f"alias-{wire}"
    behaviour = Behaviour(served_model="provider-model-2025-06-01", system_fingerprint="fp_abc123")
    first = call(server, wire, model, behaviour)
    assert first.model == "provider-model-2025-06-01"
    if wire == "openai":  # the Messages API has no fingerprint
        assert first.system_fingerprint == "fp_abc123"
    behaviour.served_model, behaviour.system_fingerprint = "provider-model-2025-09-01", "fp_def456"
    second = call(server, wire, model)
    assert second.model == "provider-model-2025-09-01"
    if wire == "openai":
        assert second.system_fingerprint == "fp_def456"


@pytest.mark.parametrize("wire", WIRES)
def test_cached_prompt_tokens_are_billed_and_reported(server, wire):
    reply = call(server, wire, f"cached-{wire}", Behaviour(cached_prompt_tokens=4))
    assert reply.usage.prompt_tokens == PROMPT_WORDS  # Anthropic's input + cache reads, summed by LiteLLM
    assert reply.usage.prompt_tokens_details.cached_tokens == 4
    assert server.billed(f"cached-{wire}")["cached_tokens"] == 4


def test_billing_is_logged_for_every_reply(server):
    server.behaviours["billed-a"] = Behaviour(reasoning=REASONING)
    server.behaviours["billed-b"] = Behaviour(content="", finish="content_filter")
    before = server.billed()
    for model in ("billed-a", "billed-b"):
        reply = call(server, "openai", model)
        logged = server.calls_for(model)[-1]["billed"]
        assert reply.usage.prompt_tokens == logged["prompt_tokens"]
        assert reply.usage.completion_tokens == logged["completion_tokens"]
    after = server.billed()
    assert after["prompt_tokens"] - before["prompt_tokens"] == 2 * PROMPT_WORDS
    assert after["reasoning_tokens"] - before["reasoning_tokens"] == len(REASONING.split())
