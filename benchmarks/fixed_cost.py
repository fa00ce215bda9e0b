"""Fixed cost of one ``refusalbench`` process, measured as a user meets it: embedded mode.

Every measured run is a whole ``refusalbench evaluate`` process, started the way a user
types it: no ``PREFECT_API_URL`` (Prefect's API is the background server that the first
command starts, ``tasks/pipeline/prefect_server.py``), its own ``PREFECT_HOME``, a new run
folder. The very first command (a fresh ``PREFECT_HOME``: it starts the server, which creates
Prefect's database) is timed on its own. For each size N a
benchmark of N items and a config (a target and a judge on the scripted server, replying
after ``--latency``) are written. First runs, each with an empty call cache (``--first``
per size, the first of which fills the cache the re-runs use): a run's wall time less its
call phase (some request in flight at the server) is the time it spends outside its calls.
Then cached re-runs (no call may reach the server):

- warm: the background server already runs (every command after the first), ``--repeat``
  times per size, sizes interleaved so that machine noise spreads over all of them;
- cold: the server stopped first (``refusalbench api stop``), so the command starts it.

Per process it prints the wall time, and from ``manifest.json`` the part before the flow's
stages (interpreter, imports, input checks, Prefect flow run), the stages, and the part
after them (flow-run end, exit). The fixed cost is the intercept of a least-squares line
through the warm medians against N: what a process costs before its first item.

    python benchmarks/fixed_cost.py                        # sizes 20, 200, 2000: 3 first runs, 7 warm re-runs each
    python benchmarks/fixed_cost.py --sizes 200 --repeat 11 --cold 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import busy_seconds, models_yaml, reply, write_benchmark  # noqa: E402  (the same items and replies)


def command() -> list[str]:
    script = Path(sys.executable).with_name("refusalbench")
    return [str(script)] if script.exists() else [sys.executable, "-m", "refusalbench.flows.cli"]


def write_config(folder: Path, url: str, cache: str = "calls.sqlite") -> Path:
    config = folder / f"eval-{Path(cache).stem}.yaml"
    config.write_text(
        models_yaml(url, ["target", "judge"], 16)
        + f"""cache:
  path: {folder / cache}
evaluation:
  targets: [target]
  judge: judge
