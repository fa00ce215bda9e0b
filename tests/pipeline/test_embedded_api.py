"""Embedded mode: the first command that runs a flow starts Prefect's own background server
(``prefect server start --background``, with its UI) under PREFECT_HOME, later commands use
it, and it runs until ``refusalbench api stop`` or until idle (tasks/pipeline/prefect_server.py;
one per user and the idle stop: tests/pipeline/test_api_server.py). Every test that may start one stops
it (the ``home`` fixture), so none outlives the test."""

from __future__ import annotations

import fcntl
import gc
import os
import re
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from refusalbench.tasks.pipeline import prefect_server
from refusalbench.tasks.pipeline.prefect_server import running_server, stop_background_server
from tests.browser import Browser
from tests.llm.test_faults import reads_reference, write_benchmark
from tests.pipeline.test_prefect_ui import has_text, open_tab
from tests.scripted import by_model, judge_by_reference, run_config

ROOT = Path(__file__).resolve().parents[2]
RUN_LINK = re.compile(r"Prefect UI: (http://127\.0\.0\.1:(\d+))/runs/flow-run/([0-9a-f-]{36})")
STARTED = "Prefect server started in the background"


@pytest.fixture
def home(tmp_path):
    """A PREFECT_HOME of the test's own; whatever background server a test started there is stopped."""
    folder = tmp_path / "prefect-home"
    yield folder
    stop_background_server(folder)


