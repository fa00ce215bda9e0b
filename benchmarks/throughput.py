"""Throughput of the evaluation flow (and the KnowOrNot LOO grid) against a fake provider.

The fake OpenAI-compatible server answers every request after a fixed latency (100 ms by
default), so the best possible rate of one model is ``max_concurrency / latency`` calls/s.
For each benchmark size and concurrency, one evaluation run (a target and a judge, both
at that concurrency) is made in a fresh process, then repeated with the same call cache:

- achieved calls/s of the target while warm (middle 80% of its requests) vs the bound;
- start-up (process start to the first request: imports, flow run, first task) and the
  remaining Prefect/flow overhead: wall time minus start-up minus busy time (some request
  in flight at the server), per Prefect task;
- peak RSS of the flow process;
- the cached re-run: wall time and requests sent (target: 0).

The fake server and a temporary Prefect API run in this process; each measured run is a
child process (its own peak RSS) pointed at that API.

``--gateway`` measures the gateway alone (no Prefect, no flow): calls per CPU-second of the
calling process (user + system time, ``time.process_time``), calls/s and CPU per call, through
LiteLLM and on the direct path, each with the SQLite call cache written and without a cache, and
with the progress callback the pipeline's shard tasks pass (``fanout.progress_callback``),
against the scripted server in another process (its CPU is not counted; 0 latency by default).
CPU per call hardly depends on what else the machine runs, so it compares well between runs
on a busy machine. The direct path's target is at least 1,000 calls per CPU-second.

    python benchmarks/throughput.py                            # 2k and 10k items, concurrency 8/32/64, LOO
    python benchmarks/throughput.py --sizes 2000 --concurrency 64 --no-loo
    python benchmarks/throughput.py --gateway --concurrency 64 # the gateway alone: both paths, cache on/off
    python benchmarks/throughput.py --sizes                     # PolicyBench LOO only: all 4 bases in one run
    python benchmarks/throughput.py --gateway --shared-limits   # limits counted in Redis (a throwaway redis-server)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POLICYBENCH = ROOT.parent / "shared" / "reference" / "policybench"
SHARD_SIZE = 128  # the evaluation config's default


# ----------------------------------------------------------------- scripted replies (cheap)


def reply(request: dict[str, Any]) -> str:
    """Target: answers items marked answerable, refuses the rest. Judge: always quality 5.
    KnowOrNot: HyDE answers, target answers, evaluator verdicts."""
    model = request.get("model")
    if model == "judge":
        return '{"quality": 5, "rationale": "matches"}'
    if model == "hyde":
        return '{"answers": ["A hypothetical answer about the policy."]}'
    if model == "eval":
        text = request["messages"][-1]["content"]
        return "Answered. <abstained>no</abstained>" if "<abstained>" in text else "Close. <tier>tier_1</tier>"
    text = request["messages"][-1]["content"]
    return "It is ref." if "(answerable)" in text else "REFUSE_MISSING"


# ----------------------------------------------------------------- inputs


def write_benchmark(path: Path, n: int) -> str:
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

    items = [
        BenchmarkItem(
            item_id=f"item{i}",
            base_id=f"b{i}",
            variant="single",
            perturbation_class="P-MissingInfo",
            intensity="LOW" if i % 2 == 0 else "HIGH",
            lever_id="lever",
            generator="gen",
            question=f"What is item {i}?" + (" (answerable)" if i % 2 == 0 else ""),
            context=f"Item {i} is described here; the answer is ref.",
            original_question="q",
            answers=["ref"],
            expected="ANSWER_CORRECTLY" if i % 2 == 0 else "REFUSE_INFO_MISSING_IN_CONTEXT",
        )
        for i in range(n)
    ]
    return ArtifactStore(path).write_records("benchmark.parquet", items, BenchmarkItem)


def models_yaml(url: str, names: list[str], concurrency: int) -> str:
    return "models:\n" + "".join(
        f"  {name}:\n    model: openai/{name}\n    api_base: {url}\n    max_concurrency: {concurrency}\n    timeout_s: 30\n"
        for name in names
    )


def limits_yaml() -> str:
    """The run config's ``limits:`` under ``--shared-limits`` (REFUSALBENCH_BENCH_LIMITS_URL), else nothing."""
    url = os.environ.get("REFUSALBENCH_BENCH_LIMITS_URL")
    return f"limits:\n  backend: redis\n  url: {url}\n" if url else ""


