"""Issue 24, items 5-8: structured-output fallbacks, rate limits as providers announce them,
endpoints as part of a model's identity, and prompts too long for a model's window.

Each behaviour is scripted on the provider-realistic server (``Behaviour``) and reached through
the gateway's real paths: LiteLLM's OpenAI and Anthropic adapters and the direct HTTP path;
the flow-level tests run ``generate`` and ``evaluate`` end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import Counter
from email.utils import formatdate

import pandas as pd
import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.context_limits import known_window, overflow, prompt_tokens
from refusalbench.tasks.llm.endpoints import endpoint_identity, normalised_endpoint
from refusalbench.tasks.llm.gateway import CACHE_VERSION, CallSpec, Gateway, request_key
from refusalbench.tasks.llm.providers import profile_for
from refusalbench.tasks.llm.rate_limits import ModelLimiter, announced_wait, go_duration_seconds
from refusalbench.tasks.llm.scripted_server import (
    Behaviour,
    RateLimit,
    Rejection,
    ScriptedLLMServer,
    last_user_text,
)
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from refusalbench.tasks.refusalbench.stages.respond import target_messages
from tests.scripted import by_model, fenced, judge_by_reference, run_config, verifier_reply

VERDICT = json.dumps({"verdict": "PASS", "score": 4})
NATIVE_CLAUDE = "claude-sonnet-4-5-20250929"  # LiteLLM sends it native structured output (output_format)


class Verdict(BaseModel):
    verdict: str
    score: int


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _gateway(url: str, model: str = "openai/m", direct: bool = True, **settings) -> Gateway:
    cfg = ModelConfig(
        model=model, api_base=url, **{"max_concurrency": 4, "max_attempts": 3, "timeout_s": 10, **settings}
    )
    return Gateway({"m": cfg}, backoff_base_s=0.01, direct_http=direct)


# openai/ through the direct path and through LiteLLM's OpenAI adapter; anthropic/ through LiteLLM's Messages API.
WIRES = pytest.mark.parametrize(
    "wire, direct",
    [("openai", True), ("openai", False), ("anthropic", False)],
    ids=["openai-direct", "openai-litellm", "anthropic"],
)


def _wired(server: ScriptedLLMServer, wire: str, name: str, direct: bool, **settings) -> Gateway:
    """A gateway to ``name`` on ``server``, warmed up by one call: LiteLLM's first call takes
    seconds (imports, clients), which must not run down a test's clock."""
    url = server.url if wire == "openai" else server.anthropic_url
    gateway = _gateway(url, f"{wire}/{name}", direct, **settings)
    assert gateway.complete("m", _msg("warm-up")).ok
    server.calls.clear()
    return gateway


# ---------------------------------------------------------------- 6. rate limits: the headers


def test_go_durations_as_openai_writes_them():
    assert [go_duration_seconds(t) for t in ("250ms", "2s", "6m0s", "1h2m3s", "1.5s", "0.25")] == [
        0.25,
        2.0,
        360.0,
        3723.0,
        1.5,
        0.25,
    ]
    assert go_duration_seconds("soon") is None and go_duration_seconds("2x") is None


def test_every_header_form_a_provider_announces_a_wait_in():
    now = 1_760_000_000.0
    assert announced_wait({"Retry-After": "3"}, now) == 3.0
    assert announced_wait({"retry-after": formatdate(now + 10, usegmt=True)}, now) == pytest.approx(10.0)
    assert announced_wait({"retry-after-ms": "250", "retry-after": "1"}, now) == 0.25  # the finer one wins
    # Only the budget that is used up counts: its requests reset in 2 s, not the tokens' 6 minutes.
    assert (
        announced_wait(
            {
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-tokens": "149000",
            },
            now,
        )
        == 2.0
    )
    assert announced_wait({"x-ratelimit-reset-tokens": "250ms"}, now) == 0.25
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 7))
    assert announced_wait(
        {
            "anthropic-ratelimit-requests-reset": reset,
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-tokens-reset": reset,
            "anthropic-ratelimit-tokens-remaining": "49",
        },
        now,
    ) == pytest.approx(7.0)
    assert announced_wait({"content-type": "application/json"}, now) is None
    assert announced_wait(None) is None


