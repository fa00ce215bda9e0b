"""Embedded mode: commands share one local Prefect API server per PREFECT_HOME, started by the
first of them, which retires once unused (tasks/pipeline/local_api.py, tasks/pipeline/local_api_server.py)."""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.scripted import by_model, run_config

ROOT = Path(__file__).resolve().parent.parent
SERVER_MODULE = b"refusalbench.tasks.pipeline.local_api_server"


def api_servers() -> set[int]:
    """Processes serving the shared local API (any PREFECT_HOME)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if SERVER_MODULE in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def embedded_env(home: Path, idle_s: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(home), REFUSALBENCH_PREFECT_API_IDLE_S=idle_s)
    env.pop("PREFECT_API_URL", None)
    return env


def entry_of(home: Path) -> dict | None:
    path = home / "refusalbench-api" / "server.json"
    return json.loads(path.read_text()) if path.exists() else None


def knowornot_config(tmp_path: Path, fake_llm) -> Path:
    pairs = [{"id": f"p{i}", "question": f"What is item {i}?", "answer": f"Item {i} is a thing."} for i in range(4)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    fake_llm.responder = by_model({"tgt": lambda r: "It is a thing.",
                                   "eval": lambda r: "Fine. <abstained>no</abstained> <tier>tier_1</tier>"})
    return run_config(tmp_path, fake_llm.url, ["tgt", "eval"], """
        knowornot:
          qa_pairs: qa.jsonl
          targets: [tgt]
          evaluator: eval
          retrieval: [direct, long_context]
          prompts: [basic]
          filters: []
          embedder: hashing
          label_sample: 0
        """)


def test_commands_share_one_server_which_retires_once_unused(tmp_path, fake_llm):
    config = knowornot_config(tmp_path, fake_llm)
    home = tmp_path / "prefect-home"
    env = embedded_env(home, idle_s="8")  # longer than the gap between the two commands, even on a slow machine
    before = api_servers()

    def knowornot(out: str) -> None:
        done = subprocess.run([sys.executable, "-m", "refusalbench.flows.cli", "knowornot", "run", "--config", str(config),
                               "--out", str(tmp_path / out)], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert (tmp_path / out / "report.html").exists()

    knowornot("run1")
    first = entry_of(home)
    assert first is not None and first["pid"] in api_servers() - before  # still up after the command ended
    assert first["url"].startswith("http://127.0.0.1:")
    knowornot("run2")
    assert entry_of(home) == first  # the second command found it: no second server
    assert api_servers() - before == {first["pid"]}
    # Both flow runs went to that server, on the project-local database.
    with sqlite3.connect(home / "prefect.db") as db:
        runs = db.execute("SELECT flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id").fetchall()
    assert runs == [("refusalbench-knowornot", "COMPLETED")] * 2
    # Nobody uses it now: it exits after its idle time and forgets itself.
    assert wait_for(lambda: first["pid"] not in api_servers(), timeout_s=60)
    assert entry_of(home) is None


def test_commands_started_together_start_one_server(tmp_path):
    home = tmp_path / "prefect-home"
    script = ("import os\nfrom refusalbench.tasks.pipeline.local_api import start_embedded_api, wait_until_ready\n"
              "start_embedded_api(); wait_until_ready(); print(os.environ['PREFECT_API_URL'])")
    before = api_servers()
    procs = [subprocess.Popen([sys.executable, "-c", script], env=embedded_env(home, idle_s="0"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    urls = {out.strip() for out, _ in outputs}
    assert len(urls) == 1, urls  # two servers would have taken two ports
    # idle 0: gone as soon as the last of them ended (their locks die with their processes).
    assert wait_for(lambda: api_servers() - before == set(), timeout_s=30)
    assert entry_of(home) is None


def test_bad_input_in_process_stops_the_server_it_started(tmp_path, monkeypatch, capsys):
    from refusalbench.flows.cli import main
    from refusalbench.tasks.pipeline import local_api as prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setattr(prefect_api, "_api_configured", lambda: False)  # as in a fresh CLI process
    started = []
    start = prefect_api.start_embedded_api
    monkeypatch.setattr(prefect_api, "start_embedded_api", lambda: started.append(start()) or started[-1])
    before = api_servers()
    config = tmp_path / "bad.yaml"
    config.write_text("knowornot: {targets: [t], evaluator: t, qa_pairs: missing.jsonl}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["knowornot", "run", "--config", str(config), "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2, capsys.readouterr().err
    assert started == [True]
    # No flow used the server this call started: it was stopped at once and the environment restored.
    assert prefect_api._entry is None and "PREFECT_API_URL" not in os.environ
    assert api_servers() - before == set()
    assert entry_of(tmp_path / "prefect-home") is None
    assert not (tmp_path / "run").exists()


def test_a_server_of_other_settings_is_not_reused_and_api_stop_stops_the_current_one(tmp_path, monkeypatch):
    from refusalbench.tasks.pipeline import local_api as prefect_api

    home = tmp_path / "prefect-home"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setenv("REFUSALBENCH_PREFECT_API_IDLE_S", "600")
    monkeypatch.setattr(prefect_api, "_api_configured", lambda: False)
    before = api_servers()
    try:
        assert prefect_api.start_embedded_api()
        first = entry_of(home)
        # Ready before the next one boots: two servers creating one new database at once
        # collide in Prefect's migrations.
        prefect_api.wait_until_ready()
        prefect_api.release_embedded_api()  # it stays for whoever comes next (600 s)
        monkeypatch.setenv("PREFECT_SERVER_API_KEEPALIVE_TIMEOUT", "9")  # a server setting: another server
        assert prefect_api.start_embedded_api()
        second = entry_of(home)
        assert second["pid"] != first["pid"] and second["fingerprint"] != first["fingerprint"]
        # Replaced and unused, the first one does not wait out its idle time.
        assert wait_for(lambda: first["pid"] not in api_servers())
        assert not (home / "refusalbench-api" / f"users-{first['port']}.lock").exists()
        prefect_api.wait_until_ready()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        status = subprocess.run([sys.executable, "-m", "refusalbench.flows.cli", "api", "status"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and second["url"] in status.stdout, status.stdout + status.stderr
        stopped = subprocess.run([sys.executable, "-m", "refusalbench.flows.cli", "api", "stop"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0 and f"pid {second['pid']}" in stopped.stdout, stopped.stdout + stopped.stderr
        assert entry_of(home) is None and wait_for(lambda: second["pid"] not in api_servers())
    finally:
        prefect_api.release_embedded_api()
        prefect_api.stop_shared_server()
    assert api_servers() - before == set()


def test_flows_on_the_local_server_send_no_heartbeats(tmp_path, monkeypatch):
    from prefect.settings import get_current_settings

    from refusalbench.tasks.pipeline import local_api as prefect_api

    seen = []

    @prefect_api.embedded_api
    def launch() -> None:
        seen.append(get_current_settings().flows.heartbeat_frequency)

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setenv("REFUSALBENCH_PREFECT_API_IDLE_S", "0")
    monkeypatch.setattr(prefect_api, "_api_configured", lambda: False)
    try:
        launch()
    finally:
        prefect_api.release_embedded_api()
        prefect_api.stop_shared_server()
    assert seen == [None]
    # Outside embedded mode (a configured API: a server's services act on heartbeats) they stay on.
    seen.clear()
    monkeypatch.setattr(prefect_api, "_api_configured", lambda: True)
    launch()
    assert seen == [get_current_settings().flows.heartbeat_frequency] and seen[0] is not None


def test_in_process_main_leaves_the_garbage_collector_as_it_was(tmp_path, capsys):
    from refusalbench.flows.cli import main

    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(SystemExit):
        main(["data", "validate", str(tmp_path / "missing.jsonl")])
    capsys.readouterr()
    assert gc.isenabled() and gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen


def test_the_command_collects_again_once_its_flow_starts_or_no_flow_is_ahead(monkeypatch):
    from refusalbench.tasks.pipeline import gc_tuning

    frozen = gc.get_freeze_count()
    monkeypatch.setattr(gc_tuning, "_tuned", False)
    try:
        for step in (gc_tuning.no_flow_ahead, gc_tuning.flow_starts, gc_tuning.at_exit):
            step()
            assert gc.isenabled() and gc.get_freeze_count() == frozen  # not the command line: nothing changes
        gc_tuning.start_up()
        assert not gc.isenabled()
        gc_tuning.flow_starts()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        gc.unfreeze()
        gc_tuning.start_up()
        gc_tuning.no_flow_ahead()
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.enable()


def test_commands_that_start_no_flow_collect_from_the_start():
    """A long non-flow command (here `levers list`) must not run with the collector off."""
    script = textwrap.dedent("""
        import gc, sys
        import refusalbench.tasks.refusalbench.levers as levers
        from refusalbench.flows import cli

        seen, load = [], levers.load_catalogue
        levers.load_catalogue = lambda *a, **k: (seen.append(gc.isenabled()), load(*a, **k))[1]
        sys.argv = ["refusalbench", "levers", "list", "--format", "json"]
        try:
            cli.command()
        finally:
            print("collector on:", seen, file=sys.stderr)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0 and "collector on: [True]" in done.stderr, done.stderr[-2000:]


def test_settings_files_that_may_set_the_api_are_noticed(tmp_path, monkeypatch):
    from refusalbench.tasks.pipeline.local_api import settings_files_mention_api

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_PROFILES_PATH", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    assert not settings_files_mention_api(work)
    (work / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert not settings_files_mention_api(work)
    (work / "pyproject.toml").write_text("[tool.prefect.api]\nurl = 'http://server:4200/api'\n")
    assert settings_files_mention_api(work)
    (work / "pyproject.toml").unlink()
    (home / "profiles.toml").write_text("active = 'prod'\n[profiles.prod]\nPREFECT_API_URL = 'http://server:4200/api'\n")
    assert settings_files_mention_api(work)