@pytest.fixture
def default_port_taken():
    """Something else listening on Prefect's default port (4200), as on a machine where the user runs a
    server of their own: the embedded server takes another port, and its UI must still ask its own API."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", 4200))
        sock.listen()
    except OSError:
        pass  # taken already, which is what the test wants
    yield
    sock.close()


def embedded_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(home))
    env.pop("PREFECT_API_URL", None)
    return env


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def cli(*argv: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.mark.slow
def test_embedded_runs_share_the_background_server_and_show_in_its_ui(tmp_path, fake_llm, home, default_port_taken):
    """Two `refusalbench evaluate` commands: the first starts the server, the second uses it;
    each prints its run's page, which shows the run, its logs and its artifacts in the UI."""
    benchmark = write_benchmark(tmp_path, 4)
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["answerer", "judge"],
        """
        evaluation:
          targets: [answerer]
          judge: judge
          bootstrap: 50
        """,
    )
    fake_llm.responder = by_model({"answerer": reads_reference, "judge": judge_by_reference})
    env = embedded_env(home)
    runs = []
    for out in ("run1", "run2"):
        done = cli("evaluate", "--config", str(config), "--benchmark", benchmark, "--out", str(tmp_path / out), env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(done.stderr)
    assert runs[0].count(STARTED) == 1 and STARTED not in runs[1], runs
    (first,), (second,) = (RUN_LINK.findall(stderr) for stderr in runs)
    ui, port = first[0], int(first[1])
    assert port != 4200  # the default port is taken (fixture): the page below is this server's own UI
    assert second[:2] == first[:2] and second[2] != first[2]  # one server, two runs
    server = running_server(home)
    assert server is not None and server["port"] == port and alive(server["pid"])  # still up after both ended
    assert (home / "server.pid").read_text().strip() == str(server["pid"])  # Prefect's own record of it
    with sqlite3.connect(home / "prefect.db") as db:
        stored = db.execute(
            "SELECT flow_run.id, flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id"
        ).fetchall()
    assert sorted(stored) == sorted((run[2], "refusalbench-evaluate", "COMPLETED") for run in (first, second))

    keep = os.environ.get("REFUSALBENCH_SCREENSHOTS")
    shots = Path(keep) if keep else tmp_path
    page = f"{ui}/runs/flow-run/{second[2]}"
    with Browser() as browser:
        # The run's page opens on its Logs tab: the run's story, stage by stage, to the report.
        logs = browser.look(
            page,
            script="document.body.innerText",
            screenshot=shots / "embedded-run-logs.png",
            wait_for=has_text("stage score: done", "report: file://"),
            settle_s=1.0,
            timeout_s=90,
        )
        assert "refusalbench-evaluate" in logs and "Completed" in logs
        assert "stage respond: done" in logs and "stage judge: done" in logs
        # Its Artifacts tab: the leaderboard and the report link.
        artifacts = browser.look(
            page,
            script=open_tab("Artifacts", "leaderboard"),
            wait_for=has_text("Artifacts"),
            screenshot=shots / "embedded-run-artifacts.png",
            settle_s=1.0,
            timeout_s=90,
        )
        assert "leaderboard" in artifacts and "report" in artifacts, artifacts
    assert (shots / "embedded-run-logs.png").stat().st_size > 10_000

    status = cli("api", "status", env=env, timeout=60)
    assert status.returncode == 0 and f"Prefect UI: {ui}" in status.stdout, status.stdout + status.stderr
    watchdog = server["record"]["watchdog_pid"]
    assert alive(watchdog)
    stopped = cli("api", "stop", env=env, timeout=60)
    assert stopped.returncode == 0 and f"pid {server['pid']}" in stopped.stdout, stopped.stdout + stopped.stderr
    assert not alive(server["pid"]) and not (home / "server.pid").exists() and running_server(home) is None
    assert not alive(watchdog)  # its idle watchdog goes with it


def test_commands_started_together_start_one_server(home):
    script = (
        "import os\nfrom refusalbench.tasks.pipeline.prefect_server import start_embedded_api, wait_until_ready\n"
        "start_embedded_api(); wait_until_ready(); print(os.environ['PREFECT_API_URL'])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=embedded_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1, outputs  # two servers would have taken two ports
    assert sum(err.count(STARTED) for _, err in outputs) == 1
    server = running_server(home)
    assert server is not None and server["url"] == outputs[0][0].strip()


def test_bad_input_in_process_stops_the_server_it_started(tmp_path, monkeypatch, capsys, home):
    from refusalbench.flows.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setattr(prefect_server, "_api_configured", lambda: False)  # as in a fresh CLI process
    spawned = []
    spawn = prefect_server._spawn_server
    monkeypatch.setattr(prefect_server, "_spawn_server", lambda *a: spawned.append(spawn(*a)) or spawned[-1])
    config = tmp_path / "bad.yaml"
    config.write_text("knowornot: {targets: [t], evaluator: t, qa_pairs: missing.jsonl}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["knowornot", "run", "--config", str(config), "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(
        ": model 't' is not in the registry" in line for line in lines
    )  # input errors alone: no word of a server
    # No flow used the server this call started: it was stopped at once and the environment restored.
    ((process, entry),) = spawned
    assert process.poll() is not None and not listening(entry["port"])
    assert prefect_server._entry is None and "PREFECT_API_URL" not in os.environ
    assert running_server(home) is None and not (home / "server.pid").exists()
    assert not (tmp_path / "run").exists()


def test_a_server_of_other_settings_is_not_reused(home, monkeypatch):
    from prefect.cli._server_utils import SERVER_PID_FILE_NAME

    assert prefect_server.PID_FILE == SERVER_PID_FILE_NAME  # the file `prefect server stop` reads
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setattr(prefect_server, "_api_configured", lambda: False)
    try:
        assert prefect_server.start_embedded_api()
        prefect_server.wait_until_ready()
        prefect_server.release_embedded_api()  # it stays for whoever comes next
        first = running_server(home)
        assert first is not None and first["fingerprint"] == prefect_server.server_fingerprint()
        monkeypatch.setenv("PREFECT_SERVER_API_KEEPALIVE_TIMEOUT", "9")  # a server setting: another server
        # While another command uses it, it is neither reused nor stopped.
        with open(home / prefect_server.USERS_LOCK) as other_command:
            fcntl.flock(other_command, fcntl.LOCK_SH)
            with pytest.raises(RuntimeError, match="started under other server settings"):
                prefect_server.start_embedded_api()
        assert running_server(home)["pid"] == first["pid"] and "PREFECT_API_URL" not in os.environ
        # Unused, it is stopped and a new one started.
        assert prefect_server.start_embedded_api()
        assert not alive(first["pid"])
        prefect_server.wait_until_ready()
        second = running_server(home)
        assert second["pid"] != first["pid"] and second["fingerprint"] == prefect_server.server_fingerprint()
    finally:
        prefect_server.release_embedded_api()


def test_flows_on_the_embedded_server_send_no_heartbeats(monkeypatch):
    from prefect.settings import get_current_settings

    seen = []

    @prefect_server.embedded_api
    def launch() -> None:
        seen.append(get_current_settings().flows.heartbeat_frequency)

    # A server in use (as after start_embedded_api): the launch runs with heartbeats off.
    monkeypatch.setattr(prefect_server, "_entry", {"url": "http://127.0.0.1:9/api"})
    launch()
    assert seen == [None]
    # Outside embedded mode (a configured API: a server's automation acts on heartbeats) they stay on.
    seen.clear()
    monkeypatch.setattr(prefect_server, "_entry", None)
    monkeypatch.setattr(prefect_server, "_api_configured", lambda: True)
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
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0 and "collector on: [True]" in done.stderr, done.stderr[-2000:]


def test_settings_files_that_may_set_the_api_are_noticed(tmp_path, monkeypatch):
    from refusalbench.tasks.pipeline.prefect_server import settings_files_mention_api

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
    (home / "profiles.toml").write_text(
        "active = 'prod'\n[profiles.prod]\nPREFECT_API_URL = 'http://server:4200/api'\n"
    )
    assert settings_files_mention_api(work)
