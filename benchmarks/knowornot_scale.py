"""Where the time of KnowOrNot's PolicyBench leave-one-out goes, in one command (issue 29).

The run: the 331 released PolicyBench questions, all four knowledge bases in one KnowOrNot run
(``knowornot.knowledge_bases``, each base leave-one-out within itself), 4 retrieval modes x 1
prompt x 1 target, filters off, HyDE from an extractor model, an evaluator; every model at
concurrency 32 against the scripted server at 100 ms per reply (``benchmarks/throughput.py``'s
replies and config). ``--embedder api`` (the default) embeds through an embedding model on the same
server (``/v1/embeddings``, ``text-embedding-3-large``), as the KnowOrNot library does through its
LLM client's embedding API, so the comparison is like for like; ``--embedder minilm`` encodes with
all-MiniLM-L6-v2 on this machine's CPUs instead. The run is one child process running the command
line's ``refusalbench knowornot run`` (its ``main``, garbage collector tuned as the entry point tunes
it); the Prefect API is a temporary one in this process, already up (as embedded mode's background
server is after the first command). Then the same run again over the same call cache (0 calls).
The last line printed (``HEADLINE ...``) is the figure to compare: seconds, x the library, calls,
the call-phase bound, the cached re-run.

Printed per stage: wall time, the time some call was in flight, and the rest broken down into
embedding model load, encoding, FAISS, Parquet/JSON I/O, metrics, report and what is left
(Prefect orchestration and other Python), with the CPU seconds of each; before the first stage:
process start-up. The call-phase bound is each model's calls / concurrency x latency: summed
over HyDE -> answers -> evaluations (the issue's "calls need about 7 s"), and the largest one
(the floor when every model's calls overlap). The KnowOrNot library is not installable here
(not on the package registries this machine reaches), so its time is the issue's measurement
on the same server (``--library-s``, 104.8 s) and the ratio is printed against it.

    python benchmarks/knowornot_scale.py                         # the headline figure + breakdown
    python benchmarks/knowornot_scale.py --baseline /tmp/old    # also an older checkout, same server
    python benchmarks/knowornot_scale.py --profile py-spy       # + a sampling profile of the first run
    python benchmarks/knowornot_scale.py --embedder minilm      # MiniLM on the CPUs (its encode is a floor)

``--baseline DIR`` runs a checkout at DIR (e.g. ``git archive HEAD | tar -x -C DIR``) first,
through a shim package on PYTHONPATH, so both trees meet the same server and API.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import POLICYBENCH, reply, write_loo_config  # noqa: E402  (the same replies and config)

LIBRARY_S = 104.8  # the KnowOrNot library on the same server and shape (issue 29's measurement)
MODELS = ("hyde", "target", "eval")  # HyDE -> answers -> evaluations
PROFILE_PATH = Path(tempfile.gettempdir()) / "knowornot-scale-profile"  # .txt (py-spy) or .pstats (cProfile)
PACKAGES = ("configs", "deployments", "flows", "levers", "prompts", "tasks")

# What the child times, by category: (module, owner attribute path). Missing ones are skipped,
# so the script measures older and newer trees alike. Categories may nest (metrics reads Parquet).
TIMED = {
    "embedding model load": [("refusalbench.tasks.knowornot.stages.embeddings", "MiniLMEmbedder._load")],
    # The api embedder's time includes its requests; those count as calls in flight, the rest as encode.
    "embedding encode": [
        ("refusalbench.tasks.knowornot.stages.embeddings", f"{name}.embed")
        for name in ("MiniLMEmbedder", "ApiEmbedder")
    ],
    "FAISS": [
        ("refusalbench.tasks.knowornot.stages.retrieval", name)
        for name in ("build_index", "index_to_bytes", "index_from_bytes", "search_excluding")
    ],
    "Parquet/JSON I/O": [
        ("refusalbench.tasks.core.store", f"ArtifactStore.{name}")
        for name in ("save", "load", "read_records", "write_records")
    ],
    "metrics": [("refusalbench.tasks.knowornot.report.contents", "write_results")],
    "report": [("refusalbench.tasks.knowornot.report.contents", "publish_report")],
}


# ----------------------------------------------------------------- child: the measured command


def child(config: str, out: str, intervals_path: str) -> None:
    """One KnowOrNot run as ``refusalbench knowornot run`` makes it (the command line's ``main``, with the
    garbage collector tuned as its ``command`` entry point tunes it), with timers around the parts."""
    started = time.time()
    from refusalbench.flows import cli
    from refusalbench.tasks.pipeline import gc_tuning

    gc_tuning.start_up()
    intervals: list[tuple[str, float, float, float]] = []  # (category, start, end, CPU s of its thread)
    stages: list[tuple[str, float, float]] = []
    tasks = collections.Counter()
    from refusalbench.tasks.pipeline.runtime import configure_prefect_env

    configure_prefect_env()
    _instrument(intervals, stages, tasks)
    cpu_samples = _sample_cpu()
    imported = time.time()
    try:
        cli.main(["knowornot", "run", "--config", config, "--out", out])
    finally:
        finished = time.time()
        Path(intervals_path).write_text(
            json.dumps(
                {
                    "started": started,
                    "imported": imported,
                    "finished": finished,
                    "intervals": intervals,
                    "stages": stages,
                    "task_runs": dict(tasks),
                    "cpu_s": time.process_time(),
                    "cpu_samples": cpu_samples,
                    "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
        )
        gc_tuning.at_exit()


def _sample_cpu(every_s: float = 0.1) -> list[tuple[float, float]]:
    """(wall, process CPU s) every ``every_s`` on a daemon thread, so each stage's CPU can be read off."""
    import threading

    samples = [(time.time(), time.process_time())]

    def sample() -> None:
        while True:
            time.sleep(every_s)
            samples.append((time.time(), time.process_time()))

    threading.Thread(target=sample, name="cpu-sampler", daemon=True).start()
    return samples


