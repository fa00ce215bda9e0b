"""The main job at the paper's shape against the scripted server: each stage beside its latency bound.

The shape: N base items x all 18 strata (one lever each), 4 generators, 4 verifiers
(unanimous; the scripted verifiers pass everything, so every candidate enters the
benchmark), T targets and a judge, every model at ``max_concurrency`` C, every reply after
L seconds. With an empty call cache, the real main job (``flows.launch.run_main``, what
``refusalbench run`` calls) runs in a child process, as the CLI would (embedded mode: Prefect's
background server in the run's own ``PREFECT_HOME``, started before the measured run unless
``--cold-api``, and stopped after it); the scripted server runs in this process and logs every request.

Per stage (generate, verify, respond, judge) it prints:

- wall s: the stage's time from the run's manifests (``timings_s``);
- calls: requests the server saw for the stage (told apart by the JSON schema they ask
  for), and the most any one model of the stage got;
- bound s: the latency bound, each model's calls x L / its concurrency; the models of a
  stage run in parallel, so the stage's bound is the largest; stages run in sequence,
  except respond and judge, which overlap (their joint bound is the larger of the two);
- bound/wall: how close the stage came to its bound;
- peak in flight: the most requests of the stage in flight at once (arrival to arrival + L),
  against models x C.

Then the fixed cost: the run's wall time minus the time with at least one request in flight
(start-up, Prefect, Parquet, scoring, report), and the child process's wall time; the evaluate
flow alone against its bound, and its floor on this machine (``evaluate_floor``: its calls in whole
rounds, then the CPU it spends after its last reply, scoring and report, measured again on one core
from the run folder, divided by the cores: no orchestration can beat it); and where the time goes,
stage by stage (``overheads.py``: wall, calls in flight, start-up, Parquet I/O, Prefect per task,
bootstrap, figures, the rest). With several ``--targets`` a last table shows how each part grows
with the number of models.

    python benchmarks/paper_scale.py --quick                  # N=2, L=0.1 s, 6 targets: a smoke run
    python benchmarks/paper_scale.py                          # N=10, L=1 s, 30 targets, C=16
    python benchmarks/paper_scale.py --targets 3 10 30        # the same at 3, 10 and 30 targets: how each part grows
    python benchmarks/paper_scale.py --items 4 --latency 0.5 --py-spy /tmp/run.txt   # profile the run

Issue 29's shape (``--issue-shape``): the same generation (720 candidates, a 56 s bound), then a
benchmark of 180 items (``generation.target_size``: 10 per stratum) and targets that mostly refuse
with a bare refusal code (``--answer-share``: one reply in 64 is an answer), so the judge, which
skips bare codes, is light: evaluation's bound is respond's 180 calls / 16 x 1 s = 11.25 s, the
run's 67 s. It ends with one headline line per run: the run's and the evaluate flow's share of
their bounds against the issue's targets (>= 85% and >= 70%).

    python benchmarks/paper_scale.py --issue-shape --targets 3 10 30
    python benchmarks/paper_scale.py --issue-shape --latency 0.2 --targets 3   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from overheads import breakdown, child_figures, instrument, print_breakdown  # noqa: E402

GENERATORS = [f"gen-{i}" for i in range(1, 5)]
VERIFIERS = [f"ver-{i}" for i in range(1, 5)]
JUDGE = "judge"
STAGES = ("generate", "verify", "respond", "judge")


@dataclass(frozen=True)
class Shape:
    items: int
    latency: float
    concurrency: int
    targets: int
    judge_concurrency: int
    bootstrap: int
    decision: str = "judge"  # evaluation.decision: judge classifies every reply; codes: only answer attempts
    benchmark_size: int | None = None  # generation.target_size: stratified sample of the accepted items
    answer_share: float = 1.0  # share of target replies that answer; the rest are bare refusal codes
    issue_shape: bool = False  # issue 29's shape (printed as such, with its headline)

    @property
    def target_names(self) -> list[str]:
        return [f"target-{i:02d}" for i in range(1, self.targets + 1)]

    def concurrency_of(self, model: str) -> int:
        return self.judge_concurrency if model == JUDGE else self.concurrency


# ----------------------------------------------------------------- inputs


def write_base_set(path: Path, n: int) -> Path:
    """N single-document base items, each with a distinct question, answer and context."""
    lines = [
        json.dumps(
            {
                "id": f"base-{i:04d}",
                "question": f"In which year did town number {i} open its library?",
                "answers": [str(1900 + i)],
                "context": f"Town number {i} opened its public library in {1900 + i}, after a long "
                f"campaign by its residents. The building still stands on the main square.",
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_config(folder: Path, url: str, shape: Shape) -> Path:
    models = "".join(
        f"  {name}:\n    model: openai/{name}\n    api_base: {url}\n    max_concurrency: {shape.concurrency_of(name)}\n"
        f"    timeout_s: {max(30.0, 20 * shape.latency)}\n"
        for name in [*GENERATORS, *VERIFIERS, *shape.target_names, JUDGE]
    )
    config = folder / "paper-scale.yaml"
    config.write_text(
        f"""models:
{models}cache:
  path: {folder / "calls.sqlite"}
