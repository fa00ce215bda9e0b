"""A provider's batch API is the class its profile names (tasks/llm/batch_protocol.py): a registered profile
with a protocol of its own is used by a batch-mode run (against the scripted server's OpenAI batch API), and
``plan``'s prices ask the profile whether a model batches and the protocol what the batch price is."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from refusalbench.tasks.core.config import BATCH_PRICE_SHARE, BatchSettings, ModelConfig, ModelPrice, RunConfig
from refusalbench.tasks.llm.batch_protocol import BatchRequest, JobState
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.openai_batches import OpenAIBatches
from refusalbench.tasks.llm.plan_prices import batch_provider, model_rates
from refusalbench.tasks.llm.providers import PROVIDERS, ProviderProfile, register_provider
from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer, dry_run_responder

PREFIX = "acme_batches"
NO_BATCHES = "acme_sync"


class RecordingBatches(OpenAIBatches):
    """OpenAI's batch API under another provider's name, recording what the batch path asked of it."""

    price_share = 0.25
    asked: list[tuple[str, Any]] = []

    def litellm_provider(self, cfg: ModelConfig) -> str:
        return "openai"  # LiteLLM knows no acme_batches: its files + batches calls go as OpenAI's

    async def submit(self, lines: Sequence[tuple[str, BatchRequest]]) -> str:
        job_id = await super().submit(lines)
        self.asked.append(("submit", (job_id, sorted(custom_id for custom_id, _ in lines))))
        return job_id

    async def look(self, job_id: str) -> JobState:
        state = await super().look(job_id)
        self.asked.append(("look", (job_id, state.status)))
        return state


@pytest.fixture()
def acme() -> Iterator[None]:
    @register_provider(PREFIX)
    class AcmeBatches(ProviderProfile):
        """An OpenAI-format server whose batch API is spoken by RecordingBatches."""

        direct_http = True
        batch_protocol = RecordingBatches

    @register_provider(NO_BATCHES)
    class AcmeSync(ProviderProfile):
        """The same server without a batch API the gateway speaks."""

        direct_http = True

    RecordingBatches.asked = []
    try:
        yield
    finally:
        PROVIDERS.remove(PREFIX)
        PROVIDERS.remove(NO_BATCHES)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer(responder=dry_run_responder) as running:
        yield running


def _specs(model: str) -> list[CallSpec]:
    return [
        CallSpec(
            model=model, messages=[{"role": "user", "content": f"acme question {n}"}], stage="judge", tag=f"{model}-{n}"
        )
        for n in range(3)
    ]


def test_a_registered_profile_s_own_protocol_carries_a_batch_mode_run(acme, server, tmp_path):
    settings = {"mode": "batch", "batch": BatchSettings(poll_interval_s=0.05, max_wait_s=30), "api_base": server.url}
    models = {
        "acme": ModelConfig(model=f"{PREFIX}/scripted-acme", **settings),
        "plain": ModelConfig(model=f"{NO_BATCHES}/scripted-acme", **settings),
    }
    jobs = len(server.batches.jobs)
    gateway = Gateway(models, SQLiteCache(tmp_path / "calls.sqlite"))
    results = gateway.complete_many(_specs("acme") + _specs("plain"))

    assert all(r.ok for r in results)
    assert [r.batch for r in results] == [True] * 3 + [False] * 3  # no protocol: sent synchronously
    assert len(server.batches.jobs) == jobs + 1  # one job, the acme model's, through its protocol
    submitted = [what for kind, what in RecordingBatches.asked if kind == "submit"]
    assert len(submitted) == 1 and submitted[0][0] == server.batches.jobs[-1].id
    assert submitted[0][1] == sorted(gateway.scope.key(models["acme"], spec) for spec in _specs("acme"))
    assert ("look", (submitted[0][0], "completed")) in RecordingBatches.asked
    calls = gateway.stats_snapshot()
    assert calls["acme"]["batch_calls"] == 3 and calls["plain"].get("batch_calls", 0) == 0


def test_plan_prices_ask_the_profile_and_its_protocol(acme):
    price = ModelPrice(input_per_mtok=4.0, output_per_mtok=8.0)
    cfg = RunConfig(
        models={
            "acme": ModelConfig(model=f"{PREFIX}/scripted-acme", price=price),
            "plain": ModelConfig(model=f"{NO_BATCHES}/scripted-acme", price=price),
            "claude": ModelConfig(model="anthropic/claude-haiku-4-5", price=price),
            "azure": ModelConfig(model="azure/gpt-4o", price=price),
        }
    )
    assert [batch_provider(m) for m in cfg.models.values()] == [True, False, True, False]
    rates = model_rates(cfg, list(cfg.models))
    sync = (4.0 / 1e6, 8.0 / 1e6)
    assert rates["acme"].sync == sync and rates["acme"].batch == pytest.approx((1.0 / 1e6, 2.0 / 1e6))  # its 0.25
    assert rates["claude"].batch == pytest.approx((sync[0] * BATCH_PRICE_SHARE, sync[1] * BATCH_PRICE_SHARE))
