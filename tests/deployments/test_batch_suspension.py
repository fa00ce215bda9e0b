"""A deployment's run whose batch job is still running suspends instead of waiting in its process;
the batch watcher resumes it once the job ends, and the resumed run completes from the job's results.

Real Prefect (the session's test API, a process worker started with ``--run-once``), the scripted
server's OpenAI batch API holding its job in progress until the test lets it finish.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.batch_watch import is_due, waiting_for
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from tests.deployments.test_deployments import PREFECT, PREFECT_YAML, prefect_cli, prefect_server  # noqa: F401
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, judge_by_reference


def test_a_run_goes_on_once_every_job_ended_or_one_is_past_its_wait():
    jobs = [{"job": "a"}, {"job": "b"}]
    deadlines = {"a": 100.0, "b": 200.0}
    assert not is_due(jobs, {"a"}, deadlines, now=50.0)
    assert is_due(jobs, {"a", "b"}, deadlines, now=50.0)
    assert is_due(jobs, {"b"}, deadlines, now=100.0)  # a is past its wait: the run cancels it itself
    assert not is_due(jobs, {"a"}, deadlines, now=150.0)
    assert is_due([], set(), {}, now=0.0)


def processes_of(run_id: str) -> list[int]:
    """The processes on this machine started for flow run ``run_id`` (by their environment)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"PREFECT__FLOW_RUN_ID={run_id}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def run_worker_once(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PREFECT, "worker", "start", "--pool", "refusalbench", "--type", "process", "--run-once"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def flow_run(api_url: str, run_id: str) -> dict:
    return httpx.get(f"{api_url}/flow_runs/{run_id}", timeout=10).json()


@pytest.mark.slow
def test_a_deployment_run_suspends_while_its_batch_runs_and_the_watcher_resumes_it(
    tmp_path,
    fake_llm,
    prefect_server,  # noqa: F811
):
    from refusalbench.flows.batch_watch import batch_watch_flow

    api_url, env = prefect_server
    fake_llm.responder = by_model(
        {"refuser": lambda req: "REFUSE_MISSING", "oracle": oracle, "judge": judge_by_reference}
    )
    fake_llm.batches.delay_s = 10**6  # the job stays in progress until the test lets it finish
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 2"
        for n in ("refuser", "judge")
    )
    models += f"\n  oracle:\n    model: openai/oracle\n    api_base: {fake_llm.url}\n    mode: {{respond: batch}}"
    config = tmp_path / "eval.yaml"
    cache = tmp_path / "calls.sqlite"
    config.write_text(
        f"models:\n{models}\ncache:\n  path: {cache}\n"
        "evaluation:\n  targets: [refuser, oracle]\n  judge: judge\n  bootstrap: 50\n"
    )
    benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    out = tmp_path / "run"
    prefect_cli(["work-pool", "create", "refusalbench", "--type", "process"], env)
    prefect_cli(["--no-prompt", "deploy", "--prefect-file", str(PREFECT_YAML), "--name", "evaluate"], env)
    deployment = httpx.get(f"{api_url}/deployments/name/refusalbench-evaluate/evaluate", timeout=10).json()
    # One run at a time, as the refresh deployment has: a suspended run must not keep that slot.
    patched = httpx.patch(f"{api_url}/deployments/{deployment['id']}", json={"concurrency_limit": 1}, timeout=10)
    assert patched.status_code == 204, patched.text
    triggered = prefect_cli(
        ["deployment", "run", "refusalbench-evaluate/evaluate", "--param", f"config_path={config}"]
        + ["--param", f"benchmark={benchmark}", "--param", f"out={out}"],
        env,
    )
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", triggered).group(1)

    worker = run_worker_once(env, tmp_path)  # returns once the run has left its process
    state = flow_run(api_url, run_id)["state"]
    assert (state["type"], state["name"]) == ("PAUSED", "Suspended"), (
        state,
        worker.stdout[-3000:],
        worker.stderr[-3000:],
    )
    assert processes_of(run_id) == []  # nothing runs for it while the job waits
    (job,) = fake_llm.batches.jobs
    assert [entry["job"] for entry in waiting_for(SQLiteCache(cache), run_id)] == [job.id]
    # The deployment's one slot is free while the run is suspended: another run of it could start.
    limit = httpx.get(f"{api_url}/deployments/{deployment['id']}", timeout=10).json()["global_concurrency_limit"]
    assert (limit["limit"], limit["active_slots"]) == (1, 0)

    assert batch_watch_flow() == []  # still in progress: the run stays suspended
    assert flow_run(api_url, run_id)["state"]["name"] == "Suspended"

    fake_llm.batches.delay_s = 0  # the job completes at its next look
    assert batch_watch_flow() == [run_id]
    assert flow_run(api_url, run_id)["state"]["type"] == "SCHEDULED"

    worker = run_worker_once(env, tmp_path)
    state = flow_run(api_url, run_id)["state"]
    assert state["type"] == "COMPLETED", (state, worker.stdout[-3000:], worker.stderr[-3000:])
    assert len(fake_llm.batches.jobs) == 1  # the resumed run read the job's results: no second job
    oracle_calls = [call for call in fake_llm.calls if call["model"] == "oracle"]
    assert oracle_calls and all(call.get("batch") == job.id for call in oracle_calls)
    metrics = json.loads((out / "metrics.json").read_text())["models"]
    assert metrics["oracle"]["answer_accuracy"] == 1.0
    assert set(metrics) == {"refuser", "oracle"}


