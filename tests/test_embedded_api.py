"""Embedded mode: a CLI run starts Prefect's API itself, early, and leaves nothing behind (tasks/prefect_api.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.scripted import by_model, run_config

ROOT = Path(__file__).resolve().parent.parent
SERVER_APP = b"prefect.server.api.server:create_app"


def api_servers() -> set[int]:
    """Processes serving Prefect's API app (ours, and any a test harness started)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if SERVER_APP in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def test_a_cli_run_in_embedded_mode_uses_its_own_api_and_stops_it(tmp_path, fake_llm):
    pairs = [{"id": f"p{i}", "question": f"What is item {i}?", "answer": f"Item {i} is a thing."} for i in range(4)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    fake_llm.responder = by_model({"tgt": lambda r: "It is a thing.",
                                   "eval": lambda r: "Fine. <abstained>no</abstained> <tier>tier_1</tier>"})
    config = run_config(tmp_path, fake_llm.url, ["tgt", "eval"], """
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
    home = tmp_path / "prefect-home"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(home))
    env.pop("PREFECT_API_URL", None)
    before = api_servers()
    done = subprocess.run([sys.executable, "-m", "refusalbench.flows.cli", "knowornot", "run", "--config", str(config),
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "report.html").exists()
    # The flow run went to the API this process started, on the project-local database ...
    with sqlite3.connect(home / "prefect.db") as db:
        runs = db.execute("SELECT flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id").fetchall()
    assert runs == [("refusalbench-knowornot", "COMPLETED")]
    # ... and that server is gone with the process.
    assert api_servers() - before == set()


def test_bad_input_in_process_stops_the_server_it_started(tmp_path, monkeypatch, capsys):
    from refusalbench.flows.cli import main
    from refusalbench.tasks import prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(prefect_api, "_api_configured", lambda: False)  # as in a fresh CLI process
    started = []
    start = prefect_api.start_embedded_api
    monkeypatch.setattr(prefect_api, "start_embedded_api", lambda: started.append(start()) or started[-1])
    before = api_servers()
    config = tmp_path / "bad.yaml"
    config.write_text("knowornot: {targets: [t], evaluator: t, qa_pairs: missing.jsonl}\n")
    try:
        main(["knowornot", "run", "--config", str(config), "--out", str(tmp_path / "run")])
        code = 0
    except SystemExit as exc:
        code = exc.code
    assert code == 2, capsys.readouterr().err
    assert started == [True]
    # The check failed before any flow used the server: it was stopped at once and the environment restored.
    assert prefect_api._process is None and "PREFECT_API_URL" not in os.environ
    assert api_servers() - before == set()
    assert not (tmp_path / "run").exists()


def test_settings_files_that_may_set_the_api_are_noticed(tmp_path, monkeypatch):
    from refusalbench.tasks.prefect_api import settings_files_mention_api

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
