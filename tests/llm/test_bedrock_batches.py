"""Bedrock batch inference (tasks/llm/bedrock_batches.py) at the gateway, against the scripted server's
Bedrock control plane (tasks/llm/scripted_bedrock_batches.py) and moto's S3 server, both over real HTTP:
a stage's calls to a Claude model on Bedrock go as one model invocation job whose input and output are
in S3; the replies equal the synchronous InvokeModel route's at the batch price; an errored record is
asked again synchronously; a job past its wait is stopped. A config without the job's S3 location and
role is refused at load, and ``plan`` prices the model's batch calls at the batch share."""

from __future__ import annotations

import json
import textwrap

import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import (
    BATCH_PRICE_SHARE,
    BatchSettings,
    BedrockBatchConfig,
    ModelConfig,
    ModelPrice,
    RunConfig,
)
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.bedrock_batches import BedrockBatchInference
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.plan_prices import batch_provider, model_rates
from refusalbench.tasks.llm.scripted_server import Behaviour, ScriptedLLMServer, dry_run_responder

BUCKET = "bedrock-batches"
ROLE = "arn:aws:iam::123456789012:role/bedrock-batch"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
NOVA = "amazon.nova-pro-v1:0"
PRICE = ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0)


class Verdict(BaseModel):
    label: str
    confidence: float


@pytest.fixture(scope="module")
def aws():
    """moto's S3 server and the scripted server (Bedrock's control plane and InvokeModel), with boto3's
    endpoints and test credentials in the environment as a user's AWS setup would give them."""
    import boto3
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    s3_endpoint = f"http://{host}:{port}"
    with ScriptedLLMServer(responder=dry_run_responder) as server, pytest.MonkeyPatch.context() as env:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION_NAME": "us-east-1",
            "AWS_ENDPOINT_URL_S3": s3_endpoint,
            "AWS_ENDPOINT_URL_BEDROCK": server.anthropic_url,
        }.items():
            env.setenv(key, value)
        env.delenv("AWS_ENDPOINT_URL", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        server.bedrock_batches.s3_endpoint = s3_endpoint
        s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        server.behaviours[CLAUDE] = Behaviour(reasoning="Let me think about it first.")
        yield server, s3
    moto.stop()


def _models(server, mode: str, **batch) -> dict[str, ModelConfig]:
    where = BedrockBatchConfig(s3_uri=f"s3://{BUCKET}/jobs/", role_arn=ROLE)
    settings = BatchSettings(poll_interval_s=0.05, max_wait_s=30, bedrock=where)
    common = {
        "api_base": server.anthropic_url,  # LiteLLM posts InvokeModel to {api_base}/model/{id}/invoke
        "params": {"max_tokens": 64},
        "mode": mode,
        "batch": settings.model_copy(update=batch),
        "max_attempts": 2,
    }
    return {
        "priced": ModelConfig(model=f"bedrock/invoke/{CLAUDE}", price=PRICE, **common),
        "mapped": ModelConfig(model=f"bedrock/invoke/{CLAUDE}", extra_headers={"x-deployment": "b"}, **common),
    }


def _specs(model: str, tag: str) -> list[CallSpec]:
    specs = [
        CallSpec(
            model=model, messages=[{"role": "user", "content": f"{tag} question {n}"}], stage="respond", tag=f"q{n}"
        )
        for n in range(3)
    ]
    judged = [{"role": "system", "content": "Judge it."}, {"role": "user", "content": f"{tag} reply"}]
    specs.append(CallSpec(model=model, messages=judged, schema=Verdict, stage="judge", tag="judge"))
    specs.append(specs[-1].model_copy(update={"tag": "again"}))  # identical: one record
    return specs


def _gateway(server, tmp_path, mode: str, name: str, **batch) -> Gateway:
    return Gateway(_models(server, mode, **batch), SQLiteCache(tmp_path / f"{name}.sqlite"))


def _reply(result) -> tuple:
    return (result.tag, result.text, result.parsed, result.reasoning, result.error, result.prompt_tokens)
    # (completion tokens and finish reason are part of text equality: the same scripted reply)


def _new_jobs(server, before: int):
    return server.bedrock_batches.jobs[before:]


def test_a_stage_goes_as_one_job_through_s3_and_reads_back_as_the_sync_replies(aws, tmp_path):
    server, s3 = aws
    before = len(server.bedrock_batches.jobs)
    gw = _gateway(server, tmp_path, "batch", "batch")
    specs = _specs("priced", "equal") + _specs("mapped", "equal")
    batch = gw.complete_many(specs)
    sync = _gateway(server, tmp_path, "sync", "sync").complete_many(specs)

    jobs = _new_jobs(server, before)
    assert len(jobs) == 2 and all(job.status == "Completed" for job in jobs)  # one job per model
    assert all(job.request["modelId"] == CLAUDE and job.request["roleArn"] == ROLE for job in jobs)
    assert len(jobs[0].records) == 4  # 3 questions + the judge request once
    record = jobs[0].records[0]
    assert record["recordId"] in {r.key for r in batch}
    assert record["modelInput"]["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in record["modelInput"]  # the job names the model, not the body
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="jobs/")["Contents"]}
    for job in jobs:  # the input file, and the output where Bedrock writes it
        name = job.uri("inputDataConfig").rsplit("/", 1)[-1]
        assert f"jobs/input/{name}" in keys and f"jobs/output/{job.job_id}/{name}.out" in keys
        assert f"jobs/output/{job.job_id}/manifest.json.out" in keys

    assert all(r.ok and r.batch for r in batch) and not any(r.batch for r in sync)
    assert [_reply(r) for r in batch] == [_reply(r) for r in sync]
    assert batch[3].parsed.label and batch[0].reasoning == "Let me think about it first."
    for b, s in zip(batch, sync):  # the config's price and LiteLLM's map, each at the batch share
        assert s.cost_usd > 0 and b.cost_usd == pytest.approx(s.cost_usd * BATCH_PRICE_SHARE)
    answered = [c for c in server.calls if c.get("batch") in {job.arn for job in jobs}]
    assert len(answered) == 8 and all(c["wire"] == "bedrock" and c["model"] == CLAUDE for c in answered)
    stats = gw.stats_snapshot()
    assert stats["priced"]["batch_calls"] == 4 and stats["priced"]["deduplicated"] == 1

    again = _gateway(server, tmp_path, "batch", "batch").complete_many(specs)  # the same cached values
    assert len(server.bedrock_batches.jobs) == before + 2
    assert all(r.cached and r.batch for r in again) and [_reply(r) for r in again] == [_reply(r) for r in batch]