generation:
  base_set: {write_base_set(folder / "base.jsonl", shape.items)}
  generators: [{", ".join(GENERATORS)}]
  verifiers: [{", ".join(VERIFIERS)}]
  filter: unanimous
  seed: 0
{f"  target_size: {shape.benchmark_size}{chr(10)}" if shape.benchmark_size else ""}evaluation:
  targets: [{", ".join(shape.target_names)}]
  judge: {JUDGE}
  bootstrap: {shape.bootstrap}
  decision: {shape.decision}
""",
        encoding="utf-8",
    )
    return config


def refusing_responder(answer_share: float) -> Callable[[dict[str, Any]], str]:
    """The dry-run replies, except that a target answers only ``answer_share`` of its items (chosen
    by the request's fingerprint, so a re-run sends the same) and refuses the rest with a bare
    refusal code, spread over the codes: replies the judge stage decides without a call."""
    from refusalbench.tasks.llm.scripted_replies import request_fingerprint
    from refusalbench.tasks.llm.scripted_server import dry_run_responder
    from refusalbench.tasks.refusalbench.taxonomy import REFUSAL_CODES

    def respond(request: dict[str, Any]) -> str:
        if request.get("response_format") or not str(request.get("model", "")).startswith("target-"):
            return dry_run_responder(request)
        draw = int(request_fingerprint(request), 16)
        if (draw % 10_000) < answer_share * 10_000:
            return dry_run_responder(request)
        return REFUSAL_CODES[draw // 10_000 % len(REFUSAL_CODES)]

    return respond


# ----------------------------------------------------------------- child: the measured run


def child(config: str, out: str) -> None:
    from refusalbench.tasks.pipeline.runtime import configure_prefect_env

    configure_prefect_env()
    started_at = time.time()
    started = time.perf_counter()
    from refusalbench.flows.launch import run_main
    from refusalbench.tasks.core import runfolder
    from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

    instrumented = instrument()  # imports what the run imports later: counted as imports
    imported = time.perf_counter()
    run_main(config, out)
    wall = time.perf_counter() - started
    timings: dict[str, float] = {}
    for artifact in (rb_files.GENERATION_MANIFEST, runfolder.MANIFEST):
        path = Path(out) / artifact.name
        if path.exists():
            timings.update(json.loads(path.read_text()).get("timings_s", {}))
    print(
        json.dumps(
            {
                "started_at": started_at,
                "import_s": imported - started,
                "wall_s": wall,
                "timings": timings,
                "finished_at": time.time(),
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "instrumented": instrumented,
                **child_figures(out),
            }
        )
    )


def after_calls_child(folder: str, bootstrap: int) -> None:
    """The CPU the evaluate flow spends after its last reply, on one core: the run folder's judged rows scored
    (``write_scores``, its bootstrap and seed included) and its report written (``write_report``), in a copy
    of the folder, pinned to one core."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from refusalbench.tasks.core.charts import javascript_bundle
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.report import page  # noqa: F401 - imported before the clock
    from refusalbench.tasks.refusalbench.report.run_outputs import write_report, write_scores

    with tempfile.TemporaryDirectory(prefix="refusalbench-after-calls-") as tmp:
        copy = Path(tmp) / "run"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("_prefect"))
        store = ArtifactStore(str(copy))
        seed = json.loads((copy / "manifest.json").read_text())["seed"]
        javascript_bundle()  # the charts' JavaScript built and cached on disk if it is not yet (a user's second report)
        javascript_bundle.cache_clear()  # ... and read from there again, on the clock, as a report does
        started = time.process_time()
        result = write_scores(store, store.read_frame("judged.parquet"), bootstrap=bootstrap, seed=seed)
        scored = time.process_time()
        write_report(store, result)
        print(json.dumps({"score_cpu_s": scored - started, "report_cpu_s": time.process_time() - scored}))