def _cpu_between(samples: list[tuple[float, float]], lo: float, hi: float) -> float | None:
    """Process CPU seconds spent in [lo, hi], from the samples (None outside them)."""
    import bisect

    if not samples or hi < samples[0][0] or lo > samples[-1][0]:
        return None
    walls = [w for w, _ in samples]

    def at(t: float) -> float:
        i = bisect.bisect_left(walls, t)
        if i <= 0:
            return samples[0][1]
        if i >= len(samples):
            return samples[-1][1]
        (w0, c0), (w1, c1) = samples[i - 1], samples[i]
        return c0 + (c1 - c0) * (t - w0) / (w1 - w0 or 1)

    return at(hi) - at(lo)


def _instrument(intervals: list, stages: list, tasks: collections.Counter) -> None:
    import importlib

    def timed(category: str, function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.time(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                intervals.append((category, wall, time.time(), time.thread_time() - cpu))

        return wrapper

    for category, targets in TIMED.items():
        for module_name, path in targets:
            owner: Any = importlib.import_module(module_name)
            *parents, attr = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            if hasattr(owner, attr):
                setattr(owner, attr, timed(category, getattr(owner, attr)))

    from refusalbench.tasks.core.provenance import ManifestRecorder

    add_time = ManifestRecorder._add_time

    def stage_done(self: Any, name: str, seconds: float) -> Any:  # both recorder.stage and recorder.timing end here
        now = time.time()
        stages.append((name, now - seconds, now))
        return add_time(self, name, seconds)

    ManifestRecorder._add_time = stage_done

    from prefect.tasks import Task

    for method in ("submit", "__call__", "map"):
        original = getattr(Task, method)

        def counted(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            tasks[self.name] += 1
            return __original(self, *args, **kwargs)

        setattr(Task, method, counted)


# ----------------------------------------------------------------- parent: server, runs, breakdown


def union(spans: list[tuple[float, float]], lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Length of the union of the spans, clipped to [lo, hi]."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((max(a, lo), min(b, hi)) for a, b in spans):
        if stop <= start:
            continue
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def shim(code: Path, work: Path) -> str:
    """A ``refusalbench`` package whose folders are another checkout's (PYTHONPATH wins over the editable install)."""
    package = work / f"shim-{code.name}" / "refusalbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in PACKAGES:
        (package / name).symlink_to(code / name)
    return str(package.parent)


def run_once(
    server: Any, env: dict[str, str], config: Path, out: Path, work: Path, latency: float, profile: str | None
) -> dict[str, Any]:
    intervals = work / f"{out.name}-intervals.json"
    command = [
        sys.executable,
        __file__,
        "--child",
        "--config",
        str(config),
        "--out",
        str(out),
        "--intervals",
        str(intervals),
    ]
    if profile == "py-spy":
        command = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--rate",
            "100",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(PROFILE_PATH.with_suffix(".txt")),
            "--",
            *command,
        ]
    elif profile == "cprofile":
        command = [sys.executable, "-m", "cProfile", "-o", str(PROFILE_PATH.with_suffix(".pstats")), *command[1:]]
    before = len(server.calls)
    launched = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    exited = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"the KnowOrNot run failed:\n{done.stderr[-4000:]}")
    measured = json.loads(intervals.read_text())
    calls = server.calls[before:]
    return {
        "launched": launched,
        "exited": exited,
        "wall_s": exited - launched,
        "calls": calls,
        "latency": latency,
        **measured,
    }


def breakdown(run: dict[str, Any]) -> dict[str, Any]:
    """Per stage: wall, call in flight, each timed category outside the calls, and the rest."""
    flights = [(c["time"], c.get("finished", c["time"] + run["latency"])) for c in run["calls"]]
    spans: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    cpu: dict[str, float] = collections.defaultdict(float)
    for category, start, end, seconds in run["intervals"]:
        spans[category].append((start, end))
        cpu[category] += seconds
    first_stage = min((s for _, s, _ in run["stages"]), default=run["finished"])
    windows = [("start-up (process start to the first stage)", run["launched"], first_stage)]
    windows += [(name, start, end) for name, start, end in sorted(run["stages"], key=lambda s: s[1])]
    last_stage = max((e for _, _, e in run["stages"]), default=first_stage)
    windows.append(("after the last stage: flow run ends", last_stage, run["finished"]))
    windows.append(("process exit", run["finished"], run["exited"]))
    rows = []
    for name, lo, hi in windows:
        in_flight = union(flights, lo, hi)
        parts = {}
        seen = list(flights)
        for category in TIMED:
            # Each category counts only its time outside the calls and the categories before it.
            parts[category] = union(seen + spans[category], lo, hi) - union(seen, lo, hi)
            seen += spans[category]
        cpu_s = _cpu_between([tuple(s) for s in run.get("cpu_samples", [])], lo, hi)
        rows.append(
            {
                "stage": name,
                "wall_s": hi - lo,
                "cpu_s": cpu_s,
                "in_flight_s": in_flight,
                **parts,
                "rest_s": hi - lo - union(seen, lo, hi),
            }
        )
    per_model = collections.Counter(c["model"] for c in run["calls"])
    return {
        "rows": rows,
        "calls": len(run["calls"]),
        "per_model": dict(per_model),
        "cpu": dict(cpu),
        "cpu_s": run["cpu_s"],
        "task_runs": run["task_runs"],
        "wall_s": run["wall_s"],
        "in_flight_s": union(flights),
        "maxrss_mib": run["maxrss_mib"],
        "first_call_s": min((c["time"] for c in run["calls"]), default=run["exited"]) - run["launched"],
    }


def bounds(per_model: dict[str, int], concurrency: int, latency: float) -> tuple[float, float]:
    """(chain bound: HyDE + answers + evaluations back to back, overlap bound: the busiest model alone)."""
    each = [per_model.get(m, 0) / concurrency * latency for m in MODELS]
    return sum(each), max(each)


def print_breakdown(label: str, result: dict[str, Any], concurrency: int, latency: float, under_load: bool) -> None:
    load = " (under load)" if under_load else ""
    print(
        f"\n### {label}: {result['wall_s']:.1f} s wall{load}, {result['cpu_s']:.1f} s CPU, {result['calls']} calls "
        f"({', '.join(f'{m} {n}' for m, n in sorted(result['per_model'].items()))}), first call at "
        f"{result['first_call_s']:.1f} s, peak RSS {result['maxrss_mib']:.0f} MiB\n"
    )
    columns = ["in_flight_s", *TIMED, "rest_s"]
    print("| stage | wall s | CPU s | " + " | ".join(c.removesuffix("_s").replace("_", " ") for c in columns) + " |")
    print("|---|---:|---:|" + "---:|" * len(columns))
    for row in result["rows"]:
        cpu = "" if row.get("cpu_s") is None else f"{row['cpu_s']:.2f}"
        print(
            f"| {row['stage']} | {row['wall_s']:.2f} | {cpu} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |"
        )
    print(
        "\nCPU s inside the timed parts (threads add up): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(result["cpu"].items()))
    )
    print(
        "Prefect task runs: "
        + (", ".join(f"{k} {v}" for k, v in sorted(result["task_runs"].items())) or "none")
        + f" ({sum(result['task_runs'].values())} in all)"
    )


def summarise_py_spy(path: Path, top: int = 25) -> None:
    """Self and inclusive samples of the raw py-spy profile (all threads, idle excluded)."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if frames:
            own[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += n
    print(f"\n### py-spy ({path}): {total} samples of running threads (100 per second)\n")
    print("Most self time:")
    for frame, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {frame}")
    print("Most inclusive time (project frames):")
    for frame, n in [(f, n) for f, n in inclusive.most_common() if f.split(" (", 1)[-1].startswith(PROJECT)][:top]:
        print(f"  {100 * n / total:5.1f}%  {frame}")


PROJECT = tuple(f"{name}/" for name in PACKAGES) + (str(ROOT),)


def _short(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)" keeps the profile readable.
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    marker = "site-packages/"
    path = path.split(marker, 1)[1] if marker in path else path
    return f"{name} ({path})"


def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="refusalbench-knowornot-scale-") as tmp:
        work = Path(tmp)
        os.environ["PREFECT_HOME"] = str(work / "prefect-home")
        from refusalbench.tasks.pipeline.runtime import configure_prefect_env

        configure_prefect_env()
        import prefect.settings
        from prefect.testing.utilities import prefect_test_harness

        from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

        files = sorted(POLICYBENCH.glob("*.json"))
        if not files:
            raise SystemExit(f"PolicyBench is not beside the checkout ({POLICYBENCH})")
        trees = ([("baseline", Path(args.baseline).resolve())] if args.baseline else []) + [("this tree", ROOT)]
        results = {}
        with (
            prefect_test_harness(server_startup_timeout=180),
            ScriptedLLMServer(responder=reply, latency_s=args.latency) as server,
        ):
            # As a background server is after a first command: it has answered the version route, which Prefect
            # sets up at its first request (0.5-1.5 s here) and every flow run's client asks first.
            urllib.request.urlopen(str(prefect.settings.PREFECT_API_URL.value()) + "/admin/version", timeout=60).read()
            for label, code in trees:
                folder = work / label.replace(" ", "-")
                folder.mkdir()
                path = shim(code, work) if code != ROOT else str(ROOT)
                env = dict(
                    os.environ,
                    PYTHONPATH=path,
                    PREFECT_API_URL=str(prefect.settings.PREFECT_API_URL.value()),
                    REFUSALBENCH_CACHE_DIR=str(work / "cache"),
                )
                config = write_loo_config(folder, server.url, files, args.concurrency, args.embedder)
                first = run_once(
                    server, env, config, folder / "run1", work, args.latency, args.profile if code == ROOT else None
                )
                second = run_once(server, env, config, folder / "run2", work, args.latency, None)
                results[label] = (breakdown(first), breakdown(second))
                same = _same_artifacts(folder / "run1", folder / "run2")
                results[label][0]["artifacts_same_on_rerun"] = same
        if args.baseline:
            results["this tree"][0]["artifacts_same_as_baseline"] = _same_artifacts(
                work / "baseline" / "run1", work / "this-tree" / "run1"
            )
        for label, (first, second) in results.items():
            print_breakdown(f"{label}: one command, first run", first, args.concurrency, args.latency, args.under_load)
            print_breakdown(
                f"{label}: the same command again (call cache)", second, args.concurrency, args.latency, args.under_load
            )
        _headline(results, args)
        if args.profile == "py-spy":
            summarise_py_spy(PROFILE_PATH.with_suffix(".txt"))
        elif args.profile == "cprofile":
            import pstats

            print(f"\n### cProfile (main thread only), top 30 by cumulative time ({PROFILE_PATH}.pstats)\n")
            pstats.Stats(str(PROFILE_PATH.with_suffix(".pstats"))).sort_stats("cumulative").print_stats(30)
        if args.json:
            Path(args.json).write_text(
                json.dumps({k: [first, second] for k, (first, second) in results.items()}, indent=2, default=str)
            )


def _same_artifacts(a: Path, b: Path) -> str:
    """Whether the run's tables and metrics are byte for byte those of the cached re-run (timings aside)."""
    import pandas as pd

    differing = []
    for name in (
        "experiment_inputs.parquet",
        "results.parquet",
        "metrics.parquet",
        "evaluations.parquet",
        "experiment_outputs.parquet",
        "metrics.json",
        "filter_report.json",
        "spec_rates.parquet",
        "label_sample.parquet",
        "qa_pairs.parquet",
    ):
        if not (a / name).exists():
            continue
        if name.endswith(".json"):
            if (a / name).read_bytes() != (b / name).read_bytes():
                differing.append(name)
            continue
        left, right = pd.read_parquet(a / name), pd.read_parquet(b / name)
        # Per-call facts of the first run (latency, cached) differ on a re-run by definition.
        volatile = [c for c in left.columns if c in ("latency_s", "cached")]
        if not left.drop(columns=volatile).equals(right.drop(columns=volatile)):
            differing.append(name)
    for index in sorted(a.glob("kb/*/kb.faiss")):  # the FAISS indexes, byte for byte
        if index.read_bytes() != (b / index.relative_to(a)).read_bytes():
            differing.append(str(index.relative_to(a)))
    return "same" if not differing else "differ: " + ", ".join(differing)


def _headline(results: dict[str, Any], args: argparse.Namespace) -> None:
    first, second = results["this tree"]
    chain, floor = bounds(first["per_model"], args.concurrency, args.latency)
    load = " (under load)" if args.under_load else ""
    print(
        f"\n## Headline: PolicyBench leave-one-out, 4 bases x 4 modes, one command: {first['wall_s']:.1f} s{load}, "
        f"{first['cpu_s']:.1f} s CPU"
    )
    print(
        f"- calls {first['calls']}: bound {chain:.1f} s with HyDE -> answers -> evaluations back to back, "
        f"{floor:.1f} s for the busiest model alone; some call in flight {first['in_flight_s']:.1f} s"
    )
    print(
        f"- KnowOrNot library on the same server (issue 29's measurement, {args.library_s:.1f} s): "
        f"{args.library_s / first['wall_s']:.1f}x"
    )
    print(
        f"- cached re-run: {second['wall_s']:.1f} s, {second['calls']} calls; tables and metrics vs the first run: "
        f"{first['artifacts_same_on_rerun']}"
    )
    if "baseline" in results:
        base = results["baseline"][0]
        print(
            f"- baseline tree on the same server: {base['wall_s']:.1f} s ({base['cpu_s']:.1f} s CPU), "
            f"{base['calls']} calls: {base['wall_s'] / first['wall_s']:.2f}x its time now; tables, metrics and "
            f"FAISS indexes vs the baseline's: {first['artifacts_same_as_baseline']}"
        )
    embedding = sum(n for m, n in first["per_model"].items() if m not in MODELS)
    # One line to compare run with run: seconds, x the library, calls, bound, the target (<= 15 s).
    print(
        f"\nHEADLINE knowornot-loo embedder={args.embedder}: {first['wall_s']:.1f} s{load}, "
        f"{args.library_s / first['wall_s']:.1f}x the KnowOrNot library ({args.library_s:.1f} s), "
        f"{first['calls'] - embedding} calls + {embedding} embedding requests, bound {chain:.1f} s, "
        f"cached re-run {second['wall_s']:.1f} s with {second['calls']} calls, target <= 15 s: "
        f"{'met' if first['wall_s'] <= 15 else 'not met'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument(
        "--embedder",
        choices=["api", "minilm"],
        default="api",
        help="api (default): an embedding model on the same scripted server, as the KnowOrNot library "
        "embeds through its client's embedding API; minilm: all-MiniLM-L6-v2 on this machine's CPUs",
    )
    parser.add_argument("--baseline", help="another checkout to run first on the same server (e.g. git archive HEAD)")
    parser.add_argument("--profile", choices=["py-spy", "cprofile"], help="profile the first run of this tree")
    parser.add_argument("--library-s", type=float, default=LIBRARY_S, help="the KnowOrNot library's seconds")
    parser.add_argument("--under-load", action="store_true", help="mark wall times as taken on a busy machine")
    parser.add_argument("--json", help="also write the raw figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--intervals", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.config, args.out, args.intervals)
        return
    measure(args)


if __name__ == "__main__":
    main()
