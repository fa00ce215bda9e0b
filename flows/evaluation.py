"""The evaluation flow: benchmark -> targets respond (map) -> judge -> score -> report.

One task per (target, shard); the calls inside run concurrently within each model's
limits. Per-target shard files mean a re-run that adds a target only computes the new
target (the others come from Prefect's cache and the call cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow

from refusalbench.flows.common import check_or_raise, chunks, content_digest, configured, model_endpoints, one_model_at_a_time, submit_per_model
from refusalbench.tasks.config import load_config
from refusalbench.tasks.errors import InputError
from refusalbench.tasks.provenance import ManifestRecorder, package_version
from refusalbench.tasks.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.store import ArtifactStore, split_uri
from refusalbench.tasks.taxonomy import canonical_code

JUDGED_COLUMNS = ["model", "item_id", "expected", "decision", "answer_correct", "confidence",
                  "perturbation_class", "intensity", "lever_id", "domain", "generator"]


def read_benchmark(uri: str) -> list[BenchmarkItem]:
    store, name = split_uri(uri)
    if not store.exists(name):
        raise InputError(uri, "benchmark file not found")
    try:
        table = store.read_table(name)
    except Exception as exc:  # not Parquet, truncated ...
        raise InputError(uri, f"not a readable Parquet file ({type(exc).__name__})") from None
    required = {"item_id", "question", "expected", "answers", "variant"}
    missing = sorted(required - set(table.column_names))
    if missing:
        raise InputError(uri, "required column is missing", field=missing[0])
    items = []
    for row_number, row in enumerate(table.to_pylist(), start=1):
        try:
            items.append(BenchmarkItem.model_validate({k: v for k, v in row.items() if k in BenchmarkItem.model_fields}))
        except Exception as exc:
            first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("-",), "msg": str(exc)}
            raise InputError(uri, first["msg"], line=row_number, field=".".join(map(str, first["loc"]))) from None
    if not items:
        raise InputError(uri, "the benchmark has no items")
    for row_number, item in enumerate(items, start=1):
        # Checked now, not at the score stage after every model call has been paid for.
        if canonical_code(item.expected) is None:
            raise InputError(uri, f"not ANSWER_CORRECTLY or a refusal code: {item.expected!r}", line=row_number,
                             field="expected")
    ids = [i.item_id for i in items]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        for row_number, item_id in enumerate(ids, start=1):
            if item_id in seen:
                raise InputError(uri, f"duplicate item_id {item_id!r}", line=row_number, field="item_id")
            seen.add(item_id)
    return items


def judged_frame(judgments: list[Judgment]) -> tuple[pd.DataFrame, dict[str, int]]:
    """Judgments that can be scored, and per-model counts of the ones left out (errors)."""
    frame = pd.DataFrame([j.model_dump() for j in judgments], columns=list(Judgment.model_fields))
    errors = frame["error"].notna()
    excluded = frame[errors].groupby("model").size().to_dict() if errors.any() else {}
    return frame.loc[~errors, JUDGED_COLUMNS].reset_index(drop=True), {k: int(v) for k, v in excluded.items()}


def write_scores(store: ArtifactStore, frame: pd.DataFrame, *, bootstrap: int, seed: int):
    from refusalbench.tasks.scoring import render_score_outputs, score_frame

    result = score_frame(frame, n_resamples=bootstrap, seed=seed)
    for name, blob in render_score_outputs(result).items():
        store.write_bytes(name, blob)
    return result


def write_report(store: ArtifactStore, result, *, title: str = "RefusalBench report") -> str:
    from refusalbench.tasks.report import ReportInputs, build_report

    manifest = store.read_json("manifest.json") if store.exists("manifest.json") else None
    gv = store.read_json("gv_analysis.json") if store.exists("gv_analysis.json") else None
    trend = store.read_frame("round_trend.parquet") if store.exists("round_trend.parquet") else None
    html = build_report(ReportInputs.from_score(result, manifest=manifest, gv_analysis=gv, round_trend=trend, title=title))
    return store.write_text("report.html", html)


@flow(name="refusalbench-evaluate", log_prints=True)
def evaluation_flow(config_path: str, benchmark: str, out: str) -> dict[str, Any]:
    from refusalbench.tasks.judge import judge_shard_task
    from refusalbench.tasks.ui_artifacts import publish_link, publish_markdown, publish_table
    from refusalbench.tasks.prompting import all_template_hashes
    from refusalbench.tasks.report import leaderboard_markdown, leaderboard_rows
    from refusalbench.tasks.respond import respond_shard_task

    cfg = load_config(config_path)
    ev = cfg.evaluation
    items = read_benchmark(benchmark)
    store = ArtifactStore(out)
    recorder = ManifestRecorder(store, "evaluate", config=cfg, seed=ev.seed)
    # Keep generation's manifest if this folder holds one: evaluation adds its own beside it.
    if store.exists("manifest.json"):
        previous = store.read_json("manifest.json")
        if previous.get("kind") == "generate":
            store.write_json("generation_manifest.json", previous)
    template_hashes = all_template_hashes()
    recorder.hashes(prompts=template_hashes)
    config_dump = cfg.model_dump(mode="json")
    try:
        bench_store, bench_name = split_uri(benchmark)
        if bench_store.uri(bench_name) != store.uri("benchmark.parquet"):
            store.write_records("benchmark.parquet", items, BenchmarkItem)
        targets = check_or_raise(cfg, ev.targets)
        (judge,) = check_or_raise(cfg, [ev.judge])
        with model_endpoints(cfg, targets + [judge]) as api_bases:
            with recorder.stage("respond"):
                shards = []
                for index, chunk in enumerate(chunks(items, ev.shard_size)):
                    name = f"_work/items-{index:04d}.parquet"
                    store.write_records(name, chunk, BenchmarkItem)
                    shards.append((name, content_digest([i.model_dump() for i in chunk], template_hashes, ev.confidence,
                                                        package_version())))
                respond = respond_shard_task(out)
                judge_task = judge_shard_task(out)
                sequential = one_model_at_a_time(cfg, targets + [judge])
                judge_digest = content_digest(cfg.models[judge].model_dump(mode="json"), template_hashes, package_version())
                responded = submit_per_model(respond, targets,
                                             lambda t: [(config_dump, out, t, name, digest, api_bases) for name, digest in shards],
                                             sequential=sequential)
            with recorder.stage("judge"):
                # A respond future passed as an argument makes the judge task wait for it, so
                # judging overlaps with other targets' responses (unless one local server).
                judged = submit_per_model(judge_task, targets,
                                          lambda t: [(config_dump, out, t, f, content_digest(judge_digest, digest), api_bases)
                                                     for f, (_, digest) in zip(responded[t], shards)],
                                          sequential=sequential)
                futures = [f for t in targets for f in responded[t]]
                judge_futures = [f for t in targets for f in judged[t]]
                responses = [r for f in futures for r in store.read_records(f.result(), Response)]
                judgments = [j for f in judge_futures for j in store.read_records(f.result(), Judgment)]
                store.write_records("responses.parquet", responses, Response)
                store.write_records("judgments.parquet", judgments, Judgment)
                recorder.artifact("responses.parquet", "judgments.parquet")
        with recorder.stage("score"):
            frame, excluded = judged_frame(judgments)
            store.write_frame("judged.parquet", frame)
            result = write_scores(store, frame, bootstrap=ev.bootstrap, seed=ev.seed)
            recorder.artifact("judged.parquet", "metrics.json", "breakdown.parquet", "confusion.parquet")
            recorder.count(items=len(items), targets=len(targets), responses=len(responses),
                           response_errors={t: sum(r.model == t and r.error is not None for r in responses) for t in targets},
                           judgments=len(judgments), excluded_from_metrics=excluded,
                           judged_by_model={t: sum(j.model == t and j.judge is not None for j in judgments) for t in targets})
            if excluded:
                recorder.note("rows whose call or judging failed are left out of the metrics: see counts.excluded_from_metrics")
        from refusalbench.tasks.prefect_runtime import run_call_stats

        recorder.calls(run_call_stats(config_dump))
        recorder.save()
        with recorder.stage("report"):
            report_uri = write_report(store, result)
            recorder.artifact("report.html")
        rows = leaderboard_rows(result.metrics, result.intervals)
        publish_table("leaderboard", rows, "Models ranked by calibrated refusal score")
        publish_markdown("leaderboard-md", leaderboard_markdown(result.metrics, result.intervals), "Leaderboard")
        publish_link("report", _link(report_uri), "report.html", "Self-contained HTML report")
        recorder.finish("completed")
    except BaseException:
        recorder.finish("failed")
        raise
    return {"metrics": store.uri("metrics.json"), "report": report_uri, "responses": len(responses),
            "models": result.metrics}


def _link(uri: str) -> str:
    return uri if "://" in uri else Path(uri).resolve().as_uri()


def run_evaluation(config_path: str, benchmark: str, out: str) -> dict[str, Any]:
    """CLI entry: bad input (config, benchmark) is reported before any artifact is written."""
    cfg = load_config(config_path)
    if cfg.evaluation is None:
        raise InputError(str(config_path), "the config has no evaluation section", field="evaluation")
    read_benchmark(benchmark)
    # Unreachable models fail here, as one line, before a flow run (and its run folder) starts.
    check_or_raise(cfg, cfg.evaluation.targets)
    check_or_raise(cfg, [cfg.evaluation.judge])
    return configured(evaluation_flow, cfg, out)(config_path, benchmark, out)


def score_to_folder(file: Path | str, out: str, *, bootstrap: int = 1000, seed: int = 0) -> str:
    """``refusalbench score``: metrics from judged responses, no model calls."""
    from refusalbench.tasks.scoring import read_judged

    frame = read_judged(file)
    store = ArtifactStore(out)
    write_scores(store, frame, bootstrap=bootstrap, seed=seed)
    return store.uri("metrics.json")


def build_report_for(run_dir: str) -> str:
    """``refusalbench report``: rebuild report.html from a run folder's judged responses."""
    store = ArtifactStore(run_dir)
    if not store.exists("judged.parquet"):
        raise InputError(store.uri("judged.parquet"), "no judged responses in this run folder (run evaluate first)")
    manifest = store.read_json("manifest.json") if store.exists("manifest.json") else {}
    ev = (manifest.get("config") or {}).get("evaluation") or {}
    from refusalbench.tasks.scoring import score_frame

    result = score_frame(store.read_frame("judged.parquet"), n_resamples=ev.get("bootstrap", 1000), seed=ev.get("seed", 0))
    return write_report(store, result)
