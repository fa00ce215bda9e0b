"""Stage: analyse. The generator-verifier analysis of the run: ``gv_analysis.json``, UI tables and a
generation-only ``report.html`` (an evaluation in the same folder replaces it with the full report)."""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.pipeline.refusalbench.select_step import Selection
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.pipeline.ui import publish_markdown, publish_table
from refusalbench.tasks.refusalbench.report.run_outputs import write_generation_report
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.stages.gv_analysis import (
    consistency_rows,
    gv_analysis,
    matrix_rows,
    self_evaluation_class_rows,
    summary_markdown,
)
from refusalbench.tasks.refusalbench.stages.gv_matched import matched_rows


def analyse(
    run: StageRun, selection: Selection, generators: list[str], verifiers: list[str], report: bool = True
) -> dict[str, Any]:
    with run.recorder.stage("analyse"):
        analysis = gv_analysis(
            run.store.read_frame(rb_files.CANDIDATES.name),
            run.store.read_frame(rb_files.VERIFICATIONS.name),
            selection.accepted_ids,
            {b.item_id for b in selection.benchmark},
            generators,
            verifiers,
        )
        gen = run.cfg.generation
        assert gen is not None, "a generation run's config has a generation section"
        analysis["filter"] = gen.filter
        analysis["shortfalls"] = selection.shortfalls
        run.store.save(rb_files.GV_ANALYSIS, analysis)
        run.recorder.artifact(rb_files.GV_ANALYSIS)
        publish_table("gv-pass-rate-matrix", matrix_rows(analysis), "Pass rate: generator (rows) x verifier (columns)")
        publish_table(
            "gv-acceptance-funnel",
            [analysis["funnel"]],
            "attempted -> parsed -> prechecked -> verified -> accepted -> sampled",
        )
        publish_table(
            "gv-verdict-consistency",
            consistency_rows(analysis),
            "Verdicts that contradict the verifier's own criteria (a contradicted PASS counts as FAIL)",
        )
        publish_table(
            "gv-self-evaluation-by-class",
            self_evaluation_class_rows(analysis),
            "Self pass rate minus cross pass rate, per model that generates and verifies, by class",
        )
        if analysis.get("matched_set"):
            publish_table(
                "gv-matched-self-vs-cross",
                matched_rows(analysis),
                "Matched set: self vs cross pass rate (pre-check rejects count as FAIL; paper Fig. 3)",
            )
        publish_markdown("gv-summary", summary_markdown(analysis), "Generator-verifier analysis")
    if report:
        with run.recorder.stage("report"):  # after the manifest is saved: the report shows it
            write_generation_report(run.store)
            run.recorder.artifact(runfolder.REPORT)
    return analysis