def test_a_claude_model_on_the_converse_route_batches_its_invoke_body(aws, tmp_path):
    server, _ = aws
    cfg = _models(server, "batch")["priced"].model_copy(update={"model": f"bedrock/converse/{CLAUDE}"})
    before = len(server.bedrock_batches.jobs)
    results = Gateway({"converse": cfg}, SQLiteCache(tmp_path / "converse.sqlite")).complete_many(
        _specs("converse", "converse")
    )
    (job,) = _new_jobs(server, before)
    assert job.request["modelId"] == CLAUDE and all("anthropic_version" in r["modelInput"] for r in job.records)
    assert all(r.ok and r.batch for r in results) and results[3].parsed.label


def test_a_nova_stage_goes_as_one_job_and_reads_back_as_its_synchronous_twins(aws, tmp_path):
    server, _ = aws
    batched = _models(server, "batch")["priced"].model_copy(update={"model": f"bedrock/{NOVA}", "price": None})
    converse = batched.model_copy(update={"mode": "sync"})  # the paper's model string: LiteLLM's Converse route
    invoke = batched.model_copy(update={"mode": "sync", "model": f"bedrock/invoke/{NOVA}"})
    before = len(server.bedrock_batches.jobs)
    results = Gateway({"nova": batched}, SQLiteCache(tmp_path / "nova.sqlite")).complete_many(_specs("nova", "nova"))
    (job,) = _new_jobs(server, before)
    assert job.status == "Completed" and job.request["modelId"] == NOVA and len(job.records) == 4
    first, judged = job.records[0]["modelInput"], job.records[3]["modelInput"]
    assert "anthropic_version" not in first and first["inferenceConfig"]["maxTokens"] == 64
    assert first["messages"] == [{"role": "user", "content": [{"text": "nova question 0"}]}]
    assert judged["system"] == [{"text": "Judge it."}]  # the schema rides as LiteLLM's JSON tool
    assert [t["toolSpec"]["name"] for t in judged["toolConfig"]["tools"]] == ["json_tool_call"]
    answered = [c for c in server.calls if c.get("batch") == job.arn]
    assert len(answered) == 4 and all(c["model"] == NOVA for c in answered)
    assert set(answered[3]["response_format"]["json_schema"]["schema"]["properties"]) == {"label", "confidence"}

    assert all(r.ok and r.batch for r in results) and isinstance(results[3].parsed, Verdict)
    sync = Gateway({"nova": converse}, SQLiteCache(tmp_path / "converse.sqlite")).complete_many(_specs("nova", "nova"))
    assert not any(r.batch for r in sync) and [_reply(r) for r in results] == [_reply(r) for r in sync]
    for b, s in zip(results, sync):  # LiteLLM's price of Nova Pro, at the batch share
        assert s.cost_usd > 0 and b.cost_usd == pytest.approx(s.cost_usd * BATCH_PRICE_SHARE)
    # The synchronous InvokeModel route the records' bodies come from answers the text calls alike (LiteLLM's
    # invoke route leaves a JSON tool's reply as a tool call, so the schema call is compared on Converse only).
    plain = Gateway({"nova": invoke}, SQLiteCache(tmp_path / "invoke.sqlite")).complete_many(_specs("nova", "nova")[:3])
    assert [_reply(r) for r in plain] == [_reply(r) for r in results[:3]]


