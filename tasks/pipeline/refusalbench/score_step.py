"""Stage: score. Judgments -> the scorable rows (``judged.parquet``) -> metrics and breakdowns."""

from __future__ import annotations

from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.pipeline.ui import publish_table
from refusalbench.tasks.refusalbench.report.run_outputs import calibration_frame, judged_frame, write_scores
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.scoring import ScoreResult
from refusalbench.tasks.refusalbench.stages.judge import parser_agreement
from refusalbench.tasks.refusalbench.stages.stage_outcomes import outcome_summary, tell_coverage, tell_outcomes


def record_decision(run: StageRun, judgments: list[Judgment]) -> None:
    """Who decided answer vs refusal (``evaluation.decision``) and, per model, the code parser's
    agreement with the judge: in the manifest's counts and as a Prefect table."""
    ev = run.cfg.evaluation
    assert ev is not None, "an evaluation run's config has an evaluation section"
    agreement = parser_agreement(judgments)
    run.recorder.count(decision=ev.decision, parser_agreement=agreement)
    if ev.decision == "judge":
        publish_table(
            "parser-agreement",
            [{"model": model, **row} for model, row in agreement.items()],
            "Code parser vs judge: share of the judge-decided replies where the refusal-code parser "
            "agrees, prose refusals it missed, quoted codes it took as refusals",
        )


def score_judgments(
    run: StageRun, items: list[BenchmarkItem], targets: list[str], responses: list[Response], judgments: list[Judgment]
) -> ScoreResult:
    """Metrics of every target; rows whose call or judging failed, or that have no usable
    response, are counted, not scored; a target scored on too few of its rows is incomplete.
    With ``evaluation.confidence``, ECE comes from the calibration pass's judgments alone."""
    ev = run.cfg.evaluation
    assert ev is not None, "an evaluation run's config has an evaluation section"
    with run.recorder.stage("score"):
        frame, excluded = judged_frame(judgments, items)
        run.store.save(rb_files.JUDGED, frame)
        result = write_scores(
            run.store,
            frame,
            bootstrap=ev.bootstrap,
            seed=ev.seed,
            min_coverage=ev.min_coverage,
            calibration=calibration_frame(run.store, ev.confidence, items),
        )
        run.recorder.artifact(rb_files.JUDGED, rb_files.METRICS, rb_files.BREAKDOWN, rb_files.CONFUSION)
        run.recorder.count(
            items=len(items),
            targets=len(targets),
            responses=len(responses),
            response_errors={t: sum(r.model == t and r.error is not None for r in responses) for t in targets},
            judgments=len(judgments),
            excluded_from_metrics=excluded,
            judged_by_model={t: sum(j.model == t and j.judge is not None for j in judgments) for t in targets},
        )
        run.recorder.count(
            outcomes_by_model=result.outcomes,
            incomplete={m: round(c, 4) for m, c in result.incomplete.items()},
            no_scored_rows=result.unscorable,
        )
        if excluded:
            run.recorder.note(
                "rows whose call or judging failed, or without a usable response (truncated, "
                "blocked, too long, empty), are left out of the metrics: see counts.excluded_from_metrics "
                "and counts.outcomes_by_model"
            )
        if result.incomplete:
            run.recorder.note(
                f"{len(result.incomplete)} target(s) scored on less than min_coverage "
                f"{ev.min_coverage:g} of their rows are marked incomplete: see counts.incomplete"
            )
        record_decision(run, judgments)
        tell_outcomes("score", outcome_summary(judgments))
        tell_coverage(result.incomplete, result.unscorable, ev.min_coverage)
    return result