def write_eval_config(folder: Path, url: str, concurrency: int) -> Path:
    config = folder / "eval.yaml"
    config.write_text(
        models_yaml(url, ["target", "judge"], concurrency)
        + limits_yaml()
        + f"""cache:
  path: {folder / "calls.sqlite"}
evaluation:
  targets: [target]
  judge: judge
  bootstrap: 200
"""
    )
    return config


EMBEDDING_MODEL = "text-embedding-3-large"  # the KnowOrNot library's default embedding model


def write_loo_config(folder: Path, url: str, qa_files: list[Path], concurrency: int, embedder: str = "minilm") -> Path:
    """One knowledge base: qa_pairs; several: knowledge_bases, one per file. ``embedder``: ``minilm``
    (offline), or ``api``: an embedding model on the same server (``/v1/embeddings``), as the KnowOrNot
    library embeds through its client's embedding API."""
    config = folder / "loo.yaml"
    source = (
        f"  qa_pairs: {qa_files[0]}\n"
        if len(qa_files) == 1
        else "  knowledge_bases:\n" + "".join(f"    - {{name: {f.stem}, qa_pairs: {f}}}\n" for f in qa_files)
    )
    models = models_yaml(url, ["target", "hyde", "eval"], concurrency)
    embedding = f"  embedder: {embedder}\n"
    if embedder == "api":
        models += models_yaml(url, [EMBEDDING_MODEL], concurrency).removeprefix("models:\n")
        embedding += f"  embedding_model: {EMBEDDING_MODEL}\n"
    config.write_text(
        models
        + f"""cache:
  path: {folder / "calls.sqlite"}
knowornot:
{source}{embedding}  retrieval: [direct, long_context, basic_rag, hyde_rag]
  prompts: [basic]
  targets: [target]
  evaluator: eval
  extractor: hyde
  hyde_answers: 1
  filters: []
  label_sample: 0
"""
    )
    return config


# ----------------------------------------------------------------- child: one measured run


def child(kind: str, config: str, out: str, benchmark: str | None) -> None:
    from refusalbench.tasks.pipeline.runtime import configure_prefect_env

    configure_prefect_env()
    started_at = time.time()
    started = time.perf_counter()
    if kind == "evaluate":
        from refusalbench.flows.launch import run_evaluation

        run_evaluation(config, benchmark, out)
    else:
        from refusalbench.flows.launch import run_knowornot

        run_knowornot(config, out)
    wall = time.perf_counter() - started
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    print(
        json.dumps(
            {
                "started_at": started_at,
                "wall_s": wall,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "timings": manifest.get("timings_s", {}),
                "calls": manifest.get("calls", {}),
            }
        )
    )


def run_child(
    kind: str, config: Path | str, out: Path | str, benchmark: str | None, env: dict[str, str]
) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", kind, "--config", str(config), "--out", str(out)]
    if benchmark:
        args += ["--benchmark", benchmark]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------- server-side figures


def busy_seconds(arrivals: list[float], latency: float) -> float:
    """Length of the union of [arrival, arrival + latency]: time with a request in flight."""
    total, end = 0.0, -math.inf
    for start in sorted(arrivals):
        if start > end:
            total += latency
        else:
            total += max(0.0, start + latency - end)
        end = max(end, start + latency)
    return total


def warm_rate(arrivals: list[float]) -> float:
    """Requests per second over the middle 80% of a model's requests (start-up and tail excluded)."""
    times = sorted(arrivals)
    if len(times) < 10:
        return float("nan")
    lo, hi = int(0.1 * len(times)), int(0.9 * len(times))
    span = times[hi] - times[lo]
    return (hi - lo) / span if span > 0 else float("nan")


