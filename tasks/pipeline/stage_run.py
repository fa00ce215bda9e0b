"""The RefusalBench pipeline stages, as the flows call them (DESIGN.md §2).

Each stage function takes the :class:`StageRun` of the run, fans its tasks out over
models x shards (``tasks.shards.Fanout``), gathers their output, writes its artifacts
(``tasks.runfolder``) and records its counts and timing in the manifest. The model work
itself stays in the per-stage modules beside this package (``tasks.generate``,
``tasks.verify``, ``tasks.respond``, ``tasks.judge``: pure functions + one ``@task`` each),
so a flow body is just these calls in order:

    generation:  pretest.pretested_inputs -> assign.record_inputs -> generate.generate_candidates -> verify.verify_candidates
                 -> select.select_benchmark -> analyse.analyse
    evaluation:  respond.respond_and_judge -> score.score_judgments -> report.report_results
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.pipeline.fanout import Fanout
from refusalbench.tasks.core.store import ArtifactStore


@dataclass
class StageRun:
    """What the stages of one run share: the config, the run folder, its manifest, the endpoints."""

    cfg: RunConfig
    out: str
    recorder: ManifestRecorder
    api_bases: dict[str, str] = field(default_factory=dict)

    @property
    def store(self) -> ArtifactStore:
        return self.recorder.store

    @cached_property
    def fanout(self) -> Fanout:
        return Fanout(self.cfg, self.out, self.api_bases)


__all__ = ["StageRun"]
