"""Crash recovery, the fast parts: which round a refresh run resumes, round.json, the automations'
definitions, and a process that ends with its parent (tests/deployments/test_cluster_recovery.py kills real workers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.refusalbench.refresh_rounds import (
    MAX_ATTEMPTS,
    RoundRecord,
    choose_round,
    fail_round_of,
    finish_round,
    read_records,
    start_round,
)


def record(round_id: str, run: str | None, status: str = "running", seed: int = 1, attempts: int = 1) -> RoundRecord:
    return RoundRecord(round_id, seed, run, "2026-01-01T00:00:00+00:00", status=status, attempts=attempts)


def test_choose_round_resumes_own_then_latest_dead_round():
    alive = {"live"}.__contains__
    rounds = [
        record("round-1", "old-dead"),
        record("round-2", "dead"),
        record("round-3", "live"),
        record("round-0", "x", status="complete"),
    ]
    # The same flow run started again resumes its own round, whatever else there is, even one it completed
    # (a run marked Crashed for missed heartbeats while it went on working).
    assert choose_round(rounds, "live", None, alive).resume.round_id == "round-3"
    assert choose_round(rounds, "x", None, alive).resume.round_id == "round-0"
    # A new run resumes the latest round whose run is over; the older dead one is closed.
    choice = choose_round(rounds, "new", None, alive)
    assert choice.resume.round_id == "round-2"
    assert [(r.round_id, why.startswith("not resumed: a later round")) for r, why in choice.abandon] == [
        ("round-1", True)
    ]
    # A round whose run may still come back (live) is neither resumed nor closed.
    assert all(r.round_id != "round-3" for r, _ in choice.abandon)
    # A seed given by hand resumes only a round of that seed.
    assert choose_round(rounds, "new", 7, alive).resume is None
    assert choose_round([record("round-2", "dead", seed=7)], "new", 7, alive).resume.round_id == "round-2"


def test_choose_round_does_not_resume_a_round_older_than_an_ended_one():
    rounds = [record("round-1", "dead"), record("round-2", "done", status="complete")]
    choice = choose_round(rounds, "new", None, lambda run: False)
    assert choice.resume is None
    ((closed, why),) = choice.abandon
    assert closed.round_id == "round-1" and "round-2" in why


def test_choose_round_gives_up_after_max_attempts():
    choice = choose_round([record("round-1", "dead", attempts=MAX_ATTEMPTS)], "new", None, lambda run: False)
    assert choice.resume is None
    ((closed, why),) = choice.abandon
    assert closed.round_id == "round-1" and f"{MAX_ATTEMPTS} attempts" in why


def test_start_resume_finish_and_fail_rounds(tmp_path):
    out = str(tmp_path / "rounds")
    first = start_round(out, None, flow_run_id="run-a", owner_alive=lambda run: False)
    doc = json.loads((tmp_path / "rounds" / first.round_id / "round.json").read_text())
    assert doc["status"] == "running" and doc["flow_run_id"] == "run-a" and doc["seed"] == first.seed
    assert doc["started_at"] and doc["finished_at"] is None and first.round_id.endswith(f"-s{first.seed}")

    again = start_round(out, None, flow_run_id="run-a", owner_alive=lambda run: True)  # the same run, retried
    assert (again.round_id, again.seed, again.attempts) == (first.round_id, first.seed, 2)
    taken = start_round(out, None, flow_run_id="run-b", owner_alive=lambda run: False)  # the next run, run-a dead
    assert (taken.round_id, taken.attempts, taken.flow_runs) == (first.round_id, 3, ["run-a", "run-b"])
    finish_round(out, taken)
    (done,) = read_records(ArtifactStore(out))
    assert done.status == "complete" and done.finished_at

    fresh = start_round(out, 5, flow_run_id="run-c", owner_alive=lambda run: False)
    assert fresh.round_id != first.round_id and fresh.seed == 5 and fresh.attempts == 1
    assert fail_round_of(out, "run-c", "boom").round_id == fresh.round_id
    statuses = {r.round_id: (r.status, r.reason) for r in read_records(ArtifactStore(out))}
    assert statuses[fresh.round_id] == ("failed", "boom")


def test_automations_follow_prefects_zombie_recipe_and_bound_retries():
    from refusalbench.deployments.automations import crash_automation, parse_args, retry_automation

    crash = crash_automation(60)
    assert crash.trigger.posture == "Proactive" and crash.trigger.within.total_seconds() == 60
    assert crash.trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Crashed"} <= crash.trigger.expect
    assert crash.actions[0].state.value == "CRASHED"
    retry = retry_automation(2)
    assert retry.trigger.expect == {"prefect.flow-run.Crashed"}
    assert retry.trigger.match.get("prefect.run-count") == ["1", "2"]  # the third crash stays crashed
    roles = [spec.get("prefect.resource.role") for spec in retry.trigger.match_related]
    assert roles == [["deployment"], ["tag"]]  # deployment runs only: a subflow run has no worker to retry it
    action = retry.actions[0]
    assert (action.state.value, action.name, action.force) == ("SCHEDULED", "AwaitingRetry", True)
    assert parse_args([]).within == 90 and parse_args(["--retries", "1"]).retries == 1


CHILD = textwrap.dedent("""
    import os, sys, time
    os.environ["PREFECT__FLOW_RUN_ID"] = "test"
    from refusalbench.tasks.pipeline.process_guard import follow_parent
    print(follow_parent(interval_s=0.1), flush=True)
    time.sleep(60)
