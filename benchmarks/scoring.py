"""Time and peak memory of `score` on synthetic judged responses (10k, 100k, 1M rows), and the
score and report stages at the paper's shape for 3, 10 and 30 targets (``--paper``).

Each size runs in a fresh subprocess so its peak RSS is its own. Measured per size:
reading the Parquet file and preparing it (`read_judged`, which parses every raw
response for its refusal code and every confidence), `score_frame` with 1,000 bootstrap
resamples (per model, and within every breakdown group for the composite metrics), and
rendering the output files. Half of the models state verbal confidence levels, half state
floats (the harder case for the bootstrap). `score_frame` is also timed in CPU seconds,
which a busy shared machine disturbs far less than wall-clock seconds.

    python benchmarks/scoring.py                 # all sizes, markdown table on stdout
    python benchmarks/scoring.py --sizes 100000  # chosen sizes

``--paper``: the evaluation's score stage (``score_frame`` with 1,000 resamples + its output files)
and report stage (``build_report`` with the judged rows, the benchmark's domains and the replies, as
``write_report`` gives it) on judged rows of the paper's shape (10 base items x 18 strata, every target
on every item: 180 rows per target, base items resampled), each target count in a fresh process.
Printed in CPU seconds (``time.process_time``: what the work costs, steady on a shared machine; the
report's reads the charts' JavaScript from its disk cache on the clock) and wall seconds, with the size
of report.html and its number of charts.

    python benchmarks/scoring.py --paper                    # 3, 10, 30 targets
    python benchmarks/scoring.py --paper --models 30 --base-items 10
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refusalbench.tasks.refusalbench.scoring import read_judged, render_score_outputs, score_frame  # noqa: E402
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, expected_behaviour  # noqa: E402

SIZES = (10_000, 100_000, 1_000_000)
MODELS = ("model-a", "model-b", "model-c", "model-d")
REPLY_TEMPLATES = np.array(
    [
        "The answer is {}.",
        "Based on the passage, it was in {} that it happened.",
        "**REFUSE_INFO_MISSING** The context does not say ({}).",
        "I cannot tell: REFUSE_AMBIGUOUS_QUERY — several readings ({}).",
        "The passages disagree. REFUSE_CONTRADICTORY_CONTEXT ({})",
        "`refuse_false_premise` — the question assumes something untrue ({}).",
        "The information about {} is missing, but my best guess is 1912.",
        "REFUSE_GRANULARITY_MISMATCH: asked for a day, the text gives a year ({}).",
        "REFUSE_NONFACTUAL: this asks for an opinion ({}).",
        "REFUSE_OTHER {}",
    ]
)


def synthetic_judged(n_rows: int, seed: int = 0) -> pd.DataFrame:
    """A judged-responses frame of ``n_rows`` rows spread over the benchmark models."""
    rng = np.random.default_rng(seed)
    per_model = n_rows // len(MODELS)
    item = np.arange(per_model)
    strata = [(c, i) for c in PERTURBATION_CLASSES for i in INTENSITIES]
    stratum = item % len(strata)
    classes = np.array([c for c, _ in strata])[stratum]
    intensities = np.array([i for _, i in strata])[stratum]
    expected = np.array([expected_behaviour(c, i) for c, i in strata])[stratum]
    frames = []
    for index, model in enumerate(MODELS):
        template = rng.integers(0, len(REPLY_TEMPLATES), per_model)
        # Every reply is distinct (the item number is in it), so parsing cannot be cached.
        before, after = np.char.partition(REPLY_TEMPLATES, "{}")[:, [0, 2]].T
        response = pd.Series(before[template]) + "item " + pd.Series(item).astype(str) + pd.Series(after[template])
        if index % 2 == 0:
            confidence = rng.choice(
                ["VERY_CONFIDENT", "CONFIDENT", "SOMEWHAT_CONFIDENT", "UNCERTAIN", "VERY_UNCERTAIN"],
                per_model,
                p=[0.6, 0.2, 0.1, 0.06, 0.04],
            )
        else:
            confidence = np.round(rng.beta(5, 2, per_model), 4).astype(str)
        frames.append(
            pd.DataFrame(
                {
                    "model": model,
                    "item_id": "item-" + pd.Series(item).astype(str),
                    "expected": expected,
                    "response": response,
                    "answer_correct": rng.random(per_model) < 0.7,
                    "confidence": confidence,
                    "perturbation_class": classes,
                    "intensity": intensities,
                    "lever_id": pd.Series(stratum % 36).map(lambda k: f"lever-{k}").to_numpy(),
                    "domain": np.array(["law", "health", "science", "finance", "business"])[item % 5],
                    "generator": np.array(["gen-1", "gen-2", "gen-3"])[item % 3],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def paper_judged(n_models: int, n_base: int = 10, seed: int = 0, confidence: bool = False) -> pd.DataFrame:
    """A judged frame of the paper's shape: ``n_base`` base items x the 18 strata (one lever each),
    ``n_models`` targets, as the evaluation flow's ``judged_frame`` writes it (outcome, base_id).

    Targets refuse more with the intensity, as the scripted ones do; a few rows have no usable
    response. ``confidence``: every row states one (half the models verbal levels, half floats).
    """
    rng = np.random.default_rng(seed)
    strata = [(c, i) for c in PERTURBATION_CLASSES for i in INTENSITIES]
    rows = []
    domains = ("law", "health", "science", "finance", "business")
    for m in range(n_models):
        model = f"target-{m:02d}"
        for b in range(n_base):
            for s, (cls, intensity) in enumerate(strata):
                expected = expected_behaviour(cls, intensity)
                draw = rng.random()
                if expected == "ANSWER_CORRECTLY":
                    decision = "ANSWER" if draw < 0.8 else "REFUSE_INFO_MISSING"
                else:
                    decision = expected if draw < 0.55 else ("ANSWER" if draw < 0.8 else "REFUSE_INFO_MISSING")
                outcome = "ok" if rng.random() > 0.01 else "truncated"
                if confidence:
                    conf = (
                        str(rng.choice(["VERY_CONFIDENT", "CONFIDENT", "SOMEWHAT_CONFIDENT", "UNCERTAIN"]))
                        if m % 2 == 0
                        else f"{rng.beta(5, 2):.3f}"
                    )
                else:
                    conf = None
                rows.append(
                    {
                        "model": model,
                        "item_id": f"base-{b:04d}-{s:02d}",
                        "expected": expected,
                        "decision": decision if outcome == "ok" else None,
                        "answer_correct": bool(rng.random() < 0.7) if decision == "ANSWER" else None,
                        "confidence": conf,
                        "perturbation_class": cls,
                        "intensity": intensity,
                        "lever_id": f"lever-{s:02d}",
                        "domain": domains[b % len(domains)],
                        "generator": f"gen-{b % 4 + 1}",
                        "outcome": outcome,
                        "treatment": "scored" if outcome == "ok" else "no_response",
                        "base_id": f"base-{b:04d}",
                    }
                )
    return pd.DataFrame(rows)


def _max_rss_mb() -> float:
    """Peak resident memory of this process (MiB).

    Linux's VmHWM belongs to this process image; ru_maxrss would also count the parent's
    memory copied at fork (it survives exec), so it is only the fallback.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(path: Path, n_resamples: int) -> dict[str, float]:
    """Score one judged file in this process; timings (s) and memory (MiB)."""
    rss_before = _max_rss_mb()
    start = time.perf_counter()
    prepared = read_judged(path)
    read_s = time.perf_counter() - start
    start, cpu_start = time.perf_counter(), time.process_time()
    result = score_frame(prepared, n_resamples=n_resamples, seed=0)
    score_s, score_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    start = time.perf_counter()
    files = render_score_outputs(result)
    render_s = time.perf_counter() - start
    return {
        "rows": len(prepared),
        "read_prepare_s": read_s,
        "score_s": score_s,
        "score_cpu_s": score_cpu_s,
        "render_s": render_s,
        "total_s": read_s + score_s + render_s,
        "rss_before_mb": rss_before,
        "peak_rss_mb": _max_rss_mb(),
        "output_kb": sum(len(v) for v in files.values()) / 1024,
    }