"""
    )
    return config


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def run_once(config: Path, benchmark: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    started_at = time.time()
    started = time.perf_counter()
    done = subprocess.run(
        [*command(), "evaluate", "--config", str(config), "--benchmark", benchmark, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"evaluate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    stages = sum(manifest["timings_s"].values())
    flow_start, flow_end = _epoch(manifest["created_at"]), _epoch(manifest["finished_at"])
    return {
        "wall_s": wall,
        "before_s": flow_start - started_at,
        "stages_s": stages,
        "after_s": started_at + wall - flow_end,
        "timings_s": manifest["timings_s"],
    }


def summary(items: int, kind: str, runs: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {
        "items": items,
        "kind": kind,
        "runs": len(runs),
        "wall_s": median("wall_s"),
        "min_wall_s": min(r["wall_s"] for r in runs),
        "before_s": median("before_s"),
        "stages_s": median("stages_s"),
        "after_s": median("after_s"),
        "calls": calls,
    }


def intercept_and_slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares: wall = intercept + slope x items."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return mean_y - slope * mean_x, slope


def cpu_check_s() -> float:
    """Seconds for a fixed pure-Python loop: how fast this machine runs Python just now (on a
    shared virtual machine it varies by a third from hour to hour; compare runs by it)."""
    started = time.perf_counter()
    sum(i * i for i in range(5_000_000))
    return time.perf_counter() - started


def server_rss_mib(home: Path) -> float | None:
    from refusalbench.tasks.pipeline.prefect_server import running_server

    server = running_server(home)
    try:
        for line in Path(f"/proc/{server['pid']}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, TypeError):
        return None
    return None


def print_first_runs(runs: dict[int, list[dict[str, Any]]], latency: float) -> None:
    print(
        f"First runs (an empty call cache each, the server warm, {1000 * latency:.0f} ms per call, concurrency 16):\n"
    )
    print("| items | runs | calls | wall s (median) | call phase s | outside the call phase s (median) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, rows in runs.items():
        outside = statistics.median(r["wall_s"] - r["busy_s"] for r in rows)
        print(
            f"| {n:,} | {len(rows)} | {rows[0]['calls']:,} | {statistics.median(r['wall_s'] for r in rows):.2f} | "
            f"{statistics.median(r['busy_s'] for r in rows):.2f} | {outside:.2f} |"
        )
    if len(runs) > 1:
        intercept, _ = intercept_and_slope(
            [(n, statistics.median(r["wall_s"] - r["busy_s"] for r in rows)) for n, rows in runs.items()]
        )
        print(f"\ntime outside the call phase at 0 items (intercept): {intercept:.2f} s")
    print()


def print_table(rows: list[dict[str, Any]]) -> None:
    print("Cached re-runs (every call served by the call cache):\n")
    print(
        "| items | server | runs | wall s (median) | fastest s | before the stages s | stages s | after s | calls sent |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['items']:,} | {r['kind']} | {r['runs']} | {r['wall_s']:.2f} | {r['min_wall_s']:.2f} | "
            f"{r['before_s']:.2f} | {r['stages_s']:.2f} | {r['after_s']:.2f} | {r['calls']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 2000])
    parser.add_argument("--repeat", type=int, default=7, help="warm re-runs per size")
    parser.add_argument("--first", type=int, default=3, help="first runs (each with an empty call cache) per size")
    parser.add_argument(
        "--cold", type=int, default=3, help="cold re-runs (server stopped first) of the size nearest 200"
    )
    parser.add_argument("--latency", type=float, default=0.1, help="seconds the scripted server takes per reply")
    parser.add_argument("--json", help="also write the raw figures to this file")
    args = parser.parse_args()

    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

    checks = [cpu_check_s()]
    with (
        tempfile.TemporaryDirectory(prefix="refusalbench-fixed-cost-") as tmp,
        ScriptedLLMServer(responder=reply, latency_s=args.latency) as server,
        contextlib.ExitStack() as cleanup,
    ):
        work = Path(tmp)
        home = work / "prefect-home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
        env.update(PREFECT_HOME=str(home), PYTHONPATH=str(ROOT))
        from refusalbench.tasks.pipeline.prefect_server import stop_background_server

        cleanup.callback(stop_background_server, home)  # whatever happens, before the folder goes
        # A first command starts the server, which creates Prefect's database, so the first
        # runs below are measured as every later command meets them.
        prime = work / "prime"
        prime.mkdir()
        very_first = run_once(write_config(prime, server.url), write_benchmark(prime / "bench", 1), prime / "run", env)
        inputs: dict[int, tuple[Path, str, Path]] = {}
        first: dict[int, list[dict[str, Any]]] = {n: [] for n in args.sizes}
        for n in args.sizes:
            folder = work / f"items-{n}"
            folder.mkdir()
            inputs[n] = (write_config(folder, server.url), write_benchmark(folder / "bench", n), folder)
        for index in range(args.first):
            for n in args.sizes:
                config, benchmark, folder = inputs[n]
                if index:  # the first of them fills the cache the re-runs use; the others start empty too
                    config = write_config(folder, server.url, cache=f"calls-{index}.sqlite")
                sent = len(server.calls)
                filled = run_once(config, benchmark, folder / f"first-{index}", env)
                arrivals = [c["time"] for c in server.calls[sent:]]
                first[n].append({**filled, "calls": len(arrivals), "busy_s": busy_seconds(arrivals, args.latency)})

        counter = iter(range(10**9))
        warm: dict[int, list[dict[str, Any]]] = {n: [] for n in args.sizes}
        before_calls = len(server.calls)
        for _ in range(args.repeat):
            for n in args.sizes:
                config, benchmark, folder = inputs[n]
                warm[n].append(run_once(config, benchmark, folder / f"run-{next(counter)}", env))
        warm_calls = len(server.calls) - before_calls
        rss = server_rss_mib(home)

        cold_size = min(args.sizes, key=lambda n: abs(n - 200))
        cold = []
        for _ in range(args.cold):
            stop_background_server(home)
            config, benchmark, folder = inputs[cold_size]
            cold.append(run_once(config, benchmark, folder / f"run-{next(counter)}", env))
        cold_calls = len(server.calls) - before_calls - warm_calls
    checks.append(cpu_check_s())

    print(
        f"The very first command (1 item, a fresh PREFECT_HOME: it starts the server, which creates Prefect's "
        f"database): {very_first['wall_s']:.2f} s wall, {very_first['before_s']:.2f} s before the stages\n"
    )

    print_first_runs(first, args.latency)
    rows = [summary(n, "warm", warm[n], warm_calls) for n in args.sizes]
    if cold:
        rows.append(summary(cold_size, "cold", cold, cold_calls))
    print_table(rows)
    if len(args.sizes) > 1:
        intercept, slope = intercept_and_slope([(r["items"], r["wall_s"]) for r in rows if r["kind"] == "warm"])
        print(
            f"\nfixed cost (intercept of the warm medians): {intercept:.2f} s; each 1,000 cached items add {1000 * slope:.2f} s"
        )
    if rss is not None:
        print(f"the background server's resident memory after the warm runs: {rss:.0f} MiB")
    print(f"CPU check (a fixed Python loop) before and after: {checks[0]:.2f} s, {checks[1]:.2f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "very_first": very_first,
                    "first": first,
                    "rows": rows,
                    "warm": warm,
                    "cold": cold,
                    "cpu_check_s": checks,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