""")
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)  # as Prefect starts a flow run: its own session
    print(child.pid, child.stdout.readline().strip(), flush=True)
    time.sleep(60)
""")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_flow_process_ends_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    pid, how = parent.stdout.readline().split()
    assert how == ("prctl" if sys.platform.startswith("linux") else "watchdog")
    parent.kill()  # SIGKILL: the parent gets no chance to clean up
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not alive(int(pid)):
            return
        time.sleep(0.1)
    os.kill(int(pid), signal.SIGKILL)
    raise AssertionError("the child outlived its parent")


def test_guard_is_off_outside_a_worker_started_flow_run():
    code = "from refusalbench.tasks.pipeline.process_guard import follow_parent; print(follow_parent())"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT__FLOW_RUN_ID"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None", done.stderr


def test_importing_the_flows_starts_no_guard_but_each_flow_and_the_cli_do():
    """The guard is installed where a worker-started process begins running (each flow's first statement, the
    CLI's entry), never as a side effect of importing ``flows`` (a test or a tool importing it is left alone)."""
    import ast
    from pathlib import Path

    code = (
        "import refusalbench.flows, refusalbench.flows.evaluation, refusalbench.flows.refresh, refusalbench.flows.cli\n"
        "from refusalbench.tasks.pipeline import process_guard\nprint(process_guard._armed)\n"
        "from refusalbench.flows.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(process_guard._armed)\n"
    )
    env = {**os.environ, "PREFECT__FLOW_RUN_ID": "test"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "None" and lines[-1] in ("prctl", "watchdog"), (done.stdout, done.stderr)
    flows = Path(__file__).resolve().parents[2] / "flows"
    seen = []
    for path in flows.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                "flow" in ast.unparse(d).split("(")[0] for d in node.decorator_list
            ):
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                assert ast.unparse(body[0]) == "follow_parent()", (path.name, node.name)
                seen.append(node.name)
    assert sorted(seen) == sorted(
        ["refresh_flow", "evaluation_flow", "main_flow", "generation_flow", "pretest_flow", "batch_watch_flow"]
        + ["contamination_flow", "knowornot_flow"]
    ), seen


def test_deployments_send_heartbeats_and_write_no_workspace_manifest():
    """Every deployment's job variables: heartbeats for the zombie automation, and Prefect's engine command
    (without a command the process worker writes the run's environment to workspace.json on its disk)."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "deployments" / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        variables = deployment["work_pool"]["job_variables"]
        assert variables["command"] == "python -m prefect.engine", deployment["name"]
        assert int(variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]) >= 30, deployment["name"]
    register = (root / "deployments" / "register.sh").read_text()
    assert "python -m refusalbench.deployments.automations" in register


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_next_refresh_run_resumes_a_crashed_round_from_the_cache(tmp_path, fake_llm):
    """A round left running by a dead flow run is resumed by the next run: same round, same seed,
    and no call sent again (every call of the round had finished and is in the cache)."""
    from refusalbench.flows.launch import run_refresh
    from tests.pipeline.test_generation_flow import BASE
    from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply

    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "tgt": lambda req: "REFUSE_INFO_MISSING",
            "judge": judge_by_reference,
        }
    )
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 2"
        for n in ["gen-a", "ver-a", "tgt", "judge"]
    )
    config = tmp_path / "refresh.yaml"
    config.write_text(
        f"models:\n{models}\ncache:\n  path: {tmp_path / 'calls.sqlite'}\ngeneration:\n"
        "  base_set: base.jsonl\n  generators: [gen-a]\n  verifiers: [ver-a]\n  base_sample: 3\n"
        "  strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM]\n"
        "evaluation:\n  targets: [tgt]\n  judge: judge\n  bootstrap: 50\n"
    )
    out = tmp_path / "rounds"
    first = run_refresh(str(config), str(out), seed=11)
    calls = len(fake_llm.calls)
    # As a crashed run leaves it: still running, owned by a flow run that is over.
    path = out / first.round / "round.json"
    path.write_text(
        json.dumps(
            {**json.loads(path.read_text()), "status": "running", "flow_run_id": "dead-run", "finished_at": None}
        )
    )
    again = run_refresh(str(config), str(out))
    assert (again.round, again.seed) == (first.round, 11)
    assert len(fake_llm.calls) == calls  # the cache answered every call of the resumed round
    record = json.loads(path.read_text())
    assert record["status"] == "complete" and record["attempts"] == 2 and record["flow_runs"][-1] != "dead-run"
    assert [p.name for p in out.iterdir()] == [first.round]
