"""What scoring and reporting write into a run folder: the scores and the report.

The same writers serve an evaluation after its model calls and the file-only entry points,
which read what a folder or file already holds: :func:`score_to_folder` (``refusalbench score``;
inspect_ai logs go through ``integrations.inspect.logs.score_inspect_logs``) and
:func:`build_report_for` (``refusalbench report``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore, split_uri
from refusalbench.tasks.llm.reply_outcomes import CALL_ERROR, OK
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment
from refusalbench.tasks.refusalbench.scoring import ScoreResult, read_judged, render_score_outputs, score_frame
from refusalbench.tasks.refusalbench.scoring.result import DEFAULT_MIN_COVERAGE
from refusalbench.tasks.refusalbench.scoring.summary import OUTCOME_TREATMENT

JUDGED_COLUMNS = [
    "model",
    "item_id",
    "expected",
    "decision",
    "answer_correct",
    "confidence",
    "perturbation_class",
    "intensity",
    "lever_id",
    "domain",
    "generator",
]
# What became of the row (tasks/llm/reply_outcomes.py) and how the scoring treats it.
OUTCOME_COLUMNS = ["outcome", "treatment"]
# The multi-document judge's scores and the item's variant (single|multi): optional for scoring.
MULTI_DOCUMENT_COLUMNS = ["raf", "eligibility", "factuality", "variant"]
# The base item each benchmark item was written from (with ``items``): intervals resample base items.
CLUSTER_COLUMNS = ["base_id"]


def judged_frame(
    judgments: list[Judgment], items: Iterable[BenchmarkItem] | None = None
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Every judgment as a row to score, and per-model counts of the ones left out of the metrics.

    Each row says its ``outcome`` (``ok``: scored; otherwise why not: truncated, blocked, a
    failed call, ...) and its ``treatment`` (how the scoring counts it), so a target none of
    whose rows could be scored is still listed. With ``items``, each row carries its item's
    ``variant``, which tells the multi-document metrics which rows are theirs, and its ``base_id``,
    which the bootstrap resamples; the judge's
    ``raf``, ``eligibility`` and ``factuality`` come along whenever some row has one.
    """
    frame = pd.DataFrame([j.model_dump() for j in judgments], columns=list(Judgment.model_fields))
    items = list(items or ())
    variants = {item.item_id: item.variant for item in items}
    frame["variant"] = frame["item_id"].map(variants) if variants else None
    # The base item of each row: the bootstrap resamples base items (scoring.clusters).
    frame["base_id"] = frame["item_id"].map({item.item_id: item.base_id for item in items}) if items else None
    errors = frame["error"].notna()
    excluded = frame[errors].groupby("model").size().to_dict() if errors.any() else {}
    # Judgments written before outcomes were recorded: an error is a failed call, else scored.
    legacy = frame["outcome"].isna()
    frame.loc[legacy, "outcome"] = errors[legacy].map({True: CALL_ERROR, False: OK})
    frame["treatment"] = frame["outcome"].map(OUTCOME_TREATMENT)
    optional = [c for c in MULTI_DOCUMENT_COLUMNS + CLUSTER_COLUMNS if frame[c].notna().any()]
    columns = JUDGED_COLUMNS + OUTCOME_COLUMNS + optional
    return frame[columns].reset_index(drop=True), {k: int(v) for k, v in excluded.items()}


def write_scores(
    store: ArtifactStore,
    frame: pd.DataFrame,
    *,
    bootstrap: int,
    seed: int,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
    calibration: pd.DataFrame | None = None,
) -> ScoreResult:
    """Score ``frame``; metrics.json and the breakdown tables go into the run folder.

    ``calibration``: the calibration pass's rows (:func:`calibration_frame`), ECE's only source when given.
    """
    result = score_frame(frame, n_resamples=bootstrap, seed=seed, min_coverage=min_coverage, calibration=calibration)
    for name, blob in render_score_outputs(result).items():
        store.write_bytes(name, blob)
    return result


def calibration_frame(
    store: ArtifactStore, confidence: bool, items: Iterable[BenchmarkItem] | None = None
) -> pd.DataFrame | None:
    """The calibration pass's judgments as rows to score, when the run asked for one
    (``evaluation.confidence``) and wrote them; else None (ECE then comes from the main rows)."""
    if not confidence or not store.has(rb_files.CALIBRATION_JUDGMENTS):
        return None
    if items is None and store.has(rb_files.BENCHMARK):
        items = store.load(rb_files.BENCHMARK)
    return judged_frame(store.load(rb_files.CALIBRATION_JUDGMENTS), items)[0]


def _optional(store: ArtifactStore, artifact: runfolder.Artifact) -> Any:
    return store.load(artifact) if store.has(artifact) else None


