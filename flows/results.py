"""What each flow returns: one pydantic model per flow, typed, instead of a dict of loose keys.

Prefect persists a flow's return value with the run's results (pickled); the CLI prints from
these, a deployment's run shows them in the UI, and the ``run`` and ``refresh`` flows read
their sub-flows' results field by field. Paths are URIs as the run folder's store writes them
(a local path or ``s3://...``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from refusalbench.tasks.refusalbench.schema.json_files import TrendFlag


class FlowResult(BaseModel):
    """A flow's result: read-only, and no field beyond those declared."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class GenerationResult(FlowResult):
    """The generation flow: the benchmark and how many items reached it."""

    benchmark: str = Field(description="benchmark.parquet in the run folder")
    accepted: int = Field(description="candidates that passed the verification filter")
    sampled: int = Field(description="items in the benchmark (the stratified sample of the accepted)")
    candidates: int = Field(description="candidates generated")
    verifications: int = Field(description="verifier verdicts")
    run: str = Field(description="the run folder")


class EvaluationResult(FlowResult):
    """The evaluation flow: metrics, report and what could not be scored."""

    metrics: str = Field(description="metrics.json in the run folder")
    report: str = Field(description="report.html in the run folder")
    responses: int = Field(description="target responses (targets x items)")
    models: dict[str, dict[str, float | None]] = Field(
        description="metric values and counts per target (NaN: undefined)"
    )
    incomplete: dict[str, float] = Field(
        default_factory=dict,
        description="targets scored on less than evaluation.min_coverage of their rows -> the share scored",
    )
    no_scored_rows: list[str] = Field(default_factory=list, description="targets with no scored row at all")


class MainResult(FlowResult):
    """The main job (generate -> evaluate): its benchmark, report and metrics, and the generation's result."""

    benchmark: str
    report: str
    metrics: str
    generation: GenerationResult
    incomplete: dict[str, float] = Field(default_factory=dict, description="as EvaluationResult.incomplete")


class PretestResult(FlowResult):
    """The pre-test flow: the base items every pre-test model answered correctly."""

    pretest: str = Field(description="pretest.parquet in the run folder")
    kept: list[str] = Field(description="ids of the base items kept")
    funnel: dict[str, int] = Field(description="imported -> pretested -> kept -> sampled: base items at each step")
    run: str = Field(description="the run folder")


class RefreshResult(FlowResult):
    """One refresh round: which round, its report, and the changes since the round before."""

    round: str = Field(description="the round's folder name under out_root")
    seed: int
    report: str
    rounds: int = Field(description="rounds in the trend")
    flags: list[TrendFlag] = Field(default_factory=list, description="significant changes since the previous round")
    incomplete_rounds: list[str] = Field(default_factory=list, description="rounds left out of the trend")
    incomplete: dict[str, float] = Field(
        default_factory=dict,
        description="targets of this round scored on less than evaluation.min_coverage of their rows -> the "
        "share scored: not compared in the trend",
    )
    contamination: str | None = Field(
        default=None, description="the round's contamination.json (refresh.contamination_static)"
    )
    contamination_flagged: list[str] = Field(
        default_factory=list, description="models the round's contamination check flags"
    )


class ContaminationResult(FlowResult):
    """The contamination check: the static set's and the fresh round's run folders, and which models it flags."""

    document: str = Field(description="contamination.json")
    report: str = Field(description="contamination.html")
    static_run: str = Field(description="the run folder of the static set's evaluation")
    fresh_run: str = Field(description="the run folder of the fresh round")
    flagged: list[str] = Field(
        default_factory=list, description="models whose score is significantly lower on fresh items"
    )


class KnowOrNotResult(FlowResult):
    """The KnowOrNot flow: its metrics, report and the size of its experiment grid."""

    metrics: str = Field(description="the KnowOrNot metrics file in the run folder")
    report: str
    experiments: int = Field(description="rows of the experiment grid")


__all__ = [
    "ContaminationResult",
    "EvaluationResult",
    "FlowResult",
    "GenerationResult",
    "KnowOrNotResult",
    "MainResult",
    "PretestResult",
    "RefreshResult",
]
