"""Batch mode at the gateway (tasks/llm/batch_calls.py) against the scripted server's batch APIs
(tasks/llm/scripted_batches.py), through LiteLLM's real adapters: OpenAI files + batches (a priced
OpenAI model through LiteLLM, an unpriced one on the direct path) and Anthropic message batches."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import BatchSettings, ModelConfig, ModelPrice
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.scripted_server import Behaviour, ScriptedLLMServer, dry_run_responder

KEY_ENV = "REFUSALBENCH_TEST_BATCH_KEY"
PRICE = ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0)
FAST = BatchSettings(poll_interval_s=0.05, max_wait_s=30)


class Verdict(BaseModel):
    label: str
    confidence: float


@pytest.fixture(scope="module")
def server():
    os.environ.setdefault(KEY_ENV, "sk-test")
    with ScriptedLLMServer(responder=dry_run_responder) as running:
        running.behaviours["claude-haiku-4-5"] = Behaviour(reasoning="Let me think about it first.")
        yield running


def _models(server, mode: str, **batch) -> dict[str, ModelConfig]:
    common = {"mode": mode, "batch": FAST.model_copy(update=batch), "max_attempts": 2}
    return {
        "gpt": ModelConfig(model="openai/gpt-4o-mini", api_base=server.url, price=PRICE, **common),
        "claude": ModelConfig(
            model="anthropic/claude-haiku-4-5",
            api_base=server.anthropic_url,
            api_key_env=KEY_ENV,
            params={"max_tokens": 64},
            **common,
        ),
        "local": ModelConfig(model="openai/scripted-local", api_base=server.url, **common),
    }


def _specs(models: list[str], tag: str) -> list[CallSpec]:
    specs = []
    for model in models:
        for n in range(3):
            specs.append(
                CallSpec(
                    model=model,
                    messages=[{"role": "user", "content": f"{tag} question {n}"}],
                    stage="respond",
                    tag=f"{model}-{n}",
                )
            )
        specs.append(
            CallSpec(
                model=model,
                messages=[{"role": "system", "content": "Judge it."}, {"role": "user", "content": f"{tag} reply"}],
                schema=Verdict,
                stage="judge",
                tag=f"{model}-judge",
            )
        )
        specs.append(specs[-1].model_copy(update={"tag": f"{model}-again"}))  # identical: sent once
    return specs


def _gateway(server, tmp_path, mode: str, name: str, **batch) -> Gateway:
    return Gateway(_models(server, mode, **batch), SQLiteCache(tmp_path / f"{name}.sqlite"))


def _reply(result) -> tuple:
    return (
        result.model,
        result.tag,
        result.text,
        result.parsed,
        result.reasoning,
        result.error,
        result.prompt_tokens,
        result.completion_tokens,
        result.finish_reason,
        result.served_model,
    )


def test_batch_replies_equal_the_sync_run_at_the_batch_price(server, tmp_path):
    specs = _specs(["gpt", "claude", "local"], "equal")
    jobs = len(server.batches.jobs)
    batch_gw = _gateway(server, tmp_path, "batch", "batch")
    seen = []
    batch = batch_gw.complete_many(specs, on_result=seen.append)
    assert len(server.batches.jobs) == jobs + 3  # one job per model
    assert [r.tag for r in seen] == [s.tag for s in specs]
    sync = _gateway(server, tmp_path, "sync", "sync").complete_many(specs)

    assert [_reply(r) for r in batch] == [_reply(r) for r in sync]
    assert all(r.ok and r.batch for r in batch) and not any(r.batch for r in sync)
    assert batch[3].parsed.label and batch[5].reasoning == "Let me think about it first."
    for b, s in zip(batch, sync):
        if b.model == "gpt":  # the config's price: half of it by default
            assert b.cost_usd == pytest.approx(s.cost_usd / 2) and b.cost_usd > 0
        elif b.model == "claude":  # LiteLLM's map
            assert b.cost_usd == pytest.approx(s.cost_usd / 2) and b.cost_usd > 0  # no *_batches price: half
        else:
            assert b.cost_usd is None and s.cost_usd is None  # unpriced either way
    items = [c for c in server.calls if c.get("batch")]
    assert {c["model"] for c in items} >= {"gpt-4o-mini", "claude-haiku-4-5", "scripted-local"}

    stages = batch_gw.stage_snapshot()
    assert stages["respond"]["gpt"]["batch_calls"] == 3 and stages["judge"]["gpt"]["batch_calls"] == 1
    savings = sum(s.cost_usd - b.cost_usd for b, s in zip(batch, sync) if b.model == "gpt" and b.tag != "gpt-again")
    gpt_savings = sum(stages[stage]["gpt"]["batch_savings_usd"] for stage in ("respond", "judge"))
    assert gpt_savings == pytest.approx(savings)
    assert batch_gw.stats_snapshot()["gpt"]["deduplicated"] == 1

    again = _gateway(server, tmp_path, "batch", "batch").complete_many(specs)  # the cache answers: no job
    assert len(server.batches.jobs) == jobs + 3
    assert all(r.cached and r.batch for r in again) and [_reply(r) for r in again] == [_reply(r) for r in batch]


def test_a_delayed_batch_is_polled_until_it_completes(server, tmp_path):
    jobs = len(server.batches.jobs)
    server.batches.delay_s = 60.0  # in progress until the test lets the jobs complete

    def complete_once_polled() -> None:  # each job looked at twice while in progress, then it completes
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            len(server.batches.jobs) == jobs + 2 and all(job.looks >= 2 for job in server.batches.jobs[jobs:])
        ):
            time.sleep(0.02)
        server.batches.delay_s = 0.0

    releaser = threading.Thread(target=complete_once_polled, daemon=True)
    releaser.start()
    try:
        results = _gateway(server, tmp_path, "batch", "delayed").complete_many(_specs(["gpt", "claude"], "delayed"))
    finally:
        releaser.join(30)
        server.batches.delay_s = 0.0
    assert all(r.ok and r.batch for r in results)
    assert all(job.looks >= 3 and job.outcomes for job in server.batches.jobs[jobs:])


@pytest.mark.parametrize("kind", ["errored", "expired"])
def test_requests_the_batch_failed_are_sent_synchronously(server, tmp_path, kind):
    gw = _gateway(server, tmp_path, "batch", f"partial-{kind}")
    specs = _specs(["gpt", "claude"], f"partial {kind}")
    failing = [gw.scope.key(gw.models[s.model], s) for s in (specs[0], specs[2], specs[5 + 1])]
    server.batches.fail(custom_ids=failing, kind=kind)
    try:
        results = gw.complete_many(specs)
    finally:
        server.batches.clear_failures()
    assert all(r.ok for r in results)
    assert [r.batch for r in results].count(False) == 3
    assert [_reply(r) for r in results] == [
        _reply(r) for r in _gateway(server, tmp_path, "sync", f"twin-{kind}").complete_many(specs)
    ]
    calls = gw.stats_snapshot()
    assert calls["gpt"]["batch_fallbacks"] == 2 and calls["claude"]["batch_fallbacks"] == 1
    assert calls["gpt"]["batch_calls"] == 2 and calls["claude"]["batch_calls"] == 3


def test_a_rerun_after_a_crash_mid_poll_polls_the_same_job(server, tmp_path):
    specs = _specs(["gpt", "claude"], "crash")
    server.batches.delay_s = 60.0  # the first process dies while its jobs run
    first = _gateway(server, tmp_path, "batch", "crash")

    def dying_process() -> None:
        try:
            first.complete_many(specs)
        except BaseException:  # its event loop is closed under it: the call dies, as the process would
            pass

    waiting = threading.Thread(target=dying_process, daemon=True)
    jobs = len(server.batches.jobs)
    waiting.start()
    deadline = time.monotonic() + 10
    # Polled once: both jobs are in the ledger (written before the first look).
    while (
        len(server.batches.jobs) < jobs + 2 or not all(job.looks for job in server.batches.jobs[jobs:])
    ) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(server.batches.jobs) == jobs + 2
    first._loop.close()  # the crash: every coroutine of that gateway is gone mid-poll
    waiting.join(5)

    server.batches.delay_s = 0.0
    results = _gateway(server, tmp_path, "batch", "crash").complete_many(specs)  # same call cache
    assert len(server.batches.jobs) == jobs + 2  # no second job: the ledger named the first
    assert all(r.ok and r.batch for r in results)
    answered = [c for c in server.calls if c.get("batch") in {job.id for job in server.batches.jobs[jobs:]}]
    assert len(answered) == 8  # each distinct request answered (and billed) once


def test_a_batch_past_its_wait_is_cancelled_and_sent_synchronously(server, tmp_path):
    server.batches.delay_s = 60.0  # never done in time
    try:
        gw = _gateway(server, tmp_path, "batch", "late", max_wait_s=0.2)
        jobs = len(server.batches.jobs)
        results = gw.complete_many(_specs(["gpt", "claude"], "late"))
    finally:
        server.batches.delay_s = 0.0
    assert all(r.ok and not r.batch for r in results)
    late = server.batches.jobs[jobs:]
    assert len(late) == 2 and all(kind == "canceled" for job in late for kind, _, _ in job.outcomes.values())
    assert not [c for c in server.calls if c.get("batch") in {job.id for job in late}]  # nothing answered twice
    calls = gw.stats_snapshot()
    assert calls["gpt"]["batch_fallbacks"] == 4 and calls["claude"]["batch_fallbacks"] == 4


def test_waiting_elsewhere_leaves_a_running_job_to_the_provider_and_a_second_gateway_reads_it(tmp_path):
    """``wait_elsewhere``: the jobs still running after their first look fail their requests with
    ``BatchWaiting`` (naming them, already in the ledger); once they end, a new gateway on the same
    call cache reads their results instead of sending them again."""
    from refusalbench.tasks.llm.batch_calls import BatchWaiting, wait_elsewhere
    from refusalbench.tasks.llm.batch_watch import ended_jobs, record_waiting, waiting_for

    os.environ.setdefault(KEY_ENV, "sk-test")
    with ScriptedLLMServer(responder=dry_run_responder) as held:
        held.batches.delay_s = 10**6
        specs = _specs(["gpt", "claude"], "held")
        wait_elsewhere(True)
        try:
            with pytest.raises(BatchWaiting) as waiting:
                _gateway(held, tmp_path, "batch", "held").complete_many(specs)
        finally:
            wait_elsewhere(False)
        jobs = waiting.value.jobs
        assert sorted(job["job"] for job in jobs) == sorted(job.id for job in held.batches.jobs)
        assert len(jobs) == 2 and all(job.looks == 1 for job in held.batches.jobs)  # looked at once, not polled

        later = _gateway(held, tmp_path, "batch", "held")
        record_waiting(later.cache, "run-1", jobs)
        assert [job["job"] for job in waiting_for(later.cache, "run-1")] == [job["job"] for job in jobs]
        assert asyncio.run(ended_jobs(later, jobs)) == set()
        held.batches.delay_s = 0
        assert asyncio.run(ended_jobs(later, jobs)) == {job["job"] for job in jobs}
        results = later.complete_many(specs)
        assert all(result.error is None for result in results)
        assert len(held.batches.jobs) == 2  # read from the ended jobs: none sent again


def test_a_batch_line_saying_the_prompt_is_too_long_is_too_long_not_resent(server, tmp_path):
    """A result line whose error is the provider's "prompt too long" (OpenAI's context_length_exceeded in its
    error file, Anthropic's "prompt is too long" errored result) is the row's too_long outcome, as on the
    synchronous path: no synchronous request follows it."""
    saved = dict(server.behaviours)
    for model in ("gpt-4o-mini", "claude-haiku-4-5"):
        server.behaviours[model] = Behaviour(too_long=True)
    gw = _gateway(server, tmp_path, "batch", "too-long")
    specs = [s for s in _specs(["gpt", "claude"], "too long") if s.schema_ is None]
    before = len(server.calls)
    try:
        results = gw.complete_many(specs)
    finally:
        server.behaviours.clear()
        server.behaviours.update(saved)
    assert [r.error_kind for r in results] == ["too_long"] * len(specs)
    assert "context length" in results[0].error.lower() and "prompt is too long" in results[-1].error
    sent = server.calls[before:]
    assert sent and all(c.get("batch") for c in sent)  # each asked once, in its batch; none again synchronously
    calls = gw.stats_snapshot()
    assert not calls["gpt"].get("batch_fallbacks") and not calls["claude"].get("batch_fallbacks")
    assert calls["gpt"]["too_long"] == 3 and calls["claude"]["too_long"] == 3
