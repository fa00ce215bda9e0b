"""Embedding requests through the run's gateway (tasks/llm/embedding_calls.py) are calls of their model like
its chat calls: they take the model's limits (rpm here; a 429's pause shared through Redis with every
gateway) and are counted and priced in the gateway's accounting under the stage ``embed``."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from refusalbench.tasks.core.config import ModelConfig, ModelPrice
from refusalbench.tasks.knowornot.stages.embeddings import make_embedder
from refusalbench.tasks.llm.gateway import Gateway

PRICE = ModelPrice(input_per_mtok=130.0, output_per_mtok=0.0)


def embedder(gateway: Gateway, batch_size: int = 2):
    return make_embedder("api", model=gateway.models["m"], model_name="m", access=gateway, batch_size=batch_size)


def test_embedding_requests_keep_the_model_s_rpm_with_its_chat_calls_and_are_priced(fake_llm):
    cfg = ModelConfig(model="openai/m", api_base=fake_llm.url, rpm=120, price=PRICE, max_attempts=1)
    gateway = Gateway({"m": cfg})
    assert gateway.complete("m", [{"role": "user", "content": "first"}]).ok
    vectors = embedder(gateway).embed(["one text", "two texts here", "three"])  # two requests
    assert gateway.complete("m", [{"role": "user", "content": "last"}]).ok
    assert vectors.shape[0] == 3
    starts = [call["time"] for call in fake_llm.calls]
    assert [call["wire"] for call in fake_llm.calls][1:3] == ["embeddings", "embeddings"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # 60 / rpm apart, chat and embedding requests alike (each start paced; its arrival as late as a thread hop)
    assert min(gaps) >= 0.35 and starts[-1] - starts[0] >= 3 * 0.5 - 0.1, gaps

    counted = gateway.stage_snapshot()["embed"]["m"]
    billed = sum(call["billed"]["prompt_tokens"] for call in fake_llm.calls if call["wire"] == "embeddings")
    assert counted["http_calls"] == 2 and counted["prompt_tokens"] == billed > 0
    assert counted["cost_usd"] == pytest.approx(billed * 130.0 / 1e6)


def test_an_unpriced_embedding_model_counts_unpriced_requests_never_zero(fake_llm):
    gateway = Gateway({"m": ModelConfig(model="openai/m", api_base=fake_llm.url)})
    embedder(gateway).embed(["a text"])
    counted = gateway.stage_snapshot()["embed"]["m"]
    assert counted["unpriced_calls"] == 1 and "cost_usd" not in counted


def test_an_embedding_request_s_429_pauses_the_model_s_chat_calls_in_another_gateway(fake_llm, redis_url):
    cfg = ModelConfig(model="openai/m", api_base=fake_llm.url, max_attempts=1)
    first, second = (Gateway({"m": cfg}, limits_url=redis_url, lease_s=5) for _ in range(2))
    message = [{"role": "user", "content": "warm"}]
    assert first.complete("m", message).ok and second.complete("m", message).ok
    fake_llm.fail_next(1, status=429, retry_after=1.5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        embedded = pool.submit(embedder(first).embed, ["limited text"])
        deadline = time.monotonic() + 10
        while not any(c["status"] == 429 for c in fake_llm.calls):
            assert time.monotonic() < deadline, "the embedding request was never sent"
            time.sleep(0.01)
        time.sleep(0.3)  # the pause reaches Redis and the other gateway's subscriber
        refused = next(c["time"] for c in fake_llm.calls if c["status"] == 429)
        assert second.complete("m", [{"role": "user", "content": "after"}]).ok
        assert embedded.result().shape[0] == 1
    after = next(c["time"] for c in fake_llm.calls if c["messages"] and c["messages"][-1]["content"] == "after")
    assert after >= refused + 1.5