# ----------------------------------------------------------------- the gateway alone


def gateway_child(url: str, direct: bool, calls: int, concurrency: int, cache: str | None) -> None:
    """One measured batch of ``calls`` through a fresh gateway (after one warm-up call), with the
    progress callback a shard task passes."""
    from pydantic import BaseModel

    from refusalbench.tasks.core.config import ModelConfig
    from refusalbench.tasks.llm.callcache import SQLiteCache
    from refusalbench.tasks.llm.gateway import CallSpec, Gateway
    from refusalbench.tasks.pipeline.fanout import progress_callback

    class Verdict(BaseModel):
        verdict: str
        score: int

    model = ModelConfig(
        model="openai/bench",
        api_base=url,
        max_concurrency=concurrency,
        timeout_s=60,
        params={"temperature": 0.0, "max_tokens": 256},
    )
    gateway = Gateway(
        {"bench": model},
        SQLiteCache(cache) if cache else None,
        direct_http=direct,
        limits_url=os.environ.get("REFUSALBENCH_BENCH_LIMITS_URL"),
    )
    context = "Some context about the question, long enough to look like a prompt. " * 12

    def spec(i: int) -> CallSpec:
        messages = [
            {"role": "system", "content": "You answer questions about the context."},
            {"role": "user", "content": f"<context>{context}</context> Question {i}: what is it?"},
        ]
        return CallSpec(model="bench", messages=messages, schema=Verdict if i % 2 else None)

    gateway.complete_many([spec(-1)])  # warm-up: imports, first connection
    on_result = progress_callback("respond bench", calls)  # as a shard task makes it (imports Prefect's context)
    cpu, wall = time.process_time(), time.perf_counter()
    results = gateway.complete_many([spec(i) for i in range(calls)], on_result)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        json.dumps(
            {
                "path": "direct" if direct else "litellm",
                "calls": calls,
                "concurrency": concurrency,
                "limits": "redis" if os.environ.get("REFUSALBENCH_BENCH_LIMITS_URL") else "process",
                "ok": sum(r.ok for r in results),
                "wall_s": wall,
                "calls_per_s": calls / wall,
                "cpu_ms_per_call": 1000 * cpu / calls,
                "calls_per_cpu_s": calls / cpu,
                "cached": bool(cache),
            }
        )
    )


