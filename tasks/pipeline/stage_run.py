"""The RefusalBench pipeline stages, as the flows call them.

Each stage function (``pipeline/<stage>_step.py``) takes the :class:`StageRun` of the run,
fans its tasks out over models x shards (``pipeline.fanout.Fanout``), gathers their output,
writes its artifacts (``refusalbench.artifacts``) and records its counts and timing in the
manifest. The model work itself is the pure logic of ``tasks/refusalbench/`` (``generate``,
``verify``, ``respond``, ``judge``), run by the shard tasks of ``pipeline.shard_tasks``, so a
flow body is just these calls in order:

    generation:  pretest_step.pretested_inputs -> assign_step.record_inputs -> generate_step.generate_stage
                 -> verify_step.verify_stage -> select_step.select_benchmark -> analyse_step.analyse
    evaluation:  respond_step.respond_and_judge -> score_step.score_judgments -> report_step.report_results
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.budget import Budget
from refusalbench.tasks.pipeline.fanout import Fanout


@dataclass
class StageRun:
    """What the stages of one run share: the config, the run folder, its manifest, the endpoints."""

    cfg: RunConfig
    out: str
    recorder: ManifestRecorder
    api_bases: dict[str, str] = field(default_factory=dict)
    # ``budget_usd``'s check, counting from here: a run makes its StageRun before any call.
    budget: Budget | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.budget = Budget.of(self.cfg, self.recorder)

    @property
    def store(self) -> ArtifactStore:
        return self.recorder.store

    @cached_property
    def fanout(self) -> Fanout:
        return Fanout(self.cfg, self.out, self.api_bases, self.budget)


__all__ = ["StageRun"]
