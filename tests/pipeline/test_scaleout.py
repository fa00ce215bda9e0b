"""Scale-out: artifacts on S3 (moto's server), a shared Redis call cache (a real
redis-server), and task-level distribution on a local Dask cluster.

Every test runs the real evaluation flow against scripted models on the fake
OpenAI-compatible server and compares with the embedded defaults (local folder,
SQLite cache, thread runner): scaling out must not change a single number.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from refusalbench.flows.results import EvaluationResult
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, judge_by_reference

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["refuser", "answerer", "oracle"]
SCRIPT = {
    "refuser": lambda req: "I cannot answer: **REFUSE_MISSING**",
    "answerer": lambda req: "I believe it is something.",
    "oracle": oracle,
    "judge": judge_by_reference,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(path: Path, url: str, *, cache: str, runner: str = "thread") -> Path:
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {url}\n    max_attempts: 2" for n in [*TARGETS, "judge"]
    )
    path.write_text(f"""
models:
{models}
cache:
{cache}
runner: {runner}
evaluation:
  targets: [{", ".join(TARGETS)}]
  judge: judge
  bootstrap: 200
  shard_size: 4
""")
    return path


def sqlite_cache(path: Path) -> str:
    return f"  path: {path}"


@pytest.fixture
def benchmark(tmp_path) -> str:
    return ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)


def run_eval(config: Path, benchmark: str, out: str) -> EvaluationResult:
    from refusalbench.flows.launch import run_evaluation

    return run_evaluation(str(config), benchmark, out)


def comparable_judgments(frame: pd.DataFrame) -> list[dict]:
    """Judgment rows without timing; sorted so runner scheduling order does not matter."""
    keep = [c for c in frame.columns if c not in ("latency_s",)]
    return frame[keep].sort_values(["model", "item_id"]).astype(str).to_dict("records")


# ---------------------------------------------------------------- S3 (moto)


@pytest.fixture
def s3_bucket(monkeypatch):
    """moto's S3 server on a free loopback port, credentials and endpoint in the env."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("REFUSALBENCH_S3_ENDPOINT", raising=False)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="refusalbench-test")
    try:
        yield client, "refusalbench-test"
    finally:
        server.stop()


def test_s3_out(tmp_path, fake_llm, benchmark, s3_bucket):
    client, bucket = s3_bucket
    fake_llm.responder = by_model(SCRIPT)
    config = write_config(tmp_path / "eval.yaml", fake_llm.url, cache=sqlite_cache(tmp_path / "calls.sqlite"))

    local = tmp_path / "local"
    run_eval(config, benchmark, str(local))
    result = run_eval(config, benchmark, f"s3://{bucket}/runs/eval")

    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="runs/eval/")["Contents"]}
    for name in ("metrics.json", "report.html", "responses.parquet", "judgments.parquet", "manifest.json"):
        assert f"runs/eval/{name}" in keys
    # Prefect's task results live beside the artifacts, in the bucket too.
    assert any(k.startswith("runs/eval/_prefect/") for k in keys)
    assert result.metrics == f"s3://{bucket}/runs/eval/metrics.json"
    assert result.report == f"s3://{bucket}/runs/eval/report.html"

    remote = json.loads(client.get_object(Bucket=bucket, Key="runs/eval/metrics.json")["Body"].read())
    assert remote["models"] == json.loads((local / "metrics.json").read_text())["models"]
    assert set(remote["models"]) == set(TARGETS)
    store = ArtifactStore(f"s3://{bucket}/runs/eval")
    assert len(store.read_frame("responses.parquet")) == len(ITEMS) * len(TARGETS)
    report = store.read_text("report.html")
    assert all(name in report for name in TARGETS)
    # The second run was served from the call cache: the scripted server saw one set of calls.
    assert len(fake_llm.calls_for("refuser")) == len(ITEMS)


# ---------------------------------------------------------------- Redis (real redis-server)


def redis_cache(url: str) -> str:
    return f"  backend: redis\n  url: {url}"