def measure_gateway(
    calls: int, concurrency: int, latency: float, work: Path, litellm_calls: int | None = None
) -> list[dict[str, Any]]:
    """Both paths, with and without the call cache, against the scripted server in its own process
    (so it does not share our GIL and its CPU is not ours)."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "refusalbench.tasks.llm.scripted_server",
            "--port",
            str(port),
            "--latency",
            str(latency),
            "--responder",
            "dry-run",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        rows = []
        for direct in (False, True):
            for cached in (True, False):
                n = calls if direct else (litellm_calls or calls)
                args = [
                    sys.executable,
                    __file__,
                    "--child",
                    "gateway",
                    "--url",
                    f"http://127.0.0.1:{port}/v1",
                    "--direct" if direct else "--no-direct",
                    "--calls",
                    str(n),
                    "--concurrency",
                    str(concurrency),
                ]
                if cached:
                    args += ["--cache", str(work / f"gateway-{direct}-{concurrency}.sqlite")]
                done = subprocess.run(
                    args, capture_output=True, text=True, timeout=3600, env=dict(os.environ, PYTHONPATH=str(ROOT))
                )
                if done.returncode != 0:
                    raise RuntimeError(f"gateway run failed:\n{done.stderr[-4000:]}")
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                rows[-1]["bound_calls_per_s"] = concurrency / latency if latency > 0 else None
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return rows
    finally:
        server.terminate()
        server.wait(10)


def print_gateway_table(rows: list[dict[str, Any]], latency: float) -> None:
    print(
        f"\n### The gateway alone, scripted server (another process) at {latency * 1000:.0f} ms per call, "
        "with the pipeline's progress callback\n"
    )
    print(
        "| path | call cache | limits | calls | concurrency | calls per CPU-second | CPU ms per call | calls/s "
        "| bound calls/s | % of bound |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bound = r.get("bound_calls_per_s")
        share = f"{100 * r['calls_per_s'] / bound:.0f}%" if bound else "-"
        print(
            f"| {r['path']} | {'SQLite, written' if r['cached'] else 'none'} | {r['limits']} | {r['calls']} "
            f"| {r['concurrency']} | **{r['calls_per_cpu_s']:.0f}** | {r['cpu_ms_per_call']:.3f} | {r['calls_per_s']:.0f} "
            f"| {f'{bound:.0f}' if bound else 'unbounded'} | {share} |"
        )
    direct = [r["calls_per_cpu_s"] for r in rows if r["path"] == "direct"]
    if direct:
        print(f"\nDirect path: {min(direct):.0f} calls per CPU-second at worst (target: at least 1,000).")


# ----------------------------------------------------------------- driver


def measure_evaluation(
    server, env: dict[str, str], work: Path, n: int, concurrency: int, latency: float
) -> dict[str, Any]:
    folder = work / f"eval-{n}-{concurrency}"
    folder.mkdir(parents=True)
    benchmark = write_benchmark(folder / "bench", n)
    config = write_eval_config(folder, server.url, concurrency)
    before = len(server.calls)
    first = run_child("evaluate", config, folder / "run1", benchmark, env)
    calls = server.calls[before:]
    target = [c["time"] for c in calls if c["model"] == "target"]
    judge = [c["time"] for c in calls if c["model"] == "judge"]
    busy = busy_seconds([c["time"] for c in calls], latency)
    # Start-up: process start to the first request (imports, flow run, first task, LiteLLM import).
    startup = min(c["time"] for c in calls) - first["started_at"]
    n_tasks = 2 * math.ceil(n / SHARD_SIZE)  # respond + judge shards
    middle = len(server.calls)
    second = run_child("evaluate", config, folder / "run2", benchmark, env)
    bound = concurrency / latency
    rate = warm_rate(target)
    return {
        "items": n,
        "concurrency": concurrency,
        "calls": len(calls),
        "target_calls": len(target),
        "judge_calls": len(judge),
        "bound_per_model": bound,
        "warm_rate": rate,
        "warm_pct": 100 * rate / bound,
        "judge_rate": warm_rate(judge),
        "overall_rate": len(calls) / first["wall_s"],
        "max_inflight": server.max_inflight,
        "wall_s": first["wall_s"],
        "busy_s": busy,
        "startup_s": startup,
        "overhead_per_task_s": (first["wall_s"] - startup - busy) / n_tasks,
        "tasks": n_tasks,
        "maxrss_mib": first["maxrss_mib"],
        "stage_s": first["timings"],
        "cached_wall_s": second["wall_s"],
        "cached_calls": len(server.calls) - middle,
        "cached_maxrss_mib": second["maxrss_mib"],
    }


def measure_loo(
    server, env: dict[str, str], work: Path, concurrency: int, mode: str = "one-run"
) -> list[dict[str, Any]]:
    if mode == "one-run":
        return measure_loo_one_run(server, env, work, concurrency)
    rows = []
    for qa_file in sorted(POLICYBENCH.glob("*.json")):
        folder = work / f"loo-{qa_file.stem}"
        folder.mkdir(parents=True)
        questions = len(json.loads(qa_file.read_text(encoding="utf-8"))["questions"])
        config = write_loo_config(folder, server.url, [qa_file], concurrency)
        before = len(server.calls)
        first = run_child("knowornot", config, folder / "run1", None, env)
        calls = len(server.calls) - before
        middle = len(server.calls)
        second = run_child("knowornot", config, folder / "run2", None, env)
        rows.append(
            {
                "kb": qa_file.stem,
                "questions": questions,
                "experiments": questions * 4,
                "calls": calls,
                "wall_s": first["wall_s"],
                "maxrss_mib": first["maxrss_mib"],
                "cached_wall_s": second["wall_s"],
                "cached_calls": len(server.calls) - middle,
            }
        )
    return rows


def measure_loo_one_run(server, env: dict[str, str], work: Path, concurrency: int) -> list[dict[str, Any]]:
    """All four knowledge bases in one KnowOrNot run (``knowornot.knowledge_bases``): one command,
    one process, each base leave-one-out within itself, every call sharing the target's concurrency."""
    files = sorted(POLICYBENCH.glob("*.json"))
    folder = work / "loo-all"
    folder.mkdir(parents=True)
    config = write_loo_config(folder, server.url, files, concurrency)
    before = len(server.calls)
    first = run_child("knowornot", config, folder / "run1", None, env)
    calls = len(server.calls) - before
    middle = len(server.calls)
    second = run_child("knowornot", config, folder / "run2", None, env)
    questions = sum(len(json.loads(f.read_text(encoding="utf-8"))["questions"]) for f in files)
    for run in ("run1", "run2"):  # where the time went, stage by stage (stderr: not part of the table)
        print(run, json.loads((folder / run / "manifest.json").read_text())["timings_s"], file=sys.stderr, flush=True)
    return [
        {
            "kb": f"{len(files)} bases, one run",
            "questions": questions,
            "experiments": questions * 4,
            "calls": calls,
            "wall_s": first["wall_s"],
            "maxrss_mib": first["maxrss_mib"],
            "cached_wall_s": second["wall_s"],
            "cached_calls": len(server.calls) - middle,
            "process": True,
        }
    ]