def test_an_errored_record_is_asked_again_synchronously(aws, tmp_path):
    server, _ = aws
    gw = _gateway(server, tmp_path, "batch", "errored")
    specs = _specs("priced", "errored")
    failing = gw.scope.key(gw.models["priced"], specs[1])
    server.batches.fail(custom_ids=[failing])
    before = len(server.bedrock_batches.jobs)
    try:
        results = gw.complete_many(specs)
    finally:
        server.batches.clear_failures()
    (job,) = _new_jobs(server, before)
    assert job.status == "PartiallyCompleted"
    assert all(r.ok for r in results) and [r.batch for r in results] == [True, False, True, True, True]
    resent = [c for c in server.calls if c.get("fingerprint") and not c.get("batch") and c["time"] >= job.created_at]
    assert len(resent) == 1 and resent[0]["messages"][-1]["content"] == "errored question 1"
    assert gw.stats_snapshot()["priced"]["batch_fallbacks"] == 1
    twin = _gateway(server, tmp_path, "sync", "errored-twin").complete_many(specs)
    assert [_reply(r) for r in results] == [_reply(r) for r in twin]


def test_a_record_saying_the_prompt_is_too_long_is_too_long_not_resent(aws, tmp_path):
    """Bedrock's error for a prompt over the window, in a record of the job, is the row's too_long outcome,
    as on the synchronous path: no synchronous request follows it."""
    server, _ = aws
    saved = server.behaviours[CLAUDE]
    server.behaviours[CLAUDE] = Behaviour(too_long=True)
    before = len(server.bedrock_batches.jobs)
    gw = _gateway(server, tmp_path, "batch", "too-long")
    try:
        results = gw.complete_many(_specs("priced", "too long")[:3])
    finally:
        server.behaviours[CLAUDE] = saved
    (job,) = _new_jobs(server, before)
    assert [r.error_kind for r in results] == ["too_long"] * 3
    assert not [c for c in server.calls if c.get("fingerprint") and not c.get("batch") and c["time"] >= job.created_at]
    assert not gw.stats_snapshot()["priced"].get("batch_fallbacks")


