"""The gateway over real HTTP against the fake OpenAI-compatible server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer, last_user_text
from refusalbench.tasks.llm.transport import direct_model, direct_model_name

ROOT = Path(__file__).resolve().parents[2]


def _gateway(server, cache=None, direct: bool = True, **cfg) -> Gateway:
    settings = {"max_concurrency": 4, "max_attempts": 3, "timeout_s": 5, **cfg}
    return Gateway(
        {"m": ModelConfig(model="openai/fake", api_base=server.url, **settings)},
        cache,
        backoff_base_s=0.01,
        direct_http=direct,
    )


# The fault tests run on both paths: posted directly (the default for a self-hosted model
# behind an OpenAI-compatible api_base) and through LiteLLM (every other model).
both_paths = pytest.mark.parametrize("direct", [True, False], ids=["direct", "litellm"])


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@both_paths
def test_429_is_retried_after_the_retry_after_delay(fake_llm, direct):
    fake_llm.fail_next(2, status=429, retry_after=0.3)
    started = time.perf_counter()
    result = _gateway(fake_llm, direct=direct).complete("m", _msg("hello"))
    elapsed = time.perf_counter() - started
    assert result.ok and result.text == "echo: hello"
    assert result.attempts == 3
    assert len(fake_llm.calls) == 3
    assert elapsed >= 0.6  # two waits of Retry-After: 0.3 s


@both_paths
def test_server_errors_end_in_a_recorded_error_after_the_last_attempt(fake_llm, direct):
    fake_llm.fail_next(10, status=500)
    result = _gateway(fake_llm, direct=direct, max_attempts=3).complete("m", _msg("x"))
    assert not result.ok
    assert result.error_kind == "call_error"
    assert "500" in result.error and "after 3 attempts" in result.error
    assert result.attempts == 3
    assert len(fake_llm.calls) == 3  # the SDK's own retries are off: attempts stay bounded


@both_paths
def test_client_errors_are_not_retried(fake_llm, direct):
    fake_llm.fail_next(1, status=400)
    result = _gateway(fake_llm, direct=direct).complete("m", _msg("x"))
    assert not result.ok and result.attempts == 1 and len(fake_llm.calls) == 1


@both_paths
def test_garbled_and_empty_replies_are_retried(fake_llm, direct):
    fake_llm.fail_next(1, kind="not_json")
    fake_llm.fail_next(1, kind="empty")
    result = _gateway(fake_llm, direct=direct).complete("m", _msg("y"))
    assert result.ok and result.attempts == 3


@both_paths
def test_hung_request_times_out_and_is_retried(fake_llm, direct):
    fake_llm.hang_s = 10
    fake_llm.fail_next(1, kind="hang")
    started = time.perf_counter()
    result = _gateway(fake_llm, direct=direct, timeout_s=1).complete("m", _msg("z"))
    assert result.ok and result.attempts == 2
    assert time.perf_counter() - started < 5


def test_concurrency_never_exceeds_the_model_limit(fake_llm):
    fake_llm.latency_s = 0.1
    gateway = _gateway(fake_llm, max_concurrency=3)
    results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"q{i}")) for i in range(15)])
    assert all(r.ok for r in results)
    assert [r.text for r in results] == [f"echo: q{i}" for i in range(15)]  # input order kept
    assert fake_llm.max_inflight == 3


def test_rpm_limit_spaces_requests(fake_llm):
    gateway = _gateway(fake_llm, rpm=600)  # one start every 0.1 s
    started = time.perf_counter()
    gateway.complete_many([CallSpec(model="m", messages=_msg(f"r{i}")) for i in range(6)])
    assert time.perf_counter() - started >= 0.45


def test_identical_requests_in_a_batch_are_sent_once(fake_llm):
    fake_llm.latency_s = 0.05
    results = _gateway(fake_llm).complete_many([CallSpec(model="m", messages=_msg("same")) for _ in range(5)])
    assert len(fake_llm.calls) == 1
    assert {r.text for r in results} == {"echo: same"}


def test_second_run_is_served_from_the_cache_with_zero_http_calls(fake_llm, tmp_path):
    specs = [CallSpec(model="m", messages=_msg(f"c{i}")) for i in range(8)]
    first = _gateway(fake_llm, SQLiteCache(tmp_path / "calls.sqlite")).complete_many(specs)
    assert len(fake_llm.calls) == 8 and not any(r.cached for r in first)
    # A new gateway (as in a new process) on the same cache file.
    second = _gateway(fake_llm, SQLiteCache(tmp_path / "calls.sqlite")).complete_many(specs)
    assert len(fake_llm.calls) == 8
    assert all(r.cached for r in second)
    assert [r.text for r in second] == [r.text for r in first]


def test_failed_calls_are_not_cached(fake_llm, tmp_path):
    fake_llm.fail_next(3, status=500)
    cache = SQLiteCache(tmp_path / "calls.sqlite")
    assert not _gateway(fake_llm, cache).complete("m", _msg("f")).ok
    again = _gateway(fake_llm, cache).complete("m", _msg("f"))
    assert again.ok and not again.cached


class Verdict(BaseModel):
    verdict: str
    score: int


def test_structured_output_is_requested_and_validated(fake_llm):
    fake_llm.responder = lambda req: (
        '```json\n{"verdict": "PASS", "score": 4}\n```' if "good" in last_user_text(req) else "I think it passes."
    )
    gateway = _gateway(fake_llm)
    good = gateway.complete("m", _msg("good one"), schema=Verdict)
    bad = gateway.complete("m", _msg("bad one"), schema=Verdict)
    assert good.ok and good.parsed == Verdict(verdict="PASS", score=4)
    assert fake_llm.calls[0]["response_format"]["type"] == "json_schema"
    assert fake_llm.calls[0]["response_format"]["json_schema"]["schema"]["properties"]["score"]["type"] == "integer"
    assert not bad.ok and bad.error_kind == "parse_error" and bad.text == "I think it passes."


def test_token_and_latency_accounting(fake_llm):
    result = _gateway(fake_llm).complete("m", _msg("count these four"))
    assert result.prompt_tokens == 3 and result.completion_tokens == 4
    assert result.latency_s is not None and result.latency_s >= 0


CHILD = textwrap.dedent(
    """
    import sys
    from refusalbench.tasks.llm.callcache import SQLiteCache
    from refusalbench.tasks.core.config import ModelConfig
    from refusalbench.tasks.llm.gateway import CallSpec, Gateway
    url, cache = sys.argv[1], sys.argv[2]
    gw = Gateway({"m": ModelConfig(model="openai/fake", api_base=url, max_concurrency=1)}, SQLiteCache(cache))
    gw.complete_many([CallSpec(model="m", messages=[{"role": "user", "content": f"k{i}"}]) for i in range(20)])
    """
)


def test_cache_survives_a_killed_process(tmp_path):
    cache_file = tmp_path / "calls.sqlite"
    with ScriptedLLMServer(latency_s=0.15) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen([sys.executable, "-c", CHILD, server.url, str(cache_file)], env=env)
        deadline = time.time() + 60
        while len(server.calls) < 8 and time.time() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()
        sent_before = len(server.calls)
        cached = len(SQLiteCache(cache_file))
        assert 0 < sent_before < 20
        assert cached >= sent_before - 1  # at most the call in flight at the kill is lost
        gateway = Gateway(
            {"m": ModelConfig(model="openai/fake", api_base=server.url, max_concurrency=4)}, SQLiteCache(cache_file)
        )
        results = gateway.complete_many([CallSpec(model="m", messages=_msg(f"k{i}")) for i in range(20)])
        assert all(r.ok for r in results)
        assert len(server.calls) - sent_before == 20 - cached  # no completed call is sent again
        assert sum(r.cached for r in results) == cached


def test_direct_path_sends_what_litellm_sends_and_shares_its_cache_keys(fake_llm, tmp_path):
    fake_llm.responder = lambda req: '{"verdict": "PASS", "score": 4}'
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "judge this"}]
    for model in ("openai/fake", "hosted_vllm/org/open-model-7b"):
        for settings in (
            {"params": {"temperature": 0.0, "max_tokens": 64, "seed": 1, "stop": ["END"]}},
            {"json_schema": False},
        ):
            results = []
            for direct in (False, True):
                before = len(fake_llm.calls)
                gateway = Gateway(
                    {"m": ModelConfig(model=model, api_base=fake_llm.url, **settings)},
                    SQLiteCache(tmp_path / f"{direct}.sqlite"),
                    direct_http=direct,
                )
                results.append(gateway.complete("m", messages, schema=Verdict, top_p=0.5))
                assert len(fake_llm.calls) == before + 1
            via_litellm, posted = results
            sent_litellm, sent_direct = fake_llm.calls[-2], fake_llm.calls[-1]
            for field in ("model", "messages", "response_format", "authorization"):
                assert sent_direct[field] == sent_litellm[field], field
            assert posted.key == via_litellm.key  # a cached reply stays valid whichever path made it
            for field in ("text", "parsed", "prompt_tokens", "completion_tokens", "cost_usd", "attempts", "error"):
                assert getattr(posted, field) == getattr(via_litellm, field), field


def test_only_unpriced_self_hosted_models_with_plain_parameters_skip_litellm():
    plain = [{"role": "user", "content": "hi"}]
    assert direct_model_name("openai/qwen2.5-coder-1.5b-instruct") == "qwen2.5-coder-1.5b-instruct"
    assert (
        direct_model_name("hosted_vllm/meta-llama/Meta-Llama-3.1-8B-Instruct")
        == "meta-llama/Meta-Llama-3.1-8B-Instruct"
    )
    # OpenAI's own families (LiteLLM rewrites their parameters), priced models, other providers: LiteLLM.
    for model in (
        "openai/gpt-4o-2024-08-06",
        "openai/o4-mini-2025-04-16",
        "openai/gpt-5-custom",
        "openai/deepseek-chat",
        "anthropic/claude-sonnet-4-20250514",
        "bedrock/amazon.nova-pro-v1:0",
    ):
        assert direct_model_name(model) is None, model
    assert direct_model("openai/fake", "http://127.0.0.1:1/v1", {"temperature": 0}, plain) == "fake"
    assert direct_model("openai/fake", None, {}, plain) is None  # no endpoint
    assert direct_model("openai/fake", "http://127.0.0.1:1/v1", {"thinking": {"type": "enabled"}}, plain) is None
    assert (
        direct_model("openai/fake", "http://127.0.0.1:1/v1", {}, [{"role": "user", "content": [{"type": "text"}]}])
        is None
    )


def test_a_refused_connection_is_retried_then_recorded():
    import socket

    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    gateway = Gateway(
        {"m": ModelConfig(model="openai/fake", api_base=url, max_attempts=2, timeout_s=2)}, backoff_base_s=0.01
    )
    result = gateway.complete("m", _msg("anyone?"))
    assert not result.ok and result.attempts == 2 and "after 2 attempts" in result.error