def print_tables(evals: list[dict[str, Any]], loo: list[dict[str, Any]] | None, latency: float) -> None:
    if evals:
        print_evaluation_table(evals, latency)
    if loo is not None:
        print_loo_table(loo)


def print_evaluation_table(evals: list[dict[str, Any]], latency: float) -> None:
    print(
        f"\n### Evaluation flow, fake provider at {latency * 1000:.0f} ms per call (target + judge, each at the concurrency)\n"
    )
    print(
        "| items | conc. | calls | bound/model (calls/s) | target warm calls/s | % of bound | judge warm calls/s "
        "| wall s | start-up s | busy s | other overhead/task s | peak RSS MiB | cached re-run s | cached calls |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in evals:
        print(
            f"| {r['items']} | {r['concurrency']} | {r['calls']} | {r['bound_per_model']:.0f} | {r['warm_rate']:.1f} "
            f"| {r['warm_pct']:.0f}% | {r['judge_rate']:.1f} | {r['wall_s']:.1f} | {r['startup_s']:.1f} | {r['busy_s']:.1f} "
            f"| {r['overhead_per_task_s']:.2f} ({r['tasks']} tasks) | {r['maxrss_mib']:.0f} | {r['cached_wall_s']:.1f} "
            f"| {r['cached_calls']} |"
        )


def print_loo_table(loo: list[dict[str, Any]]) -> None:
    print("\n### KnowOrNot leave-one-out, PolicyBench (4 retrieval modes x 1 prompt x 1 target), same fake provider\n")
    print(
        "| knowledge base | questions | experiments | calls | wall s | peak RSS MiB | cached re-run s | cached calls |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def cell(value: Any) -> str:
        return "" if value is None else str(value)

    for r in loo:
        print(
            f"| {r['kb']} | {r['questions']} | {r['experiments']} | {cell(r['calls'])} | {r['wall_s']:.1f} "
            f"| {r['maxrss_mib']:.0f} | {r['cached_wall_s']:.1f} | {cell(r['cached_calls'])} |"
        )
    if any(r.get("process") for r in loo):
        return  # the last row is the one process's total
    total = {
        k: sum(r[k] for r in loo)
        for k in ("questions", "experiments", "calls", "wall_s", "cached_wall_s", "cached_calls")
    }
    print(
        f"| **total (4 processes)** | {total['questions']} | {total['experiments']} | {total['calls']} | {total['wall_s']:.1f} | "
        f"| {total['cached_wall_s']:.1f} | {total['cached_calls']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2000, 10000], help="benchmark sizes (none: LOO only)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument(
        "--latency",
        type=float,
        default=None,
        help="the scripted server's seconds per reply (default 0.1; 0 with --gateway)",
    )
    parser.add_argument("--loo", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--loo-concurrency", type=int, default=32)
    parser.add_argument(
        "--loo-mode",
        choices=["one-run", "processes"],
        default="one-run",
        help="the 4 knowledge bases in one run (knowornot.knowledge_bases: one command), or one process per base",
    )
    parser.add_argument("--json", help="also write the raw figures to this file")
    parser.add_argument("--gateway", action="store_true", help="measure the gateway alone, LiteLLM vs direct path")
    parser.add_argument("--calls", type=int, default=3000, help="calls per direct-path run with --gateway")
    parser.add_argument(
        "--litellm-calls",
        type=int,
        default=1000,
        help="calls per LiteLLM-path run with --gateway (about 10x the CPU per call)",
    )
    parser.add_argument(
        "--shared-limits",
        action="store_true",
        help="count the models' limits in Redis (limits.backend: redis) on a throwaway redis-server",
    )
    parser.add_argument("--child", choices=["evaluate", "knowornot", "gateway"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--benchmark", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.latency is None:
        args.latency = 0.0 if args.gateway else 0.1
    if args.child == "gateway":
        gateway_child(args.url, args.direct, args.calls, args.concurrency[0], args.cache)
        return
    if args.child:
        child(args.child, args.config, args.out, args.benchmark)
        return
    with contextlib.ExitStack() as stack:
        if args.shared_limits:
            os.environ["REFUSALBENCH_BENCH_LIMITS_URL"] = stack.enter_context(throwaway_redis())
        measure(args)


@contextlib.contextmanager
def throwaway_redis():
    """A redis-server on a free loopback port, without persistence, for as long as the benchmark runs."""
    import shutil
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--shared-limits needs redis-server (Debian package redis-server)")
    server = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


def measure(args: argparse.Namespace) -> None:
    if args.gateway:
        with tempfile.TemporaryDirectory(prefix="refusalbench-gateway-") as tmp:
            rows = [
                row
                for c in args.concurrency
                for row in measure_gateway(args.calls, c, args.latency, Path(tmp), args.litellm_calls)
            ]
        print_gateway_table(rows, args.latency)
        if args.json:
            Path(args.json).write_text(json.dumps({"gateway": rows}, indent=2))
        return

    with tempfile.TemporaryDirectory(prefix="refusalbench-throughput-") as tmp:
        work = Path(tmp)
        os.environ["PREFECT_HOME"] = str(work / "prefect-home")
        from refusalbench.tasks.pipeline.runtime import configure_prefect_env

        configure_prefect_env()
        import prefect.settings
        from prefect.testing.utilities import prefect_test_harness

        from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

        with (
            prefect_test_harness(server_startup_timeout=180),
            ScriptedLLMServer(responder=reply, latency_s=args.latency) as server,
        ):
            env = dict(
                os.environ,
                PYTHONPATH=str(ROOT),
                PREFECT_API_URL=str(prefect.settings.PREFECT_API_URL.value()),
                REFUSALBENCH_CACHE_DIR=str(work / "cache"),
            )
            evals = []
            for n in args.sizes:
                for concurrency in args.concurrency:
                    server.max_inflight = 0
                    evals.append(measure_evaluation(server, env, work, n, concurrency, args.latency))
                    print(json.dumps(evals[-1]), file=sys.stderr, flush=True)
            loo = None
            if args.loo:
                if not (ROOT / "flows" / "knowornot.py").exists() or not POLICYBENCH.is_dir():
                    print(
                        "LOO experiment skipped: flows/knowornot.py or the PolicyBench data is missing", file=sys.stderr
                    )
                else:
                    loo = measure_loo(server, env, work, args.loo_concurrency, args.loo_mode)
                    print(json.dumps(loo), file=sys.stderr, flush=True)
    print_tables(evals, loo, args.latency)
    if args.json:
        Path(args.json).write_text(json.dumps({"evaluation": evals, "loo": loo}, indent=2))


if __name__ == "__main__":
    main()