def test_a_job_past_its_wait_is_stopped_and_sent_synchronously(aws, tmp_path):
    server, _ = aws
    server.bedrock_batches.delay_s = 60.0  # never done in time
    before = len(server.bedrock_batches.jobs)
    try:
        gw = _gateway(server, tmp_path, "batch", "late", max_wait_s=0.3)
        results = gw.complete_many(_specs("priced", "late"))
    finally:
        server.bedrock_batches.delay_s = 0.0
    (job,) = _new_jobs(server, before)
    assert job.status == "Stopped" and job.looks >= 2
    assert all(r.ok and not r.batch for r in results)
    assert not [c for c in server.calls if c.get("batch") == job.arn]  # nothing answered twice
    assert gw.stats_snapshot()["priced"]["batch_fallbacks"] == 4


def test_a_job_bedrock_does_not_know_is_not_polled_again(aws, tmp_path):
    server, _ = aws
    import botocore.exceptions

    cfg = _models(server, "batch")["priced"]
    protocol = BedrockBatchInference(
        cfg, Gateway({"m": cfg}, SQLiteCache(tmp_path / "c.sqlite")).request(_specs("m", "x")[0], cfg)
    )
    with pytest.raises(botocore.exceptions.ClientError) as info:
        protocol.client("bedrock").get_model_invocation_job(
            jobIdentifier="arn:aws:bedrock:us-east-1:1:model-invocation-job/gone"
        )
    assert protocol.unknown_job(info.value)
    assert not protocol.unknown_job(ConnectionError("network down"))


def test_a_bedrock_model_in_batch_mode_needs_its_s3_location_and_role(tmp_path):
    from refusalbench.tasks.core.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            models:
              claude:
                model: bedrock/{CLAUDE}
                mode: {{judge: batch}}
                batch: {{max_wait_s: 600}}
            """
        )
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}:5: models.claude.mode: claude (bedrock/{CLAUDE}) in mode: batch needs batch.bedrock (s3_uri "
        "and role_arn: Bedrock batch inference reads and writes its files in S3 as that IAM role)"
    )
    path.write_text(
        path.read_text().replace(
            "batch: {max_wait_s: 600}",
            f"batch: {{bedrock: {{s3_uri: 's3://{BUCKET}/jobs/', role_arn: '${{REFUSALBENCH_TEST_ROLE:-{ROLE}}}'}}}}",
        )
    )
    assert load_config(path).models["claude"].batch.bedrock.role_arn == ROLE  # the variable's default


def test_plan_prices_a_bedrock_model_s_batch_calls_at_the_batch_share():
    where = BatchSettings(bedrock=BedrockBatchConfig(s3_uri=f"s3://{BUCKET}/jobs/", role_arn=ROLE))
    deepseek = ModelConfig(model="bedrock/us.deepseek.r1-v1:0", mode="batch")  # no S3 needed: sent synchronously
    models = {
        "claude": ModelConfig(model=f"bedrock/converse/{CLAUDE}"),
        "nova": ModelConfig(model="bedrock/us.amazon.nova-pro-v1:0", mode="batch", batch=where),
        "premier": ModelConfig(model="bedrock/us.amazon.nova-premier-v1:0", mode="batch", batch=where),
        "deepseek": deepseek,
    }
    cfg = RunConfig(models=models)
    # The jobs take Claude and Nova models; AWS's batch inference does not list DeepSeek-R1.
    assert [name for name, m in models.items() if batch_provider(m)] == ["claude", "nova", "premier"]
    for name in ("claude", "nova", "premier"):
        rates = model_rates(cfg, [name])[name]
        assert rates.sync[0] > 0, name
        assert rates.batch == pytest.approx((rates.sync[0] * BATCH_PRICE_SHARE, rates.sync[1] * BATCH_PRICE_SHARE))
        assert json.dumps(rates.batch)  # plain floats