def paper_replies(judged: pd.DataFrame) -> pd.DataFrame:
    """responses.parquet's columns the report reads, one reply per judged row."""
    return pd.DataFrame(
        {
            "model": judged["model"],
            "item_id": judged["item_id"],
            "decision": judged["decision"],
            "raw": "The passage does not say. " + judged["item_id"].astype(str),
            "finish_reason": "stop",
            "completion_tokens": 40,
        }
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_paper(n_models: int, n_base: int, n_resamples: int) -> dict[str, float]:
    """The score and report stages of ``n_models`` targets in this process: CPU and wall seconds."""
    from refusalbench.tasks.core.charts import javascript_bundle
    from refusalbench.tasks.refusalbench.report import ReportInputs, build_report

    judged = paper_judged(n_models, n_base)
    replies = paper_replies(judged)
    items = judged.drop_duplicates("item_id")[["item_id", "domain"]].reset_index(drop=True)
    score_frame(paper_judged(2, 1), n_resamples=10)  # imports and first-call costs out of the timing
    build_report(ReportInputs.from_score(score_frame(paper_judged(2, 1), n_resamples=10)))  # caches the bundle
    javascript_bundle.cache_clear()  # read from the disk cache again, on the clock, as a fresh report does
    start, cpu_start = time.perf_counter(), time.process_time()
    result = score_frame(judged, n_resamples=n_resamples, seed=0)
    files = render_score_outputs(result)
    score_s, score_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    start, cpu_start, child_start = time.perf_counter(), time.process_time(), _children_cpu()
    html = build_report(ReportInputs.from_score(result, judged=judged, benchmark=items, responses=replies))
    report_s, report_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    report_cpu_s += _children_cpu() - child_start  # any child process's CPU counts too (the report starts none)
    return {
        "models": n_models,
        "rows": len(judged),
        "score_s": score_s,
        "score_cpu_s": score_cpu_s,
        "report_s": report_s,
        "report_cpu_s": report_cpu_s,
        "report_mb": len(html.encode()) / 2**20,
        "charts": html.count('class="vl-chart"'),
        "output_kb": sum(len(v) for v in files.values()) / 1024,
    }


def paper_table(models: list[int], n_base: int, n_resamples: int) -> None:
    """One fresh process per target count; a markdown table on stdout."""
    print(
        "| targets | rows | score CPU (s) | score wall (s) | report CPU (s) | report wall (s) | report.html (MB) "
        "| charts |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for n in models:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--paper-one",
                str(n),
                "--base-items",
                str(n_base),
                "--resamples",
                str(n_resamples),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {r['models']} | {r['rows']:,} | {r['score_cpu_s']:.2f} | {r['score_s']:.2f} | {r['report_cpu_s']:.2f} "
            f"| {r['report_s']:.2f} | {r['report_mb']:.2f} | {r['charts']} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, help="(internal) score this file in this process, print JSON")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--paper", action="store_true", help="score and report stages at the paper's shape")
    parser.add_argument("--models", type=int, nargs="*", default=[3, 10, 30], help="target counts (--paper)")
    parser.add_argument("--base-items", type=int, default=10, help="base items, each in all 18 strata (--paper)")
    parser.add_argument("--paper-one", type=int, help="(internal) one target count in this process, print JSON")
    args = parser.parse_args()
    if args.paper_one:
        print(json.dumps(measure_paper(args.paper_one, args.base_items, args.resamples)))
        return
    if args.paper:
        paper_table(args.models, args.base_items, args.resamples)
        return
    if args.file:
        print(json.dumps(measure(args.file, args.resamples)))
        return
    print(
        f"| rows | models | read + prepare (s) | score_frame, {args.resamples} resamples (s) "
        "| score_frame CPU (s) | render (s) | total (s) | peak RSS (MiB) | RSS after imports (MiB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "judged.parquet"
            synthetic_judged(size).to_parquet(path, index=False)
            # A fresh process per size: its peak RSS is the scoring's alone.
            out = subprocess.run(
                [sys.executable, __file__, "--file", str(path), "--resamples", str(args.resamples)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {r['rows']:,} | {len(MODELS)} | {r['read_prepare_s']:.2f} | {r['score_s']:.2f} "
            f"| {r['score_cpu_s']:.2f} | {r['render_s']:.2f} | {r['total_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['rss_before_mb']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
