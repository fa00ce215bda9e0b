"""Stage: respond + judge. Every target answers every item; the judge decides each answer.

One respond task per (target, shard) and one judge task per respond task: a judge task
gets its respond task's future as input, so it starts as soon as that shard is answered
and judging overlaps with the other targets' responses (unless one local server holds
the models, then they take turns). The two stages overlap, so each one's time is the
span of its own tasks, measured from their completion times (see :class:`Spans`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.refusalbench import artifacts as rb_files
from refusalbench.tasks.refusalbench.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.stage_outcomes import outcome_summary, tell_outcomes
from refusalbench.tasks.pipeline.shard_tasks import judge_shard, respond_shard
from refusalbench.tasks.pipeline.fanout import Shard, content_digest
from refusalbench.tasks.pipeline.stage_run import StageRun


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


def respond_and_judge(run: StageRun, items: list[BenchmarkItem], targets: list[str],
                      judge: str) -> tuple[list[Response], list[Judgment]]:
    """Responses and judgments of every target; written to responses/judgments.parquet."""
    ev, fanout = run.cfg.evaluation, run.fanout
    templates = run.recorder.manifest.prompt_hashes  # hashed once, when the run started
    shards = fanout.write_shards("items", items, BenchmarkItem, ev.shard_size, lambda chunk: content_digest(
        [i.model_dump() for i in chunk], templates, ev.confidence, package_version()))
    judge_digest = content_digest(run.cfg.models[judge].model_dump(mode="json"), templates, package_version())
    sharing = targets + [judge]

    respond_submitted = time.perf_counter()
    responded = fanout.submit(respond_shard, targets, shards, sharing=sharing)
    respond_spans = Spans(responded)
    judge_submitted = time.perf_counter()
    judged = fanout.submit(judge_shard, targets, lambda t: [Shard(future, content_digest(judge_digest, shard.digest))
                                                            for future, shard in zip(responded[t], shards)],
                           sharing=sharing)
    judge_spans = Spans(judged)
    responses: list[Response] = fanout.gather(responded, Response)
    judgments: list[Judgment] = fanout.gather(judged, Judgment)
    # Respond: submission -> its last task done. Judge: the moment its first task could
    # run (submitted, and a shard of responses in) -> its last task done.
    run.recorder.timing("respond", respond_spans.last(respond_submitted) - respond_submitted)
    judge_started = max(judge_submitted, respond_spans.first(judge_submitted))
    run.recorder.timing("judge", judge_spans.last(judge_started) - judge_started)

    run.store.save(rb_files.RESPONSES, responses)
    run.store.save(rb_files.JUDGMENTS, judgments)
    run.recorder.artifact(rb_files.RESPONSES, rb_files.JUDGMENTS)
    outcomes = outcome_summary(responses)
    run.recorder.count(respond_outcomes=outcomes)
    tell_outcomes("respond", outcomes)
    return responses, judgments