def test_a_quota_429_is_not_a_rate_limit():
    profile = profile_for("openai/gpt-4o")
    assert profile.quota_exhausted("HTTP 429 RateLimitError: You exceeded your current quota, please check your plan")
    assert not profile.quota_exhausted("HTTP 429 RateLimitError: Rate limit reached for requests per min")


# ---------------------------------------------------------------- 6. rate limits: the gateway


@WIRES
def test_a_429_with_an_http_date_is_retried_no_earlier_than_the_date(wire, direct):
    with ScriptedLLMServer(responder=lambda r: "fine") as server:
        # max_attempts 1: the 429 must not use up the attempt meant for errors.
        gateway = _wired(server, wire, "dated", direct, max_attempts=1)
        until = time.time() + 1.2
        server.behaviours["dated"] = Behaviour(rate_limit=RateLimit(form="http_date", until=until))
        results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"q{i}")) for i in range(3)])
        assert all(r.ok and r.text == "fine" for r in results)
        calls = server.calls_for("dated")
        announced = math.ceil(until)  # an HTTP-date says whole seconds, rounded up
        assert all(c["time"] >= announced for c in calls if c["status"] == 200)
        assert set(Counter(c["fingerprint"] for c in calls).values()) == {2}  # a 429, then the answer
        assert gateway.stats_snapshot()["m"]["rate_limited"] >= 1


@WIRES
def test_only_a_reset_header_each_prompt_is_sent_at_most_twice(wire, direct):
    """Four calls in flight meet a 429 that says only ``x-ratelimit-reset-requests: 2s`` (the
    Messages API: an RFC 3339 reset): the whole model pauses, nobody retries early."""
    with ScriptedLLMServer(responder=lambda r: "fine") as server:
        server.latency_s = 0.05
        gateway = _wired(server, wire, "reset", direct, max_concurrency=4, max_attempts=1)
        server.behaviours["reset"] = Behaviour(rate_limit=RateLimit(form="reset_requests", wait_s=2, requests=4))
        started = time.monotonic()
        results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"q{i}")) for i in range(8)])
        assert all(r.ok for r in results)
        calls = server.calls_for("reset")
        assert [c["status"] for c in calls].count(429) == 4
        assert set(Counter(c["fingerprint"] for c in calls).values()) <= {1, 2}
        assert len(calls) == 12
        first_429 = min(c["time"] for c in calls if c["status"] == 429)
        assert min(c["time"] for c in calls if c["status"] == 200) >= first_429 + 1.9
        assert time.monotonic() - started < 10


def test_a_429_storm_longer_than_the_budget_fails_with_the_reason(fake_llm):
    fake_llm.behaviours["stormy"] = Behaviour(rate_limit=RateLimit(form="seconds", wait_s=1))
    gateway = _gateway(fake_llm.url, "openai/stormy", max_rate_limit_wait_s=1.5)
    started = time.monotonic()
    results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"s{i}")) for i in range(3)])
    assert time.monotonic() - started < 6
    for result in results:
        assert not result.ok and result.outcome == "call_error"
        assert "429" in result.error and "max_rate_limit_wait_s (1.5 s)" in result.error
    assert max(Counter(c["fingerprint"] for c in fake_llm.calls).values()) <= 3


def test_an_unannounced_429_backs_off_without_using_up_attempts(fake_llm):
    fake_llm.fail_next(2, status=429)  # no Retry-After at all
    result = _gateway(fake_llm.url, max_attempts=1).complete("m", _msg("x"))
    assert result.ok and result.attempts == 3


def test_the_token_budget_paces_requests():
    async def scenario() -> list[float]:
        limiter = ModelLimiter(tpm=600)  # 10 tokens a second, a bucket of 600
        started = time.monotonic()
        waits = []
        for tokens in (600, 10, 5):
            await limiter.wait(tokens)
            waits.append(time.monotonic() - started)
        return waits

    first, second, third = asyncio.run(scenario())
    assert first < 0.1 and 0.9 <= second < 1.5 and 1.4 <= third < 2.0


