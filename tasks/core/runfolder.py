"""The run folder: the contract every run's files follow, and the files both methods write.

A run folder (local path or ``s3://...``) holds one run's artifacts. Each is declared
once as an :class:`Artifact`: its file name, its format, the type that fixes its shape
(a record class for Parquet rows, a document model for JSON) and one line saying what it
is. The manifest and the report, which every run writes, are declared here; each method
declares its own files in its ``artifacts.py`` (``tasks/refusalbench/schema/artifacts.py``,
``tasks/knowornot/schema/artifacts.py``). Code reads and writes artifacts through these
declarations (``store.save(rb_files.BENCHMARK, items)``, ``store.load(runfolder.MANIFEST)``),
so no file name is spelled out anywhere else, and the README's table of the run folder is
generated from them (``tasks/pipeline/runfolder_doc.py``).

``manifest.json`` carries :data:`SCHEMA_VERSION`; :data:`SCHEMA_HISTORY` says what each version
changed. Adding an artifact or a column is a minor change; renaming or removing one is a major
one. A column whose meaning changed keeps its name only when a reader of the new version still
reads the old folders right (the version's note says how), else it is renamed.
A run folder of an older version is read (its manifest migrated by :class:`RunManifest`);
one of a newer version is refused when it is first read (``ArtifactStore.check_schema_version``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, model_validator

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.tables import Record

# Every version of the contract and what it changed, oldest first: the last is the one this code
# writes, and the run-folder reference lists them all (``tasks/pipeline/runfolder_doc.py``).
SCHEMA_HISTORY: tuple[tuple[str, str], ...] = (
    ("1.0", "manifest.json without a schema_version: the files before the contract was declared"),
    ("1.1", "every file declared once; manifest.json carries schema_version; JSON files are typed documents"),
    (
        "1.2",
        "KnowOrNot: several knowledge bases in one run (kb/<name>/ sub-folders, merged files with ids "
        "prefixed <name>/)",
    ),
    (
        "1.3",
        "every table holding a model's reply carries its metadata (finish reason, reasoning, reasoning tokens, "
        "served model, system fingerprint; a judgment's as judge_*) and an outcome (ok, truncated, "
        "provider_blocked, ...); judged.parquet holds every row with its outcome and treatment, unscored ones too",
    ),
    (
        "1.4",
        "judgments.parquet: decision is the judge's classification by default (decision_source says who "
        "decided; parser_decision keeps the code parser's; an older folder's decision is the parser's, "
        "which its scores read), with refusal_reasons and the judge's billing "
        "(judge_cached, judge_prompt_tokens, judge_completion_tokens, judge_cost_usd); the tables of model replies "
        "bill each call (prompt_tokens, completion_tokens, cost_usd); calibration_responses.parquet and "
        "calibration_judgments.parquet (the calibration pass); gv_analysis.json matched_set; metrics.json "
        "calibration; manifest.json costs and timings; pretest.parquet outcome, cost_usd and "
        "judge_cost_usd; round_trend.parquet n_answerable, n_unanswerable, coverage and complete; "
        "trend.json not_compared and untested; KnowOrNot evaluator_comparison.parquet, labels/consensus/, label_sample.parquet label_spec, filter report "
        "by_knowledge_base",
    ),
    (
        "1.5",
        "benchmark.parquet of a released benchmark keeps the release's other fields as text columns "
        "(verifier_votes, original_query, ...); manifest.json costs: expected_cached_tokens and "
        "expected_cached_savings_usd per stage and model, and KnowOrNot's embedding requests under the stage "
        "embed; a refresh round with refresh.contamination_static holds contamination.json, "
        "contamination.html and the static set's evaluation in static/",
    ),
)
SCHEMA_VERSION = SCHEMA_HISTORY[-1][0]
# The version of a manifest that names none: written before the contract carried a version.
UNVERSIONED = "1.0"

Format = Literal["parquet", "json", "html", "bytes", "jsonl"]


@dataclass(frozen=True)
class Artifact:
    """One file of a run folder: its name, format, shape, what it is, and which method writes it."""

    name: str
    format: Format
    about: str
    schema: type[BaseModel] | None = None  # None: a table whose columns are listed in ``about``
    method: Literal["refusalbench", "knowornot", "both"] = "refusalbench"

    def __str__(self) -> str:
        return self.name


def schema_version_problem(version: str) -> str | None:
    """Why this code cannot read a run folder of contract ``version``; None when it can.

    Every older version is read: its changes were additions, which readers of a newer
    contract treat as absent (a missing column or key takes its declared default).
    """
    try:
        major, minor = (int(part) for part in version.split("."))
    except ValueError:
        return f"{version!r} is not MAJOR.MINOR"
    known_major, known_minor = (int(part) for part in SCHEMA_VERSION.split("."))
    if (major, minor) > (known_major, known_minor):
        return f"{version} is newer than this refusalbench reads ({SCHEMA_VERSION}); upgrade refusalbench"
    return None


class RunManifest(Record):
    """``manifest.json``: what produced a run folder, how far the run got and what it cost.

    A manifest of an older contract is migrated as it is read (``_migrate``); one of a newer
    contract is refused (``_readable``).
    """

    schema_version: str = Field(description="version of the run-folder contract (SCHEMA_VERSION) the run wrote")
    run_id: str
    kind: str = Field(description="generate | evaluate | knowornot | run | refresh")
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    package_version: str
    config_hash: str
    config: dict[str, Any] = Field(default_factory=dict)
    catalogue_hash: str | None = None
    prompt_hashes: dict[str, str] = Field(default_factory=dict)
    seed: int | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    timings: dict[str, Any] = Field(
        default_factory=dict,
        description="what the clocks (core/clocks.py) counted in "
        "this run's process, by scope/clock: wall_s, cpu_s, n (Parquet reads and writes, "
        "task bodies, Prefect submissions ...)",
    )
    counts: dict[str, Any] = Field(default_factory=dict)
    calls: dict[str, Any] = Field(default_factory=dict)
    costs: dict[str, Any] = Field(
        default_factory=dict,
        description="this run's tokens and cost: total, by_stage "
        "(each by_model), by_model (tasks/llm/accounting.py); cost_usd null when a call "
        "was unpriced; budget_usd when the config set one",
    )
    structured_output_fallbacks: dict[str, str] = Field(
        default_factory=dict,
        description="model -> the structured-output mode it fell back to after its provider "
        "rejected the richer one with a 400 (json_object, none)",
    )
    notes: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list)
    status: Literal["running", "completed", "failed"] = "running"

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        """Bring an older manifest to this contract's shape (the other fields are unchanged since 1.0)."""
        if isinstance(data, dict) and not data.get("schema_version"):
            data = {**data, "schema_version": UNVERSIONED}  # no version (or the old default ""): 1.0
        return data

    @model_validator(mode="after")
    def _readable(self, info: ValidationInfo) -> RunManifest:
        """Refuse a manifest of a contract this code does not know (a newer one, or no version at all)."""
        problem = schema_version_problem(self.schema_version)
        if problem is None:
            return self
        file = (info.context or {}).get("file")
        if file:  # read from a run folder (``ArtifactStore.load``): the CLI's one-line error, naming it
            raise InputError(file, problem, field="schema_version")  # not a ValueError: pydantic passes it on
        raise ValueError(problem)


# ---------------------------------------------------------------- both methods
MANIFEST = Artifact(
    "manifest.json",
    "json",
    "provenance: config, hashes, seed, stage timings, counts, calls, status",
    RunManifest,
    "both",
)
REPORT = Artifact("report.html", "html", "self-contained HTML report", None, "both")

# The files every run folder may hold, whichever method wrote it.
SHARED: tuple[Artifact, ...] = (MANIFEST, REPORT)

WORK = "_work"  # intermediate shards of the stage tasks (safe to delete after a run)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def input_shard(kind: str, index: int) -> str:
    """``_work/<kind>-0007.parquet``: the 8th input shard of a stage."""
    return f"{WORK}/{kind}-{index:04d}.parquet"


def output_shard(kind: str, model: str, index: int) -> str:
    """``_work/<kind>/<model>-0007.parquet``: one model's output for input shard 7."""
    return f"{WORK}/{kind}/{_safe(model)}-{index:04d}.parquet"


def shard_index(name: str) -> int:
    """'_work/items-0007.parquet' -> 7."""
    return int(name.rsplit("-", 1)[-1].split(".")[0])