def write_report(store: ArtifactStore, result: ScoreResult, *, title: str = "RefusalBench report") -> str:
    """``report.html`` from scores plus what else the folder holds (manifest, G-V analysis, trend)."""
    manifest = _optional(store, runfolder.MANIFEST)
    gv = _optional(store, rb_files.GV_ANALYSIS)
    audit = _optional(store, rb_files.AUDIT)
    generation = _optional(store, rb_files.GENERATION_MANIFEST)  # in a main run, the manifest is evaluate's
    from refusalbench.tasks.refusalbench.report import (  # the report package: loaded only for a report
        ReportInputs,
        build_report,
    )

    responses = store.read_frame(rb_files.RESPONSES.name) if store.has(rb_files.RESPONSES) else None
    html = build_report(
        ReportInputs.from_score(
            result,
            manifest=manifest.model_dump(mode="json") if manifest else None,
            gv_analysis=gv.model_dump(mode="json") if gv else None,
            round_trend=_optional(store, rb_files.ROUND_TREND),
            trend=trend.model_dump(mode="json") if (trend := _optional(store, rb_files.TREND)) else None,
            audit=audit.model_dump(mode="json") if audit else None,
            generation_counts=generation.counts if generation else None,
            title=title,
            responses=responses,
            judged=store.read_frame(rb_files.JUDGED.name) if store.has(rb_files.JUDGED) else None,
            benchmark=_benchmark_columns(store),
            items=_sampled_items(store, responses),
        )
    )
    return store.save(runfolder.REPORT, html)


def _benchmark_columns(store: ArtifactStore) -> pd.DataFrame | None:
    """The benchmark's item ids, base items and domains (the summary, the guardrail's base items and the
    domain figure; no texts converted), or None."""
    if not store.has(rb_files.BENCHMARK):
        return None
    table = store.read_table(rb_files.BENCHMARK.name)
    return table.select([c for c in ("item_id", "base_id", "domain") if c in table.column_names]).to_pandas()


def _sampled_items(store: ArtifactStore, responses: pd.DataFrame | None) -> pd.DataFrame | None:
    """Question, answers and expected behaviour of the items the report's reply sample shows, or None."""
    if responses is None or responses.empty or not store.has(rb_files.BENCHMARK):
        return None
    from refusalbench.tasks.refusalbench.report.responses import sampled_rows

    wanted = set(sampled_rows(responses)["item_id"].astype(str))
    table = store.read_table(rb_files.BENCHMARK.name)
    columns = [c for c in ("item_id", "question", "answers", "expected") if c in table.column_names]
    frame = table.select(columns).to_pandas()
    return frame[frame["item_id"].astype(str).isin(wanted)].reset_index(drop=True)


def write_generation_report(store: ArtifactStore) -> str:
    """A report with no scores (after ``generate``): generation figures, funnel and verifier analysis."""
    gv = store.load(rb_files.GV_ANALYSIS)
    manifest = store.load(runfolder.MANIFEST)
    if manifest.kind != "generate" and store.has(rb_files.GENERATION_MANIFEST):  # an evaluation in the folder
        manifest = store.load(rb_files.GENERATION_MANIFEST)  # began its own: the generation's is kept aside
    audit = _optional(store, rb_files.AUDIT)
    empty = ": empty benchmark" if not gv.funnel.get("sampled") else ""
    from refusalbench.tasks.refusalbench.report import ReportInputs, build_generation_report

    html = build_generation_report(
        ReportInputs(
            metrics={},
            gv_analysis=gv.model_dump(mode="json"),
            manifest=manifest.model_dump(mode="json"),
            generation_counts=manifest.counts,
            audit=audit.model_dump(mode="json") if audit else None,
            title=f"RefusalBench report (generation only{empty})",
        )
    )
    return store.save(runfolder.REPORT, html)


def score_to_folder(file: Path | str, out: str, *, bootstrap: int = 1000, seed: int = 0) -> str:
    """``refusalbench score``: metrics from judged responses, no model calls. A judged file inside a run
    folder, and the folder written to, are refused when a newer refusalbench wrote them."""
    split_uri(str(file))[0].check_schema_version()
    frame = read_judged(file)  # bad input exits before the run folder is created
    store = ArtifactStore(out)
    store.check_schema_version()
    write_scores(store, frame, bootstrap=bootstrap, seed=seed)
    return store.uri(rb_files.METRICS.name)


def build_report_for(run_dir: str) -> str:
    """``refusalbench report``: rebuild report.html from a run folder's judged responses."""
    store = ArtifactStore(run_dir)
    store.check_schema_version()  # a folder a newer refusalbench wrote is refused before anything is read
    if not store.has(rb_files.JUDGED):
        raise InputError(store.uri(rb_files.JUDGED.name), "no judged responses in this run folder (run evaluate first)")
    manifest = _optional(store, runfolder.MANIFEST)
    ev = ((manifest.config if manifest else {}).get("evaluation")) or {}
    result = score_frame(
        store.load(rb_files.JUDGED),
        n_resamples=ev.get("bootstrap", 1000),
        seed=ev.get("seed", 0),
        min_coverage=ev.get("min_coverage", DEFAULT_MIN_COVERAGE),
        calibration=calibration_frame(store, bool(ev.get("confidence"))),
    )
    return write_report(store, result)