def test_tpm_counts_the_prompt_and_max_tokens(fake_llm):
    # tpm 6000 (100 a second): requests of 2040 tokens (prompt + max_tokens) each; the bucket holds
    # two of them, the third waits for the 120 tokens it lacks.
    max_tokens = 2040 - prompt_tokens("openai/m", _msg("t0"))
    gateway = _gateway(fake_llm.url, tpm=6000, params={"max_tokens": max_tokens}, max_concurrency=1)
    started = time.monotonic()
    gateway.complete_many([CallSpec(model="m", messages=_msg(f"t{i}")) for i in range(3)])
    gaps = [c["time"] - fake_llm.calls[0]["time"] for c in fake_llm.calls]
    assert gaps[1] < 0.5 and 1.0 <= gaps[2] < 2.5
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- 5. structured-output fallbacks


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "litellm"])
def test_a_rejected_json_schema_falls_back_to_json_object_for_the_rest_of_the_run(fake_llm, direct):
    fake_llm.responder = lambda request: VERDICT
    fake_llm.behaviours["picky"] = Behaviour(rejects_json_schema=True)
    gateway = _gateway(fake_llm.url, "openai/picky", direct, max_attempts=1)  # max_concurrency 4
    results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"v{i}"), schema=Verdict) for i in range(20)])
    assert all(r.ok and r.parsed == Verdict(verdict="PASS", score=4) for r in results)
    statuses = [(c["status"], (c["response_format"] or {}).get("type")) for c in fake_llm.calls]
    # Only the calls in flight when the first 400 came back met it (at most max_concurrency), not every item.
    assert 1 <= statuses.count((400, "json_schema")) <= 4
    assert statuses.count((200, "json_object")) == 20 and len(statuses) <= 24
    assert gateway.structured_output_fallbacks() == {"m": "json_object"}
    assert gateway.stats_snapshot()["m"]["structured_fallbacks"] == 1
    # A call that met the 400 was sent again: not a failed item, one more request.
    attempts = sorted(r.attempts for r in results)
    assert set(attempts) <= {1, 2} and attempts.count(2) == statuses.count((400, "json_schema"))


def test_the_first_structured_calls_of_a_model_go_out_together(fake_llm):
    """No probe: a model's first structured calls are not held back for one call to settle the mode."""
    fake_llm.responder = lambda request: VERDICT
    fake_llm.latency_s = 0.4
    gateway = _gateway(fake_llm.url)
    assert gateway.complete("m", _msg("warm-up")).ok  # a plain call: the connection is up, no mode settled
    started = time.monotonic()
    results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"t{i}"), schema=Verdict) for i in range(4)])
    assert all(r.ok for r in results)
    assert time.monotonic() - started < 0.75  # one reply's time, not two
    assert max(c["inflight"] for c in fake_llm.calls) == 4


class RejectsResponseFormat(ScriptedLLMServer):
    """A server that takes no response_format at all (400 naming it, as OpenAI-compatible servers word it)."""

    def _behaviour_rejection(self, request, body, behaviour, wire, now):
        kind = (request.get("response_format") or {}).get("type")
        if kind:
            return Rejection(
                400,
                wire.error_body(
                    400,
                    f"response_format type '{kind}' is not supported",
                    kind="invalid_request_error",
                    param="response_format",
                ),
            )
        return super()._behaviour_rejection(request, body, behaviour, wire, now)


def test_then_to_prompt_only_json():
    with RejectsResponseFormat(responder=lambda request: f"Here it is: {VERDICT}") as server:
        gateway = _gateway(server.url, "openai/plain")
        results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"p{i}"), schema=Verdict) for i in range(4)])
        assert all(r.ok for r in results)
        sent = [(c["status"], (c["response_format"] or {}).get("type")) for c in server.calls]
        # Each mode is met by at most one round of calls (max_concurrency 4), in order; every item then answers.
        rejected = [kind for status, kind in sent if status == 400]
        assert rejected == sorted(rejected, key=["json_schema", "json_object"].index)
        assert 1 <= rejected.count("json_schema") <= 4 and 1 <= rejected.count("json_object") <= 4
        assert sent.count((200, None)) == 4 and len(sent) == len(rejected) + 4
        assert gateway.structured_output_fallbacks() == {"m": "none"}


def test_the_messages_api_rejecting_output_format_falls_back():
    with ScriptedLLMServer(responder=lambda request: VERDICT) as server:
        server.behaviours[NATIVE_CLAUDE] = Behaviour(rejects_json_schema=True)
        gateway = _gateway(server.anthropic_url, f"anthropic/{NATIVE_CLAUDE}", direct=False)
        results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"a{i}"), schema=Verdict) for i in range(3)])
        assert all(r.ok and r.parsed.score == 4 for r in results)
        calls = server.calls_for(NATIVE_CLAUDE)
        rejected = [c for c in calls if c["status"] == 400]  # the calls of the first round (max_concurrency 4)
        assert 1 <= len(rejected) <= 3 and [c["status"] for c in calls].count(200) == 3
        assert all("output_format" in c["params"] for c in rejected)
        assert not any("output_format" in c["params"] for c in calls if c["status"] == 200)
        assert gateway.structured_output_fallbacks() == {"m": "json_object"}