def test_redis_cache(tmp_path, fake_llm, benchmark, redis_url):
    import redis

    fake_llm.responder = by_model(SCRIPT)
    config = write_config(tmp_path / "eval.yaml", fake_llm.url, cache=redis_cache(redis_url))
    first = tmp_path / "first"
    run_eval(config, benchmark, str(first))
    calls = len(fake_llm.calls)
    assert calls > 0
    # Every completed call is in Redis (10 items x 3 targets, and one judge call per reply: the judge
    # classifies every reply that is not a bare code, and none is), beside the models' shared limits
    # (limits.backend auto: counted where the cache is shared).
    assert len(redis.Redis.from_url(redis_url).keys("refusalbench:call:*")) == calls == 2 * len(ITEMS) * len(TARGETS)

    # Another run folder (so Prefect's task cache cannot help): everything from Redis.
    second = tmp_path / "second"
    run_eval(config, benchmark, str(second))
    assert len(fake_llm.calls) == calls
    assert (
        json.loads((second / "metrics.json").read_text())["models"]
        == json.loads((first / "metrics.json").read_text())["models"]
    )
    assert pd.read_parquet(second / "responses.parquet")["cached"].all()


GATEWAY_SCRIPT = """
import json, sys
from refusalbench.tasks.llm.callcache import open_cache
from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.gateway import CallSpec, Gateway

url, api_base = sys.argv[1], sys.argv[2]
models = {name: ModelConfig(model="openai/" + name, api_base=api_base, max_attempts=2) for name in ("refuser", "oracle")}
gateway = Gateway(models, open_cache("redis", url=url))
specs = [CallSpec(model=m, messages=[{"role": "user", "content": f"<context>The answer is x{i}.</context> Q{i}?"}])
         for m in models for i in range(5)]
print(json.dumps([[r.text, r.cached, r.error] for r in gateway.complete_many(specs)]))
"""


def test_redis_cache_shared_across_processes(tmp_path, fake_llm, redis_url):
    """Two gateways in two processes (two 'machines'): the second makes no HTTP call."""
    fake_llm.responder = by_model(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def run_process() -> list:
        done = subprocess.run(
            [sys.executable, "-c", GATEWAY_SCRIPT, redis_url, fake_llm.url],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run_process()
    assert len(fake_llm.calls) == 10
    assert not any(cached for _, cached, _ in first)
    second = run_process()
    assert len(fake_llm.calls) == 10  # no new HTTP call
    assert all(cached for _, cached, _ in second)
    assert [text for text, _, _ in second] == [text for text, _, _ in first]
    assert all(error is None for _, _, error in first + second)


# ---------------------------------------------------------------- Dask (local cluster, process workers)


def test_dask_runner(tmp_path, fake_llm, benchmark, monkeypatch):
    """Same flow on a 2-process Dask cluster: identical metrics and judgments to threads."""
    monkeypatch.setenv("REFUSALBENCH_DASK_WORKERS", "2")
    fake_llm.responder = by_model(SCRIPT)
    threads_cfg = write_config(tmp_path / "threads.yaml", fake_llm.url, cache=sqlite_cache(tmp_path / "threads.sqlite"))
    dask_cfg = write_config(
        tmp_path / "dask.yaml", fake_llm.url, cache=sqlite_cache(tmp_path / "dask.sqlite"), runner="dask"
    )
    run_eval(threads_cfg, benchmark, str(tmp_path / "threads"))
    thread_calls = len(fake_llm.calls)
    run_eval(dask_cfg, benchmark, str(tmp_path / "dask"))
    # A separate call cache: the Dask run really called the models, from its worker processes.
    assert len(fake_llm.calls) == 2 * thread_calls

    def metrics(folder: str) -> dict:
        return json.loads((tmp_path / folder / "metrics.json").read_text())["models"]

    assert metrics("dask") == metrics("threads")
    judged = {f: comparable_judgments(pd.read_parquet(tmp_path / f / "judgments.parquet")) for f in ("threads", "dask")}
    assert judged["dask"] == judged["threads"]
    manifests = {f: json.loads((tmp_path / f / "manifest.json").read_text()) for f in ("threads", "dask")}
    assert manifests["dask"]["status"] == "completed"
    # Call accounting is collected from the worker processes, where the calls were made (the judge
    # classifies all 30 replies: none is a bare code).
    http_calls = {f: {m: c.get("http_calls", 0) for m, c in manifests[f]["calls"].items()} for f in manifests}
    assert http_calls["dask"] == http_calls["threads"] == {"refuser": 10, "answerer": 10, "oracle": 10, "judge": 30}
