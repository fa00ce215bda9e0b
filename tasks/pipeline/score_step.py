"""Stage: score. Judgments -> the scorable rows (``judged.parquet``) -> metrics and breakdowns."""

from __future__ import annotations

from refusalbench.tasks.refusalbench import artifacts as rb_files
from refusalbench.tasks.refusalbench.outputs import judged_frame, write_scores
from refusalbench.tasks.refusalbench.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.scoring import ScoreResult
from refusalbench.tasks.refusalbench.stage_outcomes import outcome_summary, tell_coverage, tell_outcomes
from refusalbench.tasks.pipeline.stage_run import StageRun


def score_judgments(run: StageRun, items: list[BenchmarkItem], targets: list[str], responses: list[Response],
                    judgments: list[Judgment]) -> ScoreResult:
    """Metrics of every target; rows whose call or judging failed, or that have no usable
    response, are counted, not scored; a target scored on too few of its rows is incomplete."""
    ev = run.cfg.evaluation
    with run.recorder.stage("score"):
        frame, excluded = judged_frame(judgments, items)
        run.store.save(rb_files.JUDGED, frame)
        result = write_scores(run.store, frame, bootstrap=ev.bootstrap, seed=ev.seed, min_coverage=ev.min_coverage)
        run.recorder.artifact(rb_files.JUDGED, rb_files.METRICS, rb_files.BREAKDOWN, rb_files.CONFUSION)
        run.recorder.count(
            items=len(items), targets=len(targets), responses=len(responses),
            response_errors={t: sum(r.model == t and r.error is not None for r in responses) for t in targets},
            judgments=len(judgments), excluded_from_metrics=excluded,
            judged_by_model={t: sum(j.model == t and j.judge is not None for j in judgments) for t in targets})
        run.recorder.count(outcomes_by_model=result.outcomes,
                           incomplete={m: round(c, 4) for m, c in result.incomplete.items()},
                           no_scored_rows=result.unscorable)
        if excluded:
            run.recorder.note("rows whose call or judging failed, or without a usable response (truncated, "
                              "blocked, too long, empty), are left out of the metrics: see counts.excluded_from_metrics "
                              "and counts.outcomes_by_model")
        if result.incomplete:
            run.recorder.note(f"{len(result.incomplete)} target(s) scored on less than min_coverage "
                              f"{ev.min_coverage:g} of their rows are marked incomplete: see counts.incomplete")
        tell_outcomes("score", outcome_summary(judgments))
        tell_coverage(result.incomplete, result.unscorable, ev.min_coverage)
    return result
