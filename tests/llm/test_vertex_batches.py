"""Vertex AI batch prediction as a batch protocol (tasks/llm/vertex_batches.py) against the scripted server's
batch prediction jobs and Cloud Storage (tasks/llm/scripted_vertex_batches.py), over real HTTP: a stage's
calls to a ``vertex_ai/`` model in ``mode: batch`` go as one job, read back as a synchronous run's values,
at the batch price; failed lines and late jobs fall back to the synchronous path; the config says where."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap

import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import (
    BATCH_PRICE_SHARE,
    BatchSettings,
    ModelConfig,
    ModelPrice,
    RunConfig,
    load_config,
)
from refusalbench.tasks.core.config_sections import VertexBatchConfig
from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.plan_prices import batch_provider, model_rates
from refusalbench.tasks.llm.scripted_server import Behaviour, ScriptedLLMServer, dry_run_responder
from refusalbench.tasks.llm.vertex_batches import KEY_LABELS, VertexBatchPrediction, VertexError

TOKEN_ENV = "REFUSALBENCH_TEST_VERTEX_TOKEN"
PRICE = ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0)
GEMINI = "gemini-2.5-flash"


class Verdict(BaseModel):
    label: str
    confidence: float


@pytest.fixture(scope="module")
def server():
    os.environ.setdefault(TOKEN_ENV, "ya29.scripted-token")
    with ScriptedLLMServer(responder=dry_run_responder) as running:
        yield running


def _vertex(server, model: str = f"vertex_ai/{GEMINI}", **batch) -> ModelConfig:
    where = VertexBatchConfig(gcs_uri="gs://rb-batches/runs", project="rb-test", storage_url=server.anthropic_url)
    settings = BatchSettings(poll_interval_s=0.05, max_wait_s=30, vertex=where).model_copy(update=batch)
    return ModelConfig(
        model=model,
        api_base=server.anthropic_url,  # the scripted server's root: Vertex AI's REST API
        api_key_env=TOKEN_ENV,
        mode="batch",
        batch=settings,
        price=PRICE,
        params={"max_tokens": 64},
        max_attempts=1,
    )


def _specs(tag: str, model: str = "gemini") -> list[CallSpec]:
    specs = [
        CallSpec(model=model, messages=[{"role": "user", "content": f"{tag} question {n}"}], stage="judge", tag=f"q{n}")
        for n in range(3)
    ]
    judged = [{"role": "system", "content": "Judge it."}, {"role": "user", "content": f"{tag} reply"}]
    specs.append(CallSpec(model=model, messages=judged, schema=Verdict, stage="judge", tag="verdict"))
    specs.append(specs[-1].model_copy(update={"tag": "again"}))  # identical: one line
    return specs


def _reply(result) -> tuple:
    return (
        result.tag,
        result.text,
        result.parsed,
        result.prompt_tokens,
        result.completion_tokens,
        result.finish_reason,
        result.served_model,
    )


def test_a_stage_s_calls_go_as_one_job_and_read_back_as_the_synchronous_run_s_values(server, tmp_path):
    jobs = len(server.vertex.jobs)
    gateway = Gateway({"gemini": _vertex(server)}, SQLiteCache(tmp_path / "batch.sqlite"))
    batch = gateway.complete_many(_specs("one job"))

    assert len(server.vertex.jobs) == jobs + 1
    job = server.vertex.jobs[-1]
    assert job.model == f"publishers/google/models/{GEMINI}" and job.id.startswith(
        "projects/rb-test/locations/us-central1/"
    )
    assert job.state() == "JOB_STATE_SUCCEEDED" and job.output_file_id.startswith("gs://rb-batches/runs/")
    # The uploaded lines: Gemini's request as LiteLLM's Vertex adapter builds it, the key in the line and its labels.
    lines = [json.loads(line) for line in server.vertex.objects[tuple(job.input_uri[5:].split("/", 1))].splitlines()]
    assert len(lines) == 4  # the identical request went once
    keys = {gateway.scope.key(gateway.models["gemini"], spec) for spec in _specs("one job")}
    assert {line["custom_id"] for line in lines} == keys
    assert all("".join(line["request"]["labels"][name] for name in KEY_LABELS) == line["custom_id"] for line in lines)
    judged = next(line["request"] for line in lines if "system_instruction" in line["request"])
    assert judged["system_instruction"] == {"parts": [{"text": "Judge it."}]}
    assert judged["generationConfig"]["response_mime_type"] == "application/json"

    assert all(r.ok and r.batch for r in batch) and batch[3].parsed.label
    answered = [c for c in server.calls if c.get("batch") == job.id]
    assert len(answered) == 4 and {c["wire"] for c in answered} == {"gemini"}

    # The same requests to a synchronous model answered by the same responder: the same values, at twice the price.
    twin = ModelConfig(model=f"openai/{GEMINI}", api_base=server.url, price=PRICE, params={"max_tokens": 64})
    sync = Gateway({"gemini": twin}, SQLiteCache(tmp_path / "sync.sqlite")).complete_many(_specs("one job"))
    assert [_reply(r) for r in batch] == [_reply(r) for r in sync]
    for b, s in zip(batch, sync):
        assert b.cost_usd == pytest.approx(s.cost_usd * BATCH_PRICE_SHARE) and b.cost_usd > 0
    calls = gateway.stats_snapshot()["gemini"]
    assert calls["batch_calls"] == 4 and calls.get("batch_fallbacks", 0) == 0
    assert calls["batch_savings_usd"] == pytest.approx(sum(s.cost_usd - b.cost_usd for b, s in zip(batch[:4], sync)))

    again = Gateway({"gemini": _vertex(server)}, SQLiteCache(tmp_path / "batch.sqlite")).complete_many(
        _specs("one job")
    )
    assert len(server.vertex.jobs) == jobs + 1  # the call cache answers: no second job
    assert all(r.cached and r.batch for r in again) and [_reply(r) for r in again] == [_reply(r) for r in batch]


def test_claude_on_vertex_goes_as_a_job_of_the_anthropic_publisher(server, tmp_path):
    server.behaviours["claude-haiku-4-5@20251001"] = Behaviour(reasoning="Thinking it over.")
    gateway = Gateway(
        {"claude": _vertex(server, "vertex_ai/claude-haiku-4-5@20251001")}, SQLiteCache(tmp_path / "c.sqlite")
    )
    results = gateway.complete_many(_specs("claude", "claude"))
    job = server.vertex.jobs[-1]
    assert job.model == "publishers/anthropic/models/claude-haiku-4-5@20251001"
    line = json.loads(server.vertex.objects[tuple(job.input_uri[5:].split("/", 1))].splitlines()[0])
    assert line["request"]["anthropic_version"] == "vertex-2023-10-16" and "model" not in line["request"]
    assert all(r.ok and r.batch for r in results)
    assert results[3].parsed.label and results[0].reasoning == "Thinking it over."


def test_an_errored_line_is_sent_synchronously(server, tmp_path):
    gateway = Gateway({"gemini": _vertex(server)}, SQLiteCache(tmp_path / "errored.sqlite"))
    specs = _specs("errored")
    failing = gateway.scope.key(gateway.models["gemini"], specs[1])
    server.batches.fail(custom_ids=[failing])
    try:
        results = gateway.complete_many(specs)
    finally:
        server.batches.clear_failures()
    job = server.vertex.jobs[-1]
    assert job.state() == "JOB_STATE_PARTIALLY_SUCCEEDED"
    bucket, folder = job.output_file_id[5:].split("/", 1)
    rows = [json.loads(row) for row in server.vertex.objects[(bucket, f"{folder}/predictions.jsonl")].splitlines()]
    assert [row["status"] != "" for row in rows if row["custom_id"] == failing] == [True]
    assert [r.batch for r in results] == [True, False, True, True, True]  # the errored one: the synchronous path's
    calls = gateway.stats_snapshot()["gemini"]
    assert calls["batch_fallbacks"] == 1 and calls["batch_calls"] == 3


def test_a_line_saying_the_prompt_is_too_long_is_too_long_not_resent(server, tmp_path):
    """Vertex AI's "exceeds the maximum number of tokens" in a line's status is the row's too_long outcome,
    as on the synchronous path: no synchronous request follows it."""
    saved = server.behaviours.get(GEMINI)
    server.behaviours[GEMINI] = Behaviour(too_long=True)
    gateway = Gateway({"gemini": _vertex(server)}, SQLiteCache(tmp_path / "too-long.sqlite"))
    try:
        results = gateway.complete_many(_specs("too long")[:3])
    finally:
        if saved is None:
            server.behaviours.pop(GEMINI, None)
        else:
            server.behaviours[GEMINI] = saved
    assert [r.error_kind for r in results] == ["too_long"] * 3
    calls = gateway.stats_snapshot()["gemini"]
    assert not calls.get("batch_fallbacks") and calls["too_long"] == 3


def test_a_job_past_its_wait_is_cancelled_and_sent_synchronously(server, tmp_path):
    server.batches.delay_s = 60.0  # never done in time
    try:
        gateway = Gateway({"gemini": _vertex(server, max_wait_s=0.3)}, SQLiteCache(tmp_path / "late.sqlite"))
        jobs = len(server.vertex.jobs)
        results = gateway.complete_many(_specs("late"))
    finally:
        server.batches.delay_s = 0.0
    late = server.vertex.jobs[jobs:]
    assert len(late) == 1 and late[0].cancelled and late[0].state() == "JOB_STATE_CANCELLED"
    assert not [c for c in server.calls if c.get("batch") == late[0].id]  # nothing of it answered
    assert not any(r.batch for r in results)
    assert gateway.stats_snapshot()["gemini"]["batch_fallbacks"] == 4


def test_another_process_reads_a_job_by_its_name_alone(server, tmp_path):
    """The ledger keeps only the job's name: a fresh protocol (a re-run after a crash) looks at it and reads
    its predictions, matched by the line's custom_id or, where Vertex AI leaves only the request, its labels."""
    gateway = Gateway({"gemini": _vertex(server)}, SQLiteCache(tmp_path / "ledger.sqlite"))
    cfg, specs = gateway.models["gemini"], _specs("ledger")[:2]
    lines = [(gateway.scope.key(cfg, spec), gateway.request(spec, cfg)) for spec in specs]
    job_id = asyncio.run(VertexBatchPrediction(cfg, lines[0][1]).submit(lines))

    fresh = VertexBatchPrediction(cfg, lines[0][1])
    state = asyncio.run(fresh.look(job_id))
    assert state.finished and state.status == "completed" and len(state.result_files) == 1
    replies = asyncio.run(fresh.results(state))
    assert set(replies) == {key for key, _ in lines}
    assert all(reply["candidates"][0]["content"]["parts"] for reply in replies.values())

    bucket, folder = state.result_files[0][5:].split("/", 1)
    rows = [json.loads(row) for row in server.vertex.objects[(bucket, f"{folder}/predictions.jsonl")].splitlines()]
    by_labels: dict = {}
    for row in rows:
        VertexBatchPrediction.read_line({k: v for k, v in row.items() if k != "custom_id"}, by_labels)
    assert by_labels == replies

    with pytest.raises(VertexError) as gone:
        asyncio.run(fresh.look(job_id.rsplit("/", 1)[0] + "/999"))
    assert fresh.unknown_job(gone.value)  # a 404: nothing will come of it, its requests go synchronously


