"""Stage: respond + judge (+ calibrate). Every target answers every item; the judge decides each answer.

One respond task per (target, shard) and one judge task per respond task: a judge task
gets its respond task's future as input, so it starts as soon as that shard is answered
and judging overlaps with the other targets' responses (unless one local server holds
the models, then they take turns). The two stages overlap, so each one's time is the
span of its own tasks, measured from their completion times (see :class:`Spans`). The judge
tasks are submitted once every target has a call under way (``fanout.FirstCalls``), so their
start does not hold up the targets' first requests.

With ``evaluation.confidence`` the calibration pass (paper App. F.2) runs beside them: the
same items asked again with the confidence-eliciting prompt, judged by the same judge, in
tasks submitted with the main ones (so both passes share each model's limits), written to
``calibration_responses/judgments.parquet`` and timed as its own stage ``calibrate``. The
main responses never depend on it: their prompts, shard digests and cache keys are those of
a run without ``confidence``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.pipeline.fanout import Shard, content_digest
from refusalbench.tasks.pipeline.refusalbench.shard_tasks import (
    calibrate_shard,
    calibration_judge_shard,
    judge_shard,
    respond_shard,
)
from refusalbench.tasks.pipeline.stage_run import StageRun
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.stages.stage_outcomes import outcome_summary, tell_outcomes


class Spans:
    """When a stage's tasks completed, by done callback (so the order they are waited on
    does not matter). A future already done when registered counts as done then, so
    register right after submitting."""

    def __init__(self, futures: dict[str, list[Any]]):
        self._lock = threading.Lock()
        self.done: dict[int, float] = {}
        for future in (f for fs in futures.values() for f in fs):
            future.add_done_callback(self._record)

    def _record(self, future: Any) -> None:
        with self._lock:
            self.done.setdefault(id(future), time.perf_counter())

    def first(self, default: float) -> float:
        return min(self.done.values(), default=default)

    def last(self, default: float) -> float:
        return max(self.done.values(), default=default)


def respond_and_judge(
    run: StageRun, items: list[BenchmarkItem], targets: list[str], judge: str
) -> tuple[list[Response], list[Judgment]]:
    """Responses and judgments of every target; written to responses/judgments.parquet.

    With ``evaluation.confidence`` the calibration pass runs alongside and writes its own files.
    """
    ev, fanout = run.cfg.evaluation, run.fanout
    assert ev is not None, "an evaluation run's config has an evaluation section"
    templates = run.recorder.manifest.prompt_hashes  # hashed once, when the run started
    # No ``ev.confidence`` here: the main pass is the same with or without a calibration pass.
    size = fanout.shard_size(ev, len(items), targets + [judge])
    shards = fanout.write_shards(
        "items",
        items,
        BenchmarkItem,
        size,
        lambda chunk: content_digest([i.model_dump() for i in chunk], templates, package_version()),
    )
    judge_digest = content_digest(run.cfg.models[judge].model_dump(mode="json"), templates, package_version())
    sharing = targets + [judge]

    first_calls = fanout.first_calls(targets)
    respond_submitted = time.perf_counter()
    responded = fanout.submit(respond_shard, targets, shards, sharing=sharing)
    respond_spans = Spans(responded)
    if first_calls is not None:  # the judge tasks only wait for the responses: the targets' first calls go first
        first_calls.wait(lambda: bool(respond_spans.done))
    judge_submitted = time.perf_counter()
    judged = fanout.submit(
        judge_shard,
        targets,
        lambda t: [
            Shard(future, content_digest(judge_digest, shard.digest))
            for future, shard in zip(responded[t], fanout.inputs_of(respond_shard, t))
        ],
        sharing=sharing,
    )
    judge_spans = Spans(judged)
    calibration = submit_calibration(run, targets, shards, judge_digest, sharing) if ev.confidence else None
    responses: list[Response] = fanout.gather(responded, Response)
    # Written while the judge's last calls are out (the replies of the targets' last round), not after.
    run.store.save(rb_files.RESPONSES, responses)
    judgments: list[Judgment] = fanout.gather(judged, Judgment)
    # Respond: submission -> its last task done. Judge: the moment its first task could
    # run (submitted, and a shard of responses in) -> its last task done.
    run.recorder.timing("respond", respond_spans.last(respond_submitted) - respond_submitted)
    judge_started = max(judge_submitted, respond_spans.first(judge_submitted))
    run.recorder.timing("judge", judge_spans.last(judge_started) - judge_started)

    run.store.save(rb_files.JUDGMENTS, judgments)
    run.recorder.artifact(rb_files.RESPONSES, rb_files.JUDGMENTS)
    outcomes = outcome_summary(responses)
    run.recorder.count(respond_outcomes=outcomes)
    tell_outcomes("respond", outcomes)
    if calibration is not None:
        calibration.finish(run)
    return responses, judgments


class CalibrationPass:
    """The calibration pass's submitted tasks: its responses, their judgments, when it began."""

    def __init__(self, responded: dict[str, list[Any]], judged: dict[str, list[Any]], submitted: float):
        self.responded, self.judged, self.submitted = responded, judged, submitted
        self.spans = Spans(
            {**{f"r:{t}": fs for t, fs in responded.items()}, **{f"j:{t}": fs for t, fs in judged.items()}}
        )

    def finish(self, run: StageRun) -> None:
        """Gather, write calibration_responses/judgments.parquet, record the ``calibrate`` stage."""
        responses: list[Response] = run.fanout.gather(self.responded, Response)
        judgments: list[Judgment] = run.fanout.gather(self.judged, Judgment)
        # Calibrate: submission -> its last task (respond or judge) done.
        run.recorder.timing("calibrate", self.spans.last(self.submitted) - self.submitted)
        run.store.save(rb_files.CALIBRATION_RESPONSES, responses)
        run.store.save(rb_files.CALIBRATION_JUDGMENTS, judgments)
        run.recorder.artifact(rb_files.CALIBRATION_RESPONSES, rb_files.CALIBRATION_JUDGMENTS)
        outcomes = outcome_summary(responses)
        run.recorder.count(calibration_responses=len(responses), calibration_outcomes=outcomes)
        tell_outcomes("calibrate", outcomes)


def submit_calibration(
    run: StageRun, targets: list[str], shards: list[Shard], judge_digest: str, sharing: list[str]
) -> CalibrationPass:
    """Submit the calibration pass over the main pass's item shards: its own tasks, digests and calls."""
    submitted = time.perf_counter()
    # Its own digest: its tasks read the same item shards but ask with the confidence prompt.
    inputs = [Shard(shard.name, content_digest("calibration", shard.digest)) for shard in shards]
    responded = run.fanout.submit(calibrate_shard, targets, inputs, sharing=sharing)
    judged = run.fanout.submit(
        calibration_judge_shard,
        targets,
        lambda t: [
            Shard(future, content_digest(judge_digest, shard.digest))
            for future, shard in zip(responded[t], run.fanout.inputs_of(calibrate_shard, t))
        ],
        sharing=sharing,
    )
    return CalibrationPass(responded, judged, submitted)
