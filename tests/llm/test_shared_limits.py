"""A model's max_concurrency, rpm and 429 pause hold across processes (issue 25, item 3).

Two gateway processes call two models on the scripted server through a real redis-server
(``limits.backend: redis``): ``shared`` with max_concurrency 4, ``paced`` with an rpm. The
server's own record says what a provider would see: the peak of requests in flight
(``peak_inflight``) and the busiest window of requests (``busiest_window``). The same two
processes with ``limits.backend: process`` exceed both, so the test can tell the difference.

rpm is the issue's 120, checked over 5-second windows instead of minutes so the test takes
seconds: a minute's budget of ``rpm`` plus one burst becomes 120 / 12 + 1 = 11 requests. (At
higher rates over shorter windows the test would measure the machine's scheduling lag, which on
a busy CI machine bunches requests by a few hundred milliseconds, more than the limiter.)
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refusalbench.tasks.core.config import ModelConfig, RunConfig, load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

ROOT = Path(__file__).resolve().parents[2]

# One process of a run: warms up (imports, connection, subscription), says "ready", waits for a
# line on stdin, then sends its calls ({model: how many}) at once and prints their errors.
PROCESS = """
import json, sys
from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.llm.gateway import CallSpec, gateway_for

config, name, calls = RunConfig.model_validate(json.loads(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3])
gateway = gateway_for(config)
assert gateway.complete("warm", [{"role": "user", "content": "warm-up " + name}]).ok
print("ready", flush=True)
sys.stdin.readline()
specs = [CallSpec(model=model, messages=[{"role": "user", "content": f"{name} {i}"}])
         for model, count in calls.items() for i in range(count)]
print(json.dumps([r.error for r in gateway.complete_many(specs)]), flush=True)
"""

RPM, WINDOW_S = 120, 5.0
BUDGET = RPM * WINDOW_S / 60 + 1  # rpm + one burst, scaled from a minute to the window


def run_config(server: ScriptedLLMServer, redis_url: str, backend: str, lease_s: float = 30.0) -> dict:
    model = {"api_base": server.url, "max_attempts": 1, "timeout_s": 60}
    models = {"shared": {"max_concurrency": 4}, "paced": {"rpm": RPM, "max_concurrency": 16}, "warm": {}}
    return {
        "models": {name: {"model": f"openai/{name}", **model, **limits} for name, limits in models.items()},
        "cache": {"backend": "none"},
        "limits": {"backend": backend, "url": redis_url, "lease_s": lease_s},
    }


def start(config: dict, *names: str, calls: dict[str, int]) -> list[subprocess.Popen]:
    """One process per name, started together; returned once every one is ready."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, json.dumps(config), name, json.dumps(calls)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    for process in processes:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()[-2000:]
    return processes


def go(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()


def finish(process: subprocess.Popen) -> list:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    errors = json.loads(out.strip().splitlines()[-1])
    assert errors == [None] * len(errors)
    return errors


def senders(server: ScriptedLLMServer, model: str) -> list[str]:
    """Which process sent each request to ``model``, in the order they arrived."""
    return [c["messages"][-1]["content"].split()[0] for c in sorted(server.calls_for(model), key=lambda c: c["time"])]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["redis", "process"])
def test_two_processes_keep_to_one_max_concurrency_and_rpm(fake_llm, redis_url, backend):
    fake_llm.latency_s = 0.2
    processes = start(run_config(fake_llm, redis_url, backend), "first", "second", calls={"shared": 16, "paced": 8})
    fake_llm.calls.clear()
    go(*processes)
    for process in processes:
        finish(process)
    concurrency, busiest = fake_llm.peak_inflight("shared"), fake_llm.busiest_window(WINDOW_S, "paced")
    if backend == "process":  # each process keeps its own limits: the provider sees twice both
        assert concurrency == 8 and busiest > BUDGET
        return
    assert concurrency == 4  # never more than max_concurrency in flight at the provider
    assert busiest <= BUDGET
    # The processes take turns (the queue is first come, first served): both are served from the start.
    order = senders(fake_llm, "shared")
    assert len(order) == 32 and min(order[:16].count("first"), order[:16].count("second")) >= 4
    # Paced requests go round the processes: each turn goes to the process next in line, not to
    # whichever of its many waiting requests happens to ask first.
    paced = senders(fake_llm, "paced")
    assert set(paced[:4]) == {"first", "second"}
    assert min(paced[:8].count("first"), paced[:8].count("second")) >= 2