def after_calls_cpu(folder: Path, env: dict[str, str], bootstrap: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--after-calls", str(folder), "--bootstrap", str(bootstrap)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def run_child(config: Path, out: Path, env: dict[str, str], py_spy: str | None) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", "--config", str(config), "--out", str(out)]
    if py_spy:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        # Speedscope keeps the samples in order, idle ones included: a timeline of each thread.
        # Raw (collapsed stacks) keeps the busy ones: where the CPU went. Sampling without
        # stopping the process keeps the profile from slowing a run of a hundred threads.
        timeline = py_spy.endswith(".json")
        args = [
            spy,
            "record",
            "--format",
            "speedscope" if timeline else "raw",
            "--threads",
            "--nonblocking",
            *(["--idle"] if timeline else []),
            "--rate",
            "50",
            "--output",
            py_spy,
            "--",
            *args,
        ]
    process_started = time.time()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=6 * 3600)
    process_ended = time.time()
    # The child's figures are its last JSON line (py-spy, when it wraps the child, prints after it;
    # py-spy exits 0 whatever the child did, so a missing line is a failed run too).
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the run failed:\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1])
    result.update(process_started=process_started, process_wall_s=process_ended - process_started)
    return result


# ----------------------------------------------------------------- figures from the server log


def stage_of(call: dict[str, Any]) -> str:
    """The stage a request belongs to, from the JSON schema it asks for (targets ask for none)."""
    name = ((call.get("response_format") or {}).get("json_schema") or {}).get("name") or ""
    if name.startswith("Generator"):
        return "generate"
    if name.startswith("Verifier"):
        return "verify"
    if name.startswith("Judge"):
        return "judge"
    return "respond"