def test_plan_prices_vertex_batches_at_the_batch_share(server):
    cfg = RunConfig(models={"gemini": _vertex(server)})
    assert batch_provider(cfg.models["gemini"])
    rates = model_rates(cfg, ["gemini"])["gemini"]
    assert rates.batch == pytest.approx((rates.sync[0] * BATCH_PRICE_SHARE, rates.sync[1] * BATCH_PRICE_SHARE))


def test_a_vertex_model_in_batch_mode_without_its_bucket_is_one_line_at_load(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            """
            models:
              gemini:
                model: vertex_ai/gemini-2.5-flash
                mode: {judge: batch}
              claude:
                model: vertex_ai/claude-haiku-4-5@20251001
                mode: batch
                batch:
                  vertex: {gcs_uri: gs://rb-batches}
              synced:
                model: vertex_ai/gemini-2.5-flash
            """
        ).lstrip(),
        encoding="utf-8",
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    lines = info.value.lines() if isinstance(info.value, InputErrors) else [str(info.value)]
    assert lines == [
        f"{path}:4: models.gemini.mode: vertex_ai/gemini-2.5-flash in mode batch needs batch.vertex "
        "(gcs_uri and project)",
        f"{path}:9: models.claude.batch.vertex: vertex_ai/claude-haiku-4-5@20251001 in mode batch needs "
        "batch.vertex.project (or params.vertex_project)",
    ]