def test_a_400_about_something_else_is_no_fallback(fake_llm):
    fake_llm.fail_next(1, status=400)
    gateway = _gateway(fake_llm.url)
    result = gateway.complete("m", _msg("bad"), schema=Verdict)
    assert not result.ok and result.attempts == 1 and "400" in result.error
    assert gateway.structured_output_fallbacks() == {}


GEN_BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
    },
    {"id": "s2", "question": "Who founded the firm?", "answers": ["Ada Lee"], "context": "Ada Lee founded the firm."},
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
]


def _generator(request) -> str:
    """A generator that knows its output shape from the prompt, as it must without a schema."""
    if "<passage" in json.dumps(request["messages"]):
        return json.dumps(
            {
                "perturbed_question": "Multi?",
                "passages": [{"index": 1, "text": "Edited.", "relevant": True}],
                "lever_applied": "x",
                "rationale": "r",
                "answer_constraint_holds": True,
            }
        )
    return json.dumps(
        {
            "perturbed_question": "Single?",
            "perturbed_context": "Perturbed.",
            "lever_applied": "x",
            "rationale": "r",
            "answer_constraint_holds": True,
        }
    )


@pytest.mark.usefixtures("prefect_harness")
def test_generate_with_a_generator_that_rejects_json_schema(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_generation

    (tmp_path / "base.jsonl").write_text("".join(json.dumps(row) + "\n" for row in GEN_BASE))
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["gen-a", "gen-b", "ver-a"],
        """
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [ver-a]
  seed: 7
  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]
  shard_size: 2
""",
        max_concurrency=4,
        max_attempts=1,
    )
    fake_llm.responder = by_model({"gen-a": _generator, "gen-b": _generator, "ver-a": lambda r: verifier_reply("PASS")})
    fake_llm.behaviours["gen-a"] = Behaviour(rejects_json_schema=True)
    fake_llm.behaviours["ver-a"] = Behaviour(rejects_json_schema=True)
    out = tmp_path / "run"
    result = run_generation(str(config), str(out))

    candidates = pd.read_parquet(out / "candidates.parquet")
    assert len(candidates) == 12 and (candidates.status == "ok").all()
    assert (candidates.generator == "gen-a").sum() == 6
    assert result.sampled > 0
    for model in ("gen-a", "ver-a"):
        calls = fake_llm.calls_for(model)
        # Only the model's first round met the 400 (max_concurrency 4), not every item.
        assert 1 <= [c["status"] for c in calls].count(400) <= 4
        assert {(c["response_format"] or {}).get("type") for c in calls if c["status"] == 200} == {"json_object"}
    assert {(c["response_format"] or {}).get("type") for c in fake_llm.calls_for("gen-b")} == {"json_schema"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["structured_output_fallbacks"] == {"gen-a": "json_object", "ver-a": "json_object"}
    assert any("gen-a: its provider rejected the structured-output mode" in note for note in manifest["notes"])

    sent = len(fake_llm.calls)
    run_generation(str(config), str(tmp_path / "again"))
    assert len(fake_llm.calls) == sent  # a re-run is served from the call cache


# ---------------------------------------------------------------- 7. endpoints


def test_endpoints_are_spelled_one_way():
    assert normalised_endpoint("HTTPS://API.Example.COM:443/v1/") == "https://api.example.com/v1"
    assert normalised_endpoint("http://LocalHost:80/v1") == "http://localhost/v1"
    assert normalised_endpoint("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080/v1"
    assert normalised_endpoint("https://user:secret@host.io/v1") == "https://host.io/v1"  # no credentials in a key
    assert normalised_endpoint("http://[::1]:9000/") == "http://[::1]:9000"


def test_the_key_holds_the_endpoint_and_the_deployment_headers_but_no_credentials():
    messages = _msg("same")
    plain = ModelConfig(model="openai/gpt-4o")
    legacy = {"v": CACHE_VERSION, "model": "openai/gpt-4o", "messages": messages, "params": {}, "schema": None}
    # A model at its provider's own endpoint keeps the key it always had.
    assert (
        request_key(plain, messages, {}, None)
        == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()
    )
    host_a = ModelConfig(model="openai/open-7b", api_base="http://host-a:8000/v1")
    host_b = ModelConfig(model="openai/open-7b", api_base="http://host-b:8000/v1")
    assert request_key(host_a, messages, {}, None) != request_key(host_b, messages, {}, None)
    same_a = ModelConfig(model="openai/open-7b", api_base="HTTP://Host-A:8000/v1/")
    assert request_key(same_a, messages, {}, None) == request_key(host_a, messages, {}, None)
    keyed = host_a.model_copy(update={"extra_headers": {"Authorization": "Bearer x", "X-Api-Key": "k"}})
    assert request_key(keyed, messages, {}, None) == request_key(host_a, messages, {}, None)
    deployment = host_a.model_copy(update={"extra_headers": {"X-Deployment": "eu-west"}})
    assert request_key(deployment, messages, {}, None) != request_key(host_a, messages, {}, None)
    assert endpoint_identity(deployment) == {
        "endpoint": "http://host-a:8000/v1",
        "headers": {"x-deployment": "eu-west"},
    }


def test_a_single_endpoint_config_keeps_its_cache_from_before_the_endpoint_joined_the_key(tmp_path, fake_llm):
    from refusalbench.tasks.llm.callcache import SQLiteCache

    fake_llm.responder = lambda request: "fresh"
    cache = SQLiteCache(str(tmp_path / "calls.sqlite"))
    one = ModelConfig(model="openai/open-7b", api_base=fake_llm.url, max_attempts=1)
    old_key = request_key(one, _msg("q"), {}, None, deployment=False)
    cache.put(old_key, {"v": CACHE_VERSION, "text": "from the old cache", "finish_reason": "stop"})
    # One deployment of the model string: the old entry serves, moved to the new key, no call.
    result = Gateway({"one": one}, cache, direct_http=True).complete("one", _msg("q"))
    assert (result.text, result.cached, len(fake_llm.calls)) == ("from the old cache", True, 0)
    assert cache.get(request_key(one, _msg("q"), {}, None)) is not None
    # Two deployments of it: the old entry could be either host's, so each host is asked.
    with ScriptedLLMServer(responder=lambda request: "host b") as host_b:
        other = ModelConfig(model="openai/open-7b", api_base=host_b.url, max_attempts=1)
        both = Gateway({"one": one, "other": other}, cache, direct_http=True)
        assert both.complete("other", _msg("q")).text == "host b" and len(host_b.calls) == 1


def test_an_endpoint_named_by_a_variable_keeps_its_cache_where_the_variable_points(tmp_path, monkeypatch):
    """Compose and the local cluster reach one model server at two addresses through one config
    (``${REFUSALBENCH_MODELS_URL:-...}``): calls go where the variable points, the key is the written form."""
    from refusalbench.tasks.llm.callcache import SQLiteCache

    cache = SQLiteCache(str(tmp_path / "calls.sqlite"))
    written = "${RB_TEST_MODELS_URL:-http://models:8080/v1}"

    def model(api_base: str) -> ModelConfig:
        return ModelConfig.model_validate({"model": "openai/open-7b", "api_base": api_base, "max_attempts": 1})

    with ScriptedLLMServer(responder=lambda r: "here") as here, ScriptedLLMServer(responder=lambda r: "there") as there:
        monkeypatch.setenv("RB_TEST_MODELS_URL", here.url)
        assert Gateway({"m": model(written)}, cache, direct_http=True).complete("m", _msg("q")).text == "here"
        monkeypatch.setenv("RB_TEST_MODELS_URL", there.url)
        moved = model(written)
        assert moved.api_base == there.url and endpoint_identity(moved) == {"endpoint": written}
        result = Gateway({"m": moved}, cache, direct_http=True).complete("m", _msg("q"))
        assert (result.text, result.cached, len(there.calls)) == ("here", True, 0)
        # Another written endpoint is another deployment, asked afresh.
        assert (
            Gateway({"m": model("${RB_TEST_MODELS_URL}")}, cache, direct_http=True).complete("m", _msg("q")).text
            == "there"
        )


def _benchmark(tmp_path, items: list[BenchmarkItem]) -> str:
    return ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", items, BenchmarkItem)


def _item(i: int, context: str | None = None) -> BenchmarkItem:
    answerable = i % 2 == 0
    return BenchmarkItem(
        item_id=f"item{i}",
        base_id=f"b{i}",
        variant="single",
        perturbation_class="P-MissingInfo",
        intensity="LOW" if answerable else "HIGH",
        lever_id="lever",
        generator="gen-a",
        question=f"What is item {i}?",
        context=context or f"The answer is ref{i}.",
        original_question="q",
        answers=[f"ref{i}"],
        expected="ANSWER_CORRECTLY" if answerable else "REFUSE_INFO_MISSING_IN_CONTEXT",
    )


def _reads_reference(request) -> str:
    for block in fenced(last_user_text(request), "context"):
        if "The answer is" in block:
            return "It is " + block.split("The answer is", 1)[1].strip(" .") + "."
    return "unknown"


def _evaluation_config(tmp_path, models: dict[str, dict], targets: list[str]) -> str:
    lines = ["models:"] + [f"  {name}: {json.dumps(fields)}" for name, fields in models.items()]
    config = tmp_path / "evaluate.yaml"
    config.write_text(
        "\n".join(lines)
        + f"""
cache:
  path: {json.dumps(str(tmp_path / "calls.sqlite"))}
evaluation:
  targets: [{", ".join(targets)}]
  judge: judge
  bootstrap: 20
  shard_size: 3
"""
    )
    return str(config)


@pytest.mark.usefixtures("prefect_harness")
def test_one_model_string_on_two_endpoints_is_two_models(tmp_path):
    from refusalbench.flows.launch import run_evaluation

    items = [_item(i) for i in range(6)]
    benchmark = _benchmark(tmp_path, items)
    with ScriptedLLMServer() as host_a, ScriptedLLMServer(responder=lambda r: "I cannot tell.") as host_b:
        host_a.responder = by_model({"open-7b": _reads_reference, "judge": judge_by_reference})
        models = {
            "host-a": {"model": "openai/open-7b", "api_base": host_a.url},
            "host-b": {"model": "openai/open-7b", "api_base": host_b.url},
            "judge": {"model": "openai/judge", "api_base": host_a.url},
        }
        config = _evaluation_config(tmp_path, models, ["host-a", "host-b"])
        run_evaluation(config, benchmark, str(tmp_path / "run"))
        assert len(host_a.calls_for("open-7b")) == len(items)  # two sets of calls ...
        assert len(host_b.calls_for("open-7b")) == len(items)
        responses = pd.read_parquet(tmp_path / "run" / "responses.parquet")
        answers = {model: set(rows.raw) for model, rows in responses.groupby("model")}
        assert answers["host-b"] == {"I cannot tell."}  # ... and two sets of answers
        assert "It is ref0." in answers["host-a"] and "I cannot tell." not in answers["host-a"]

        sent = len(host_a.calls) + len(host_b.calls)
        run_evaluation(config, benchmark, str(tmp_path / "again"))
        assert len(host_a.calls) + len(host_b.calls) == sent  # a re-run still sends nothing


# ---------------------------------------------------------------- 8. context windows


def test_windows_come_from_the_config_or_litellms_map():
    assert known_window("openai/gpt-4o") == 128000
    assert known_window(f"anthropic/{NATIVE_CLAUDE}") == 200000
    assert known_window("openai/fake") is None  # a self-hosted model LiteLLM does not know: not checked
    assert known_window("openai/deepseek-chat") is None  # another provider's entry is not this model
    assert overflow(ModelConfig(model="openai/fake"), _msg("word " * 10_000), 100) is None
    small = ModelConfig(model="openai/fake", context_window=100)
    assert overflow(small, _msg("word " * 50), 10) is None
    reason = overflow(small, _msg("word " * 200), 10)
    assert (
        reason.startswith("too_long: the prompt has 20")
        and "takes at most 90 (context window 100 less max_tokens 10)" in reason
    )


def test_a_prompt_over_the_window_is_too_long_without_a_call(fake_llm):
    gateway = _gateway(fake_llm.url, context_window=120, params={"max_tokens": 20})
    short, long = gateway.complete_many(
        [CallSpec(model="m", messages=_msg("short one")), CallSpec(model="m", messages=_msg("many words " * 100))]
    )
    assert short.ok
    assert long.outcome == "too_long" and long.error.startswith("too_long:") and long.attempts == 0
    assert [last_user_text(c) for c in fake_llm.calls] == ["short one"]
    assert gateway.stats_snapshot()["m"]["too_long"] == 1


class WindowFromFirstRequest(ScriptedLLMServer):
    """Starts a model's rate-limit window at its first request (``windows``: model -> seconds), so a
    flow's start-up, however long, does not run it down before the first call."""

    windows: dict[str, float] = {}

    def _behaviour_rejection(self, request, body, behaviour, wire, now):
        seconds = self.windows.pop(str(request.get("model")), None)
        if seconds is not None and behaviour is not None and behaviour.rate_limit is not None:
            behaviour.rate_limit.until = now + seconds
        return super()._behaviour_rejection(request, body, behaviour, wire, now)


@pytest.fixture
def windowed_llm():
    with WindowFromFirstRequest() as server:
        yield server


@pytest.mark.usefixtures("prefect_harness")
def test_evaluate_and_plan_with_limits_as_providers_set_them(tmp_path, windowed_llm):
    """One run: a target paced by a reset header, one in a 429 storm past its budget, and one whose
    window the long item does not fit; ``plan`` counts that item before the run."""
    from refusalbench.flows.launch import run_evaluation
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.refusalbench.plan.estimate import plan_run, plan_table

    long_context = "The answer is ref0. " + "Background sentence without the answer. " * 60
    items = [_item(0, long_context)] + [_item(i) for i in range(1, 6)]
    benchmark = _benchmark(tmp_path, items)
    short_tokens = prompt_tokens("openai/small", target_messages(items[1], False))
    long_tokens = prompt_tokens("openai/small", target_messages(items[0], False))
    window = (short_tokens + long_tokens) // 2 + 32  # the short items fit with max_tokens 32, the long one does not

    windowed_llm.latency_s = 0.05
    windowed_llm.responder = by_model(
        {
            "limited": _reads_reference,
            "stormy": _reads_reference,
            "small": _reads_reference,
            "judge": judge_by_reference,
        }
    )
    # 429s with only x-ratelimit-reset-requests for the 2 s after the model's first request.
    windowed_llm.behaviours["limited"] = Behaviour(rate_limit=RateLimit(form="reset_requests"))
    windowed_llm.windows = {"limited": 2.0}
    windowed_llm.behaviours["stormy"] = Behaviour(rate_limit=RateLimit(form="seconds", wait_s=1))
    plain = {"api_base": windowed_llm.url, "max_concurrency": 4, "max_attempts": 2}
    models = {
        "limited": {"model": "openai/limited", **plain},
        "stormy": {"model": "openai/stormy", **plain, "max_rate_limit_wait_s": 1.5},
        "small": {"model": "openai/small", **plain, "context_window": window, "params": {"max_tokens": 32}},
        "judge": {"model": "openai/judge", **plain},
    }
    config = _evaluation_config(tmp_path, models, ["limited", "stormy", "small"])

    plan = plan_run(load_config(config), benchmark=benchmark)
    assert plan.stages["respond"].models["small"].too_long == 1
    assert plan.stages["respond"].models["limited"].too_long == 0
    assert "small: 1 of 6" in plan_table(plan)

    out = tmp_path / "run"
    run_evaluation(config, benchmark, str(out))
    responses = pd.read_parquet(out / "responses.parquet").set_index(["model", "item_id"])

    limited = responses.loc["limited"]
    assert limited.error.isna().all() and (limited.outcome == "ok").all()
    calls = windowed_llm.calls_for("limited")
    assert max(Counter(c["fingerprint"] for c in calls).values()) == 2  # a 429, then the answer: never early
    reset = windowed_llm.behaviours["limited"].rate_limit.until
    assert all(c["time"] >= reset for c in calls if c["status"] == 200)

    stormy = responses.loc["stormy"]
    assert stormy.error.str.contains("max_rate_limit_wait_s").all()

    small = responses.loc["small"]
    assert small.loc["item0", "outcome"] == "too_long" and small.loc["item0", "error"].startswith("too_long:")
    assert (small.drop("item0").outcome == "ok").all()
    assert not any("Background sentence" in last_user_text(c) for c in windowed_llm.calls_for("small"))
    assert len(windowed_llm.calls_for("small")) == 5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calls"]["small"]["too_long"] == 1
    assert manifest["calls"]["limited"]["rate_limited"] == sum(c["status"] == 429 for c in calls) > 0