def peak_in_flight(arrivals: list[float], latency: float) -> int:
    events = sorted([(t, 1) for t in arrivals] + [(t + latency, -1) for t in arrivals], key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def busy_seconds(arrivals: list[float], latency: float) -> float:
    """Length of the union of [arrival, arrival + latency]: time with a request in flight."""
    total, end = 0.0, float("-inf")
    for start in sorted(arrivals):
        total += latency if start > end else max(0.0, start + latency - end)
        end = max(end, start + latency)
    return total


def stage_rows(calls: list[dict[str, Any]], timings: dict[str, float], shape: Shape) -> list[dict[str, Any]]:
    rows = []
    for stage in STAGES:
        mine = [c for c in calls if stage_of(c) == stage]
        per_model: dict[str, int] = {}
        for call in mine:
            per_model[call["model"]] = per_model.get(call["model"], 0) + 1
        bounds = {m: n * shape.latency / shape.concurrency_of(m) for m, n in per_model.items()}
        bound = max(bounds.values(), default=0.0)
        wall = timings.get(stage, float("nan"))
        times = [c["time"] for c in mine]
        rows.append(
            {
                "stage": stage,
                "wall_s": wall,
                "calls": len(mine),
                "models": len(per_model),
                "max_calls_per_model": max(per_model.values(), default=0),
                # Whole rounds of the slowest model: a call starts only when a reply frees its slot.
                "rounds": max((-(-n // shape.concurrency_of(m)) for m, n in per_model.items()), default=0),
                "bound_model": max(bounds, key=bounds.get) if bounds else None,
                "bound_s": bound,
                "ratio": bound / wall if wall and wall == wall else float("nan"),
                "peak_in_flight": peak_in_flight(times, shape.latency),
                "possible_in_flight": sum(shape.concurrency_of(m) for m in per_model),
                "first_call": min(times, default=None),
                "last_call": max(times, default=None),
            }
        )
    return rows


# ----------------------------------------------------------------- driver


def measure(shape: Shape, work: Path, py_spy: str | None, rerun: bool, cold_api: bool = False) -> dict[str, Any]:
    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer, dry_run_responder
    from refusalbench.tasks.pipeline.prefect_server import stop_background_server

    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        PREFECT_HOME=str(work / "prefect-home"),
        REFUSALBENCH_CACHE_DIR=str(work / "cache"),
    )
    env.pop("PREFECT_API_URL", None)  # the CLI's own embedded API, as a user's run would have
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # a loaded machine boots it slowly
    if not cold_api:
        # As for every command after a user's first: Prefect's background server already runs
        # (its first start, database creation included, is fixed_cost.py's measure).
        # The child's environment settings first: a server started under other settings is restarted.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from refusalbench.tasks.pipeline.runtime import configure_prefect_env; "
                "configure_prefect_env(); from refusalbench.tasks.pipeline.prefect_server import "
                "start_embedded_api, wait_until_ready; start_embedded_api(); wait_until_ready()",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
    responder = dry_run_responder if shape.answer_share >= 1 else refusing_responder(shape.answer_share)
    with ScriptedLLMServer(responder=responder, latency_s=shape.latency) as server:
        config = write_config(work, server.url, shape)
        # This process does little else while the child runs: its CPU then is the scripted server's.
        cpu_before, api_before = _process_cpu(), _api_server_cpu(work / "prefect-home")
        first = run_child(config, work / "run1", env, py_spy)
        server_cpu_s = _process_cpu() - cpu_before
        api_after = _api_server_cpu(work / "prefect-home")
        api_cpu_s = api_after - api_before if None not in (api_before, api_after) else None
        calls = list(server.calls)
        after_calls = after_calls_cpu(work / "run1", env, shape.bootstrap)
        second = None
        if rerun:
            second = run_child(config, work / "run2", env, None)
            second["calls"] = len(server.calls) - len(calls)
    stop_background_server(work / "prefect-home")  # each measurement starts its own: leave none behind
    rows = stage_rows(calls, first["timings"], shape)
    by = {r["stage"]: r for r in rows}
    bound = by["generate"]["bound_s"] + by["verify"]["bound_s"] + max(by["respond"]["bound_s"], by["judge"]["bound_s"])
    busy = busy_seconds([c["time"] for c in calls], shape.latency)
    run_end = first["started_at"] + first["wall_s"]
    return {
        "shape": shape.__dict__,
        "stages": rows,
        "calls": len(calls),
        "bound_s": bound,
        "run_wall_s": first["wall_s"],
        "process_wall_s": first["process_wall_s"],
        "import_s": first["import_s"],
        "ratio": bound / first["wall_s"],
        "busy_s": busy,
        "fixed_s": first["wall_s"] - busy,
        "before_first_call_s": (min(c["time"] for c in calls) - first["started_at"]) if calls else None,
        "after_last_call_s": (run_end - max(c["time"] for c in calls) - shape.latency) if calls else None,
        "manifest_timings": first["timings"],
        "maxrss_mib": first["maxrss_mib"],
        "process_exit_s": first["process_wall_s"] - (first["finished_at"] - first["process_started"]),
        "rerun": second
        and {"wall_s": second["wall_s"], "process_wall_s": second["process_wall_s"], "calls": second["calls"]},
        "run_started_at": first["started_at"],
        "evaluate": evaluate_figures(first, by, evaluate_floor(by, shape, after_calls)),
        "breakdown": breakdown(
            {**first, "spawn_s": first["started_at"] - first["process_started"]},
            [(c["time"], c["model"], stage_of(c)) for c in calls],
            shape.latency,
            busy_seconds,
        ),
        "cpu_s": first["cpu_s"],
        "server_cpu_s": server_cpu_s,
        "api_cpu_s": api_cpu_s,
        "instrumented": first["instrumented"],
        # Every request as (seconds since the run started, model, stage): enough to replay what was in flight.
        "requests": [(round(c["time"] - first["started_at"], 4), c["model"], stage_of(c)) for c in calls],
    }


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _api_server_cpu(home: Path) -> float | None:
    """CPU seconds of Prefect's background server (and its children) so far; None when none runs
    (``--cold-api``: the measured run starts it)."""
    try:
        pid = int((home / "server.pid").read_text())
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        total = 0.0
        for each in [pid, *map(int, children)]:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total
    except (OSError, ValueError):
        return None


def evaluate_floor(by: dict[str, dict[str, Any]], shape: Shape, after_calls: dict[str, float]) -> dict[str, Any]:
    """The least the evaluate flow can take here, whatever its orchestration: its calls, then the CPU it
    spends after its last reply.

    - Calls in whole rounds (a model's calls / its concurrency, rounded up, x L: no call starts before a
      reply frees its slot), where the bound counts fractional rounds: the targets' rounds, then one
      judge round for the replies of their last round when the judge was asked about any of them (a
      reply is judged only once it is in), or the judge's own rounds, whichever is longer.
    - The CPU spent after the last reply (score and report, measured on one core by
      :func:`after_calls_child`), shared perfectly over the cores, with nothing else running.

    Nothing before the first call is counted (the flow's set-up, its tasks' start), and the scripted
    server is taken to cost no CPU: the flow cannot come under this floor, so bound / floor is the
    largest share of its bound it can reach on this machine."""
    respond, judge = by["respond"], by["judge"]
    target_rounds, judge_rounds = respond["rounds"], judge["rounds"]
    last_round_judged = (
        None not in (respond["last_call"], judge["last_call"]) and judge["last_call"] >= respond["last_call"]
    )  # a judge request after the last target one
    calls_s = max((target_rounds + last_round_judged) * shape.latency, judge_rounds * shape.latency)
    cores = len(os.sched_getaffinity(0))
    cpu_s = after_calls["score_cpu_s"] + after_calls["report_cpu_s"]
    return {
        "target_rounds": target_rounds,
        "last_round_judged": last_round_judged,
        "judge_rounds": judge_rounds,
        "judge_calls": judge["calls"],
        "calls_s": calls_s,
        "after_calls_cpu_s": cpu_s,
        "cores": cores,
        **after_calls,
        "floor_s": calls_s + cpu_s / cores,
    }


def evaluate_figures(
    first: dict[str, Any], by: dict[str, dict[str, Any]], floor: dict[str, float] | None = None
) -> dict[str, Any] | None:
    """The evaluate flow alone: its wall (its manifest's creation to its end) against its bound, and the
    least it can take here (:func:`evaluate_floor`)."""
    ev = first["manifests"].get("evaluation")
    if not ev or not ev.get("finished_at"):
        return None
    from overheads import _epoch

    wall = _epoch(ev["finished_at"]) - _epoch(ev["created_at"])
    bound = max(by["respond"]["bound_s"], by["judge"]["bound_s"])
    return {
        "wall_s": wall,
        "bound_s": bound,
        "ratio": bound / wall if wall else float("nan"),
        "floor": floor,
        "most_ratio": bound / floor["floor_s"] if floor and floor["floor_s"] else float("nan"),
    }


def print_report(result: dict[str, Any]) -> None:
    s = result["shape"]
    title = "Issue 29's paper shape" if s.get("issue_shape") else "Main job at the paper's shape"
    size = f", a benchmark of {s['benchmark_size']} items" if s.get("benchmark_size") else ""
    replies = (
        f", targets answer {100 * s['answer_share']:.1f}% of items and refuse the rest with a bare code"
        if s.get("answer_share", 1.0) < 1
        else ""
    )
    print(
        f"\n### {title}: {s['items']} base items x 18 strata, 4 generators + 4 verifiers "
        f"(unanimous){size}, {s['targets']} targets + judge, max_concurrency {s['concurrency']} "
        f"(judge {s['judge_concurrency']}), {s['latency']:g} s per reply, decision {s.get('decision', 'judge')}{replies}\n"
    )
    print("| stage | wall s | calls | models | calls of the busiest model | bound s | bound/wall | peak in flight |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["stages"]:
        print(
            f"| {r['stage']} | {r['wall_s']:.1f} | {r['calls']:,} | {r['models']} | {r['max_calls_per_model']:,} "
            f"| {r['bound_s']:.1f} | {100 * r['ratio']:.0f}% | {r['peak_in_flight']} of {r['possible_in_flight']} |"
        )
    print(
        f"| **run** (respond and judge overlap) | {result['run_wall_s']:.1f} | {result['calls']:,} | | "
        f"| {result['bound_s']:.1f} | **{100 * result['ratio']:.0f}%** | |"
    )
    print(
        f"\nfixed cost (run wall - time with a request in flight): {result['fixed_s']:.1f} s "
        f"({result['before_first_call_s']:.1f} s before the first call, {result['after_last_call_s']:.1f} s after the last); "
        f"imports {result['import_s']:.1f} s; process wall {result['process_wall_s']:.1f} s "
        f"(exit {result['process_exit_s']:.1f} s); peak RSS {result['maxrss_mib']:.0f} MiB"
    )
    others = {k: v for k, v in result["manifest_timings"].items() if k not in STAGES}
    if others:
        print("other manifest timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in others.items()))
    if result["rerun"]:
        r = result["rerun"]
        print(
            f"cached re-run: {r['wall_s']:.1f} s run wall, {r['process_wall_s']:.1f} s process, {r['calls']} calls sent"
        )
    ev = result["evaluate"]
    if ev:
        print(
            f"evaluate flow alone: {ev['wall_s']:.1f} s wall against its {ev['bound_s']:.1f} s bound = "
            f"**{100 * ev['ratio']:.0f}%**"
        )
        if f := ev.get("floor"):
            judged = " + 1 judge round for their last round's replies" if f["last_round_judged"] else ""
            print(
                f"evaluate flow's floor here: {f['calls_s']:.1f} s of calls in whole rounds (the targets' "
                f"{f['target_rounds']}{judged}, or the judge's {f['judge_rounds']} for its {f['judge_calls']} calls, "
                f"whichever is longer) + {f['after_calls_cpu_s']:.1f} s of CPU after the last reply (score "
                f"{f['score_cpu_s']:.2f} s, report {f['report_cpu_s']:.2f} s, on one core) / {f['cores']} cores = "
                f"{f['floor_s']:.1f} s: at most **{100 * ev['most_ratio']:.0f}%** of the bound, with no time "
                "before the first call and no CPU for the server"
            )
    print(
        f"\n#### Where the time goes ({s['targets']} targets; CPU of the run's process {result['cpu_s']:.1f} s, "
        f"of the scripted server {result.get('server_cpu_s', float('nan')):.1f} s, of Prefect's API server "
        f"{'?' if (api := result.get('api_cpu_s')) is None else f'{api:.1f}'} s)"
    )
    print_breakdown(result["breakdown"], result["bound_s"], result["run_wall_s"])


def headline(result: dict[str, Any]) -> str:
    """One line: the run's and the evaluate flow's share of their latency bounds, against issue 29's targets."""
    s, ev = (
        result["shape"],
        result["evaluate"] or {"wall_s": float("nan"), "bound_s": float("nan"), "ratio": float("nan")},
    )
    most = ev.get("most_ratio", float("nan"))
    name = "issue 29 shape" if s.get("issue_shape") else "paper shape"
    return (
        f"HEADLINE {name}, {s['targets']} targets, {s['latency']:g} s: run {100 * result['ratio']:.0f}% of its "
        f"{result['bound_s']:.1f} s bound ({result['run_wall_s']:.1f} s; target >= 85%), evaluate "
        f"{100 * ev['ratio']:.0f}% of its {ev['bound_s']:.1f} s bound ({ev['wall_s']:.1f} s; target >= 70%; "
        f"at most {100 * most:.0f}% on this machine)"
    )


def print_growth(results: list[dict[str, Any]]) -> None:
    """The parts that grow with the number of targets, one row per measured run."""
    print("\n### Growth with the number of targets\n")
    print(
        "| targets | run wall s | bound s | % of bound | evaluate wall s | evaluate % of bound | respond tasks "
        "| Prefect per task s | score s | bootstrap s | report s | figures s | process CPU s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        by = {row["stage"]: row for row in r["breakdown"]}
        respond, score, report = by.get("respond", {}), by.get("score", {}), by.get("report", {})
        ev = r["evaluate"] or {"wall_s": float("nan"), "ratio": float("nan")}
        per_task = respond.get("prefect_per_task_s")
        print(
            f"| {r['shape']['targets']} | {r['run_wall_s']:.1f} | {r['bound_s']:.1f} | {100 * r['ratio']:.0f}% "
            f"| {ev['wall_s']:.1f} | {100 * ev['ratio']:.0f}% | {respond.get('tasks', '')} "
            f"| {'' if per_task is None else f'{per_task:.3f}'} | {score.get('wall_s', 0):.2f} "
            f"| {score.get('bootstrap_s', 0):.2f} | {report.get('wall_s', 0):.2f} | {report.get('figures_s', 0):.2f} "
            f"| {r['cpu_s']:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10, help="base items (each gets all 18 strata)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds before each reply")
    parser.add_argument("--concurrency", type=int, default=16, help="max_concurrency of every model")
    parser.add_argument(
        "--decision",
        choices=["judge", "codes"],
        default="judge",
        help="evaluation.decision (default judge, the product's: the judge classifies every reply "
        "that is no bare code; codes: the judge grades only answer attempts, the shape of the "
        "measurements before issue 27)",
    )
    parser.add_argument("--judge-concurrency", type=int, help="max_concurrency of the judge (default: --concurrency)")
    parser.add_argument(
        "--targets",
        type=int,
        nargs="+",
        default=[30],
        help="targets; several (e.g. 3 10 30) measure one run each and print how the parts grow",
    )
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument(
        "--benchmark-size",
        type=int,
        help="generation.target_size: the benchmark is a stratified sample of this many accepted items",
    )
    parser.add_argument(
        "--answer-share",
        type=float,
        default=1.0,
        help="share of the targets' replies that answer; the rest are bare refusal codes, which the "
        "judge stage decides without a call (default 1: every reply answers)",
    )
    parser.add_argument(
        "--issue-shape",
        action="store_true",
        help="issue 29's shape: 10 base items, a benchmark of 180, targets answering 1 item in 64, "
        "decision judge (a 67 s bound at 1 s; --targets, --latency still apply)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 items, 0.1 s, 6 targets")
    parser.add_argument(
        "--cold-api",
        action="store_true",
        help="measure the start of Prefect's background server too (a fresh PREFECT_HOME: its database "
        "created); by default it is started before the measured run, as for any later command",
    )
    parser.add_argument("--rerun", action="store_true", help="also time a second run from the call cache")
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        help="profile the run with py-spy, idle samples included: FILE.json speedscope, else collapsed stacks",
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (run folders, config, call cache)")
    parser.add_argument(
        "--json", help="also write the raw figures (and every request's time, model, stage) to this file"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--after-calls", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.after_calls:
        after_calls_child(args.after_calls, args.bootstrap)
        return
    if args.child:
        child(args.config, args.out)
        return
    if args.quick:
        args.items, args.latency, args.targets = 2, 0.1, [6]
    if args.issue_shape:
        args.items, args.benchmark_size, args.answer_share, args.decision = 10, 180, 1 / 64, "judge"
    results = []
    for targets in args.targets:
        shape = Shape(
            args.items,
            args.latency,
            args.concurrency,
            targets,
            args.judge_concurrency or args.concurrency,
            args.bootstrap,
            args.decision,
            args.benchmark_size,
            args.answer_share,
            args.issue_shape,
        )
        # Several runs: each in its own folder (DIR/targets-N), profiled to FILE with N before the suffix.
        py_spy = args.py_spy
        if py_spy and len(args.targets) > 1:
            py_spy = str(Path(py_spy).with_stem(f"{Path(py_spy).stem}-{targets}"))
        if args.keep:
            work = Path(args.keep).resolve() / (f"targets-{targets}" if len(args.targets) > 1 else "")
            work.mkdir(parents=True, exist_ok=False)
            result = measure(shape, work, py_spy, args.rerun, args.cold_api)
        else:
            with tempfile.TemporaryDirectory(prefix="refusalbench-paper-scale-") as tmp:
                result = measure(shape, Path(tmp), py_spy, args.rerun, args.cold_api)
        print_report(result)
        results.append(result)
    if len(results) > 1:
        print_growth(results)
    print()
    for result in results:
        print(headline(result))
    if args.json:
        Path(args.json).write_text(json.dumps(results[0] if len(results) == 1 else results))


if __name__ == "__main__":
    main()