@pytest.mark.slow
def test_a_killed_holder_blocks_the_other_process_no_longer_than_its_lease(fake_llm, redis_url):
    lease_s = 2.0
    config = run_config(fake_llm, redis_url, "redis", lease_s=lease_s)
    fake_llm.hang_s = 4.0
    holder, waiter = start(config, "holder", "waiter", calls={"shared": 4})
    fake_llm.calls.clear()
    fake_llm.fail_next(4, kind="hang")  # the holder's four requests hang: it holds every slot
    go(holder)
    deadline = time.monotonic() + 20
    while len(fake_llm.calls_for("shared")) < 4:
        assert time.monotonic() < deadline, "the holder's requests did not arrive"
        time.sleep(0.02)
    go(waiter)
    time.sleep(0.5)
    assert senders(fake_llm, "shared") == ["holder"] * 4  # the waiter is held back
    holder.send_signal(signal.SIGKILL)
    killed = time.time()
    holder.wait(10)
    finish(waiter)
    waited = min(c["time"] for c in fake_llm.calls_for("shared") if c["messages"][-1]["content"].startswith("waiter"))
    # The holder renewed its leases until it died; they ran out within lease_s, then the waiter went.
    assert killed + 0.5 <= waited <= killed + lease_s + 1.5


def test_a_429_pauses_the_model_in_every_process(fake_llm, redis_url):
    """Two gateways (each its own participant, as two processes are): one meets a 429 asking for
    1.5 s; the other's next request waits it out too."""
    import redis

    cfg = ModelConfig(model="openai/paused", api_base=fake_llm.url, max_attempts=1)
    first, second = (Gateway({"m": cfg}, limits_url=redis_url, lease_s=5) for _ in range(2))
    message = [{"role": "user", "content": "warm"}]
    assert first.complete("m", message).ok and second.complete("m", message).ok
    fake_llm.fail_next(1, status=429, retry_after=1.5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        retried = pool.submit(first.complete, "m", [{"role": "user", "content": "limited"}])
        client, deadline = redis.Redis.from_url(redis_url), time.monotonic() + 10
        while not any(client.hget(key, "paused_until") for key in client.keys("refusalbench:limits:*:pace")):
            assert time.monotonic() < deadline, "the 429's pause never reached Redis"
            time.sleep(0.01)
        time.sleep(0.1)  # the published pause reaches the other gateway's subscriber
        refused = next(c["time"] for c in fake_llm.calls if c["status"] == 429)
        assert second.complete("m", [{"role": "user", "content": "after"}]).ok  # sent at once, or it waits?
        assert retried.result().ok
    after = next(c["time"] for c in fake_llm.calls if c["messages"][-1]["content"] == "after")
    assert time.time() - refused < 5 and after >= refused + 1.5


def test_a_dead_process_in_the_paced_line_holds_the_others_up_no_longer_than_its_grace(fake_llm, redis_url):
    """A process that took its place in a paced model's line and died never asks again: the
    live one waits behind it until its place lapses (the turn it waited for, plus the grace)."""
    import redis

    from refusalbench.tasks.llm import limit_scripts
    from refusalbench.tasks.llm.shared_limits import PREFIX, TURN_GRACE_S, limits_ident

    cfg = ModelConfig(model="openai/paced-line", api_base=fake_llm.url, rpm=20, max_attempts=1)
    gateway = Gateway({"m": cfg}, limits_url=redis_url)
    assert gateway.complete("m", [{"role": "user", "content": "first"}]).ok  # the next turn is 3 s on
    channel = f"{PREFIX}{{{limits_ident(cfg)}}}"
    pace = redis.Redis.from_url(redis_url).register_script(limit_scripts.PACE)
    admitted, wait, _ = pace(
        keys=[f"{channel}:{part}" for part in ("pace", "turns", "turn-lease")],
        args=[3.0, 0, 0, "dead-process", TURN_GRACE_S],
    )
    asked = time.time()
    assert admitted == 0 and 0 < float(wait) <= 3.0  # it heads the line, and then it dies
    assert gateway.complete("m", [{"role": "user", "content": "after"}]).ok
    after = next(c["time"] for c in fake_llm.calls if c["messages"][-1]["content"] == "after")
    lapsed = asked + float(wait) + TURN_GRACE_S
    assert lapsed - 0.3 <= after <= lapsed + 2.0


def test_one_process_alone_pays_no_round_trip_per_call(fake_llm, redis_url):
    """Slots granted once are handed from call to call while nobody else waits."""
    import redis

    client = redis.Redis.from_url(redis_url)
    cfg = ModelConfig(model="openai/alone", api_base=fake_llm.url, max_concurrency=8)
    gateway = Gateway({"m": cfg}, limits_url=redis_url)
    client.config_resetstat()
    results = gateway.complete_many(
        [CallSpec(model="m", messages=[{"role": "user", "content": f"q{i}"}]) for i in range(200)]
    )
    assert all(r.ok for r in results) and fake_llm.max_inflight <= 8
    scripts = sum(stats["calls"] for name, stats in client.info("commandstats").items() if "eval" in name)
    assert scripts <= 10


def test_where_limits_are_counted(tmp_path):
    def limits(**sections) -> str | None:
        config = RunConfig.model_validate(sections)
        return config.limits.shared_url(config.cache.backend, config.cache.url)

    assert limits() is None  # the embedded default: each process counts its own, no service needed
    assert limits(cache={"backend": "redis", "url": "redis://cache:6379/0"}) == "redis://cache:6379/0"
    assert limits(cache={"backend": "redis", "url": "redis://c/0"}, limits={"backend": "process"}) is None
    assert limits(limits={"backend": "redis", "url": "redis://limits/1"}) == "redis://limits/1"
    path = tmp_path / "run.yaml"
    path.write_text("models: {}\nlimits:\n  backend: redis\n")
    with pytest.raises(InputError) as problem:
        load_config(path)
    assert "limits.backend redis needs limits.url or cache.url" in str(problem.value) and ":3" in str(problem.value)


# ---------------------------------------------------------------- the local cluster: two runs on the workers


def write_benchmark(path: Path, run: str, count: int) -> str:
    """``count`` items whose questions name ``run`` (each run's requests are its own: no shared cache hit)."""
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

    items = [
        BenchmarkItem(
            item_id=f"{run}{i}",
            base_id=f"{run}-b{i}",
            variant="single",
            perturbation_class="P-MissingInfo",
            intensity="LOW",
            lever_id="lever",
            generator="gen",
            question=f"{run}: what is item {i}?",
            context=f"Item {i} is described here; the answer is ref{i}.",
            original_question="q",
            answers=[f"ref{i}"],
            expected="REFUSE_INFO_MISSING_IN_CONTEXT",
        )
        for i in range(count)
    ]
    return ArtifactStore(path).write_records("benchmark.parquet", items, BenchmarkItem)


@pytest.mark.cluster
@pytest.mark.slow
def test_two_evaluation_runs_on_the_workers_keep_to_one_max_concurrency(local_cluster, tmp_path):
    """Two evaluate deployment runs at once on the cluster's workers, one target with
    max_concurrency 4. The config shares its call cache in Redis, so its limits are shared there
    too (``limits.backend: auto``): the scripted provider never sees more than 4 in flight."""
    cluster = local_cluster
    with ScriptedLLMServer(
        latency_s=0.3,
        responder=lambda request: (
            '{"quality": 1, "rationale": ""}' if request["model"] == "judge" else "I cannot answer: REFUSE_MISSING"
        ),
    ) as server:
        config = tmp_path / "limits.yaml"
        config.write_text(f"""name: shared-limits
models:
  target: {{model: openai/target, api_base: {server.url}, max_concurrency: 4, max_attempts: 2}}
  judge: {{model: openai/judge, api_base: {server.url}, max_concurrency: 16, max_attempts: 2}}
cache: {{backend: redis, url: "${{REFUSALBENCH_REDIS_URL}}"}}
evaluation: {{targets: [target], judge: judge, bootstrap: 50}}
""")
        runs = {
            run: cluster.trigger(
                "refusalbench-evaluate/evaluate",
                {
                    "config_path": str(config),
                    "benchmark": write_benchmark(tmp_path / run, run, 60),
                    "out": f"s3://{cluster.bucket}/shared-limits/{run}",
                },
            )
            for run in ("first", "second")
        }
        for run_id in runs.values():
            finished = cluster.wait_for(run_id, timeout_s=300)
            assert finished["state_type"] == "COMPLETED", cluster.run_logs(run_id)[-20:]
        target = sorted(server.calls_for("target"), key=lambda c: c["time"])
        assert len(target) == 120
        assert server.peak_inflight("target") <= 4
        # The runs overlapped (else the limit was never put to the test): each sent while the other did.
        by_run = {run: [c["time"] for c in target if c["messages"][-1]["content"].count(f"{run}:")] for run in runs}
        overlap = min(max(by_run["first"]), max(by_run["second"])) - max(min(by_run["first"]), min(by_run["second"]))
        assert overlap > 2.0, by_run
