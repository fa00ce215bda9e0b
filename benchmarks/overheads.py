"""Where a measured run's time goes outside its model calls: the breakdown ``paper_scale.py`` prints.

In the measured (child) process, :func:`instrument` puts the parts that grow with the number of
models on the clocks of ``tasks/core/clocks.py`` (bootstrap: the resampling functions of the
scoring package and ``core/stats.py``; figures: every function of the report package and
``core/charts.py`` whose name says it builds a chart), counted once however they nest; the pipeline's own clocks (Parquet reads and writes, task
bodies, task spans, submissions, the API's start) are always on. :func:`child_figures` collects
the clocks, both manifests and the process's CPU; :func:`breakdown` turns them and the server's
request log into one row per stage:

- wall s: the stage's time (manifest ``timings_s``; respond and judge overlap);
- in flight s: time with one of the stage's requests in flight (the union of arrival to
  arrival + latency); outside s: wall minus in flight;
- Parquet s: the stage's Parquet and JSON reads and writes in the flow's thread (its tasks'
  are in the task columns, overlapping the calls);
- bootstrap s, figures s: their clocks inside the stage (bootstrap: every function of the scoring
  package and ``core/stats.py`` named for resampling, and all of ``scoring/bootstrap.py``); the rest of a score or report stage is
  scoring / report assembly;
- tasks: the stage's Prefect tasks, their bodies (thread-seconds: tasks run at once) and what
  Prefect added around them (task span - body: states, cache key, result file, and the wait for
  a runner slot or, for a judge task, for its respond task), per task.

Start-up is the process's start to the first flow's manifest: imports, the Prefect API (started
or found, then waited for), the input checks and the flow run's creation.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import pkgutil
import re
import resource
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

DRAWS = re.compile(r"figure|plot|chart|diagram|draw|heatmap|histogram")
CALL_STAGES = ("generate", "verify", "respond", "judge")


# ----------------------------------------------------------------- in the measured process


def _clocked(fn: Callable[..., Any], clock: str, depth: threading.local) -> Callable[..., Any]:
    from refusalbench.tasks.core import clocks

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(depth, clock, 0):  # nested: the outermost call counts
            return fn(*args, **kwargs)
        setattr(depth, clock, 1)
        try:
            with clocks.timed(clock):
                return fn(*args, **kwargs)
        finally:
            setattr(depth, clock, 0)

    wrapper.__clocked__ = True  # type: ignore[attr-defined]
    return wrapper


def _functions(module: Any, keep: Callable[[str], bool]) -> list[Callable[..., Any]]:
    return [
        value
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__ and keep(name)
    ]


def instrument() -> dict[str, int]:
    """Put bootstrap and figure drawing on clocks in this process; returns how many functions each."""
    import refusalbench.flows.main  # noqa: F401  (every module the run imports later, imported now)
    import refusalbench.tasks.refusalbench.report as report
    from refusalbench.tasks.core import charts, stats
    from refusalbench.tasks.refusalbench.report import run_outputs as outputs  # noqa: F401
    from refusalbench.tasks.refusalbench.scoring import bootstrap

    scoring = importlib.import_module("refusalbench.tasks.refusalbench.scoring")
    for package in (report, scoring):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
    report_modules = [m for n, m in list(sys.modules.items()) if n.startswith(report.__name__ + ".")]
    scoring_modules = [m for n, m in list(sys.modules.items()) if n.startswith(scoring.__name__ + ".")]
    resamples = re.compile(r"bootstrap|resampl").search
    targets = {
        "bootstrap": _functions(bootstrap, lambda n: not n.startswith("_"))
        + [f for m in [*scoring_modules, stats] if m is not bootstrap for f in _functions(m, resamples)],
        "figures": [f for m in [*report_modules, charts] for f in _functions(m, DRAWS.search)],
    }
    depth = threading.local()
    replaced = {id(fn): _clocked(fn, clock, depth) for clock, fns in targets.items() for fn in fns}
    # Every module that holds one of them by name (``from x import f``) gets the clocked one.
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("refusalbench"):
            continue
        for name, value in list(vars(module).items()):
            if id(value) in replaced and not getattr(value, "__clocked__", False):
                setattr(module, name, replaced[id(value)])
    return {clock: len(fns) for clock, fns in targets.items()}


def child_figures(out: str) -> dict[str, Any]:
    """What the measured process knows at its end: clocks, both manifests, CPU seconds."""
    from refusalbench.tasks.core import clocks, runfolder
    from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

    manifests = {}
    for key, artifact in (("generation", rb_files.GENERATION_MANIFEST), ("evaluation", runfolder.MANIFEST)):
        path = Path(out) / artifact.name
        if path.exists():
            m = json.loads(path.read_text())
            manifests[key] = {k: m.get(k) for k in ("created_at", "finished_at", "timings_s", "timings")}
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "clocks": {name: list(v) for name, v in clocks.snapshot().items()},
        "manifests": manifests,
        "cpu_s": own.ru_utime + own.ru_stime,
        "children_cpu_s": children.ru_utime + children.ru_stime,
    }


# ----------------------------------------------------------------- the table


def _epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _clock(timings: dict[str, Any], scope: str, *names: str, field: str = "wall_s") -> float:
    return sum((timings.get(f"{scope}/{n}" if scope else n) or {}).get(field, 0.0) for n in names)


def breakdown(
    result: dict[str, Any],
    calls: list[tuple[float, str, str]],
    latency: float,
    busy: Callable[[list[float], float], float],
) -> list[dict[str, Any]]:
    """One row per stage (and start-up, between the flows, the end); ``calls``: (seconds since the
    run started, model, stage) of every request."""
    manifests, clocks = result["manifests"], result["clocks"]
    rows: list[dict[str, Any]] = []
    gen, ev = manifests.get("generation"), manifests.get("evaluation")
    first = gen or ev
    if first:
        start_up = _epoch(first["created_at"]) - result["process_started"]
        api = sum(clocks.get(n, [0.0])[0] for n in ("api_start", "api_wait"))
        rows.append(
            {
                "stage": "start-up",
                "wall_s": start_up,
                "outside_s": start_up,
                "detail": f"process + imports {result['spawn_s'] + result['import_s']:.1f} s, Prefect API start/wait "
                f"{api:.1f} s, checks + flow run {max(0.0, start_up - result['spawn_s'] - result['import_s'] - api):.1f} s",
            }
        )
    for manifest in (gen, ev):
        if not manifest:
            continue
        timings = manifest.get("timings") or {}
        for stage, wall in manifest["timings_s"].items():
            name = f"{stage} (generation)" if manifest is gen and stage == "report" else stage
            row: dict[str, Any] = {"stage": name, "wall_s": wall}
            scope = stage
            flow_io = _clock(timings, scope, "parquet_read", "parquet_write", "json_write")
            if stage in CALL_STAGES:
                mine = [t for t, _, s in calls if s == stage]
                row["in_flight_s"] = busy(mine, latency)
                row["outside_s"] = max(0.0, wall - row["in_flight_s"])
                tasks = int(_clock(timings, scope, "task_span", field="n"))
                body = _clock(timings, scope, "task_body")
                span = _clock(timings, scope, "task_span")
                row.update(
                    tasks=tasks,
                    task_body_s=body,
                    task_cpu_s=_clock(timings, scope, "task_body", field="cpu_s"),
                    prefect_per_task_s=(span - body) / tasks if tasks else None,
                    submit_s=_clock(timings, scope, "submit"),
                )
                if stage in ("respond", "judge"):
                    flow_io = _clock(timings, "", "parquet_read", "parquet_write") if stage == "respond" else 0.0
            else:
                row["outside_s"] = wall
            row["parquet_s"] = flow_io
            row["bootstrap_s"] = _clock(timings, scope, "bootstrap")
            row["figures_s"] = _clock(timings, scope, "figures")
            row["stage_cpu_s"] = _clock(timings, scope, "stage", field="cpu_s")
            rows.append(row)
    if gen and ev and gen.get("finished_at"):
        between = _epoch(ev["created_at"]) - _epoch(gen["finished_at"])
        rows.append({"stage": "between the flows", "wall_s": between, "outside_s": between})
    last = ev or gen
    if last and last.get("finished_at"):
        end = result["process_started"] + result["process_wall_s"] - _epoch(last["finished_at"])
        rows.append({"stage": "end (flow run's end, exit)", "wall_s": end, "outside_s": end})
    return rows


def _s(value: Any) -> str:
    return "" if value is None or value == 0 else f"{value:.2f}"


def print_breakdown(rows: list[dict[str, Any]], bound_s: float, run_wall_s: float) -> None:
    print(
        "\n| stage | wall s | in flight s | outside calls s | Parquet s (flow) | bootstrap s | figures s "
        "| rest s | tasks | task bodies s (CPU s) | Prefect per task s | detail |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        rest = r["outside_s"] - r.get("parquet_s", 0.0) - r.get("bootstrap_s", 0.0) - r.get("figures_s", 0.0)
        bodies = f"{r['task_body_s']:.1f} ({r['task_cpu_s']:.1f})" if r.get("tasks") else ""
        per_task = f"{r['prefect_per_task_s']:.3f}" if r.get("prefect_per_task_s") is not None else ""
        print(
            f"| {r['stage']} | {r['wall_s']:.2f} | {_s(r.get('in_flight_s'))} | {r['outside_s']:.2f} "
            f"| {_s(r.get('parquet_s'))} | {_s(r.get('bootstrap_s'))} | {_s(r.get('figures_s'))} | {rest:.2f} "
            f"| {r.get('tasks') or ''} | {bodies} | {per_task} | {r.get('detail', '')} |"
        )
    print(
        f"\nrest: for a call stage, its time outside calls less its flow-side Parquet (Prefect's submissions, "
        f"ramp-up and tail of its tasks); for score, scoring without the bootstrap; for report, the report "
        f"without its figures. Run: {run_wall_s:.1f} s wall against a {bound_s:.1f} s latency bound = "
        f"{100 * bound_s / run_wall_s:.0f}%."
    )