@pytest.mark.slow
def test_a_refresh_round_suspends_inside_its_subflows_and_completes_once_resumed(
    tmp_path,
    fake_llm,
    prefect_server,  # noqa: F811
):
    """The refresh deployment of ``refusalbench deploy``: its batch job is sent from the evaluation,
    two subflows down; the whole round suspends and, resumed, completes in the same round folder."""
    import yaml

    from refusalbench.flows.batch_watch import batch_watch_flow
    from tests.pipeline.test_refresh_flow import write_config
    from tests.scripted import generator_reply, verifier_reply

    api_url, env = prefect_server
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req),
            "ver-a": lambda req: verifier_reply("PASS"),
            "steady": lambda req: "REFUSE_INFO_MISSING",
            "judge": judge_by_reference,
        }
    )
    fake_llm.batches.delay_s = 10**6
    config = write_config(tmp_path, fake_llm.url, ["steady"])
    spec = yaml.safe_load(config.read_text())
    spec["models"]["steady"]["mode"] = {"respond": "batch"}
    config.write_text(yaml.safe_dump(spec))
    rounds = tmp_path / "rounds"
    deployed = subprocess.run(
        [*PREFECT[:1], "-m", "refusalbench.flows.cli", "deploy", "--config", str(config), "--out", str(rounds)]
        + ["--cron", "0 4 1 1 *", "--pool", "refusalbench"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert deployed.returncode == 0, deployed.stderr
    assert "batch watcher" in deployed.stdout
    triggered = prefect_cli(["deployment", "run", "refusalbench-refresh/refresh"], env)
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", triggered).group(1)

    worker = run_worker_once(env, tmp_path)
    state = flow_run(api_url, run_id)["state"]
    assert state["name"] == "Suspended", (state, worker.stdout[-3000:], worker.stderr[-3000:])
    assert processes_of(run_id) == []
    (job,) = fake_llm.batches.jobs

    fake_llm.batches.delay_s = 0
    assert batch_watch_flow() == [run_id]
    worker = run_worker_once(env, tmp_path)
    state = flow_run(api_url, run_id)["state"]
    assert state["type"] == "COMPLETED", (state, worker.stdout[-3000:], worker.stderr[-3000:])
    assert len(fake_llm.batches.jobs) == 1
    (round_folder,) = [p for p in rounds.iterdir() if p.is_dir()]  # the same round, resumed
    metrics = json.loads((round_folder / "metrics.json").read_text())["models"]
    assert set(metrics) == {"steady"}


CRASH_WITHIN_S = 40  # the zombie automation's window here: just past the 30 s heartbeat (production: 90 s)


def runs_of_round(api_url: str, run_id: str) -> list[dict]:
    """The root flow run ``run_id`` and all its subflow runs, however deep."""
    found, parents = [flow_run(api_url, run_id)], [run_id]
    while parents:
        children = httpx.post(
            f"{api_url}/flow_runs/filter",
            json={"flow_runs": {"parent_flow_run_id": {"any_": parents}}},
            timeout=30,
        ).json()
        found += children
        parents = [child["id"] for child in children]
    return found


def crashed_states(api_url: str, runs: list[dict]) -> list[tuple[str, str | None]]:
    """(flow name, message) of every Crashed state any of ``runs`` was ever in."""
    found = []
    for run in runs:
        states = httpx.get(f"{api_url}/flow_run_states/", params={"flow_run_id": run["id"]}, timeout=30).json()
        found += [(run["name"], state["message"]) for state in states if state["type"] == "CRASHED"]
    return found


@pytest.mark.slow
def test_a_suspended_refresh_round_is_not_crashed_by_the_heartbeat_automation(
    tmp_path,
    fake_llm,
    prefect_server,  # noqa: F811
):
    """The crash automation registered (a short window): a refresh round suspended for its batch job,
    two subflows down, sends no heartbeat while it waits. Neither the root run nor its subflow runs are
    marked Crashed past the window, and the resumed run completes the same round, recorded complete.
    (About 2 min: the window must exceed Prefect's 30 s minimum heartbeat, and the test waits past it.)"""
    import time

    import yaml

    from refusalbench.deployments.automations import CRASH_AUTOMATION, RETRY_AUTOMATION
    from refusalbench.flows.batch_watch import batch_watch_flow
    from refusalbench.tasks.pipeline.refusalbench.refresh_rounds import read_records
    from tests.pipeline.test_refresh_flow import write_config
    from tests.scripted import generator_reply, verifier_reply

    api_url, env = prefect_server
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req),
            "ver-a": lambda req: verifier_reply("PASS"),
            "steady": lambda req: "REFUSE_INFO_MISSING",
            "judge": judge_by_reference,
        }
    )
    fake_llm.batches.delay_s = 10**6
    config = write_config(tmp_path, fake_llm.url, ["steady"])
    spec = yaml.safe_load(config.read_text())
    spec["models"]["steady"]["mode"] = {"respond": "batch"}
    config.write_text(yaml.safe_dump(spec))
    rounds = tmp_path / "rounds"
    registered = subprocess.run(
        [*PREFECT[:1], "-m", "refusalbench.deployments.automations", "--within", str(CRASH_WITHIN_S)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert registered.returncode == 0, registered.stderr
    try:
        deployed = subprocess.run(
            [*PREFECT[:1], "-m", "refusalbench.flows.cli", "deploy", "--config", str(config), "--out", str(rounds)]
            + ["--cron", "0 4 1 1 *", "--pool", "refusalbench"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert deployed.returncode == 0, deployed.stderr
        triggered = prefect_cli(["deployment", "run", "refusalbench-refresh/refresh"], env)
        run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", triggered).group(1)

        worker = run_worker_once(env, tmp_path)
        suspended_at = time.monotonic()
        state = flow_run(api_url, run_id)["state"]
        assert state["name"] == "Suspended", (state, worker.stdout[-3000:], worker.stderr[-3000:])
        before = runs_of_round(api_url, run_id)
        assert len(before) > 1, before  # the root and its subflows (main job, generation, evaluation)
        # Its subflow runs left their process with it: Paused, not Running without heartbeats.
        assert "RUNNING" not in [r["state"]["type"] for r in before], [(r["name"], r["state"]["name"]) for r in before]

        # Past the window (and a few rounds of Prefect's proactive trigger evaluation, every 5 s).
        deadline = suspended_at + CRASH_WITHIN_S + 20
        while time.monotonic() < deadline and not crashed_states(api_url, runs_of_round(api_url, run_id)):
            time.sleep(2)
        waited = runs_of_round(api_url, run_id)
        assert crashed_states(api_url, waited) == [], [(r["name"], r["state"]["name"]) for r in waited]
        assert flow_run(api_url, run_id)["state"]["name"] == "Suspended"
        (record,) = read_records(ArtifactStore(str(rounds)))
        assert record.status == "running"

        fake_llm.batches.delay_s = 0
        assert batch_watch_flow() == [run_id]
        worker = run_worker_once(env, tmp_path)
        state = flow_run(api_url, run_id)["state"]
        assert state["type"] == "COMPLETED", (state, worker.stdout[-3000:], worker.stderr[-3000:])
        after = runs_of_round(api_url, run_id)
        assert crashed_states(api_url, after) == []
        assert {r["state"]["type"] for r in after} == {"COMPLETED"}  # each paused subflow was taken up again
        assert len(fake_llm.batches.jobs) == 1  # the resumed round read its job's results
        (done,) = read_records(ArtifactStore(str(rounds)))  # the same round, resumed, not a second one
        assert (done.round_id, done.status, done.flow_runs) == (record.round_id, "complete", [run_id])
        metrics = json.loads((rounds / done.round_id / "metrics.json").read_text())["models"]
        assert set(metrics) == {"steady"}
    finally:  # the session's API serves other tests, whose flow runs the short window would crash
        for name in (CRASH_AUTOMATION, RETRY_AUTOMATION):
            for automation in httpx.post(
                f"{api_url}/automations/filter", json={"automations": {"name": {"any_": [name]}}}, timeout=30
            ).json():
                httpx.delete(f"{api_url}/automations/{automation['id']}", timeout=30)
