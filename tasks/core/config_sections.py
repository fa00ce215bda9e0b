"""The method sections of a run config: generation (with its pre-test), evaluation, KnowOrNot,
refresh statistics; and where a ``vertex_ai/`` model's batch jobs run (``batch.vertex``).
``core/config.py`` assembles them into ``RunConfig`` and loads the YAML."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from refusalbench.tasks.core.envexpand import expand_references
from refusalbench.tasks.core.eval_spec import EvalSpec


class Strict(BaseModel):
    """A config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


FilterRule = Literal["unanimous", "majority", "none"]
# The generator templates that have an edit-style variant (``generation.edit_style``).
EDIT_STYLE_TEMPLATES: tuple[str, ...] = ("generator_single", "generator_multi")


class PretestConfig(Strict):
    """The paper's base-set filter: keep only items every one of ``models`` answers correctly unperturbed."""

    models: list[str] = Field(min_length=1, description="models that must all answer a base item correctly")
    judge: str = Field(description="model that scores the pre-test answers (NQ: quality >= 4; GaRAGe: RAF = 1)")


class GenerationConfig(Strict):
    base_set: str
    generators: list[str] = Field(min_length=1)
    verifiers: list[str] = Field(min_length=1)
    filter: FilterRule = "unanimous"
    verification: Literal["exhaustive", "short_circuit"] = "exhaustive"
    seed: int = 0
    base_sample: int | None = Field(default=None, ge=1, description="draw this many base items (by seed); all if unset")
    base_sample_by: Literal["domain"] | None = Field(
        default=None,
        description="'domain': draw base_sample with equal counts per domain, after the pre-test "
        "(shortfalls reported); unset: a uniform draw",
    )
    levers_per_stratum: int = Field(default=1, ge=1)
    strata: list[str] | None = Field(default=None, description="subset like ['P-Ambiguity/LOW']; all 18 if unset")
    target_size: int | None = Field(default=None, ge=1, description="benchmark size after stratified sampling")
    shard_size: int = Field(default=64, ge=1)
    pretest: PretestConfig | None = Field(default=None, description="pre-test the base set before lever assignment")
    balance: Literal["natural", "generator"] = Field(
        default="natural",
        description="'generator': equal counts per generator within each stratum (RefusalBench-NQ); "
        "'natural': whatever the verifiers accept (RefusalBench-GaRAGe)",
    )
    edit_style: str | list[str] = Field(
        default_factory=list,
        description="generator templates whose generators reply with find-and-replace edits that code applies "
        "(fewer output tokens) instead of the whole rewritten item: 'generator_single', "
        "'generator_multi', or 'all'; [] (default): full rewrites",
    )

    @field_validator("edit_style")
    @classmethod
    def _known_edit_templates(cls, value: str | list[str]) -> str | list[str]:
        choices = f"{', '.join(EDIT_STYLE_TEMPLATES)} (a list of them) or 'all'"
        if isinstance(value, str) and value != "all":
            raise ValueError(f"{value!r} is not a list of generator templates: choose from {choices}")
        for name in [] if isinstance(value, str) else value:
            if name not in EDIT_STYLE_TEMPLATES:
                raise ValueError(f"unknown generator template {name!r}: choose from {choices}")
        return value

    def edit_templates(self) -> frozenset[str]:
        """The generator templates (names without .j2) generated in edit style."""
        return frozenset(EDIT_STYLE_TEMPLATES if self.edit_style == "all" else self.edit_style)


class EvaluationConfig(Strict):
    targets: list[str] = Field(min_length=1)
    judge: str
    decision: Literal["judge", "codes"] = Field(
        default="judge",
        description="who decides answer vs refusal: the judge classifies each reply (the paper's "
        "protocol; a reply that is only a refusal code skips the call), or 'codes': the "
        "refusal-code parser alone, judge-free (the judge grades answers only)",
    )
    protocol: Literal["default", "paper"] = Field(
        default="default",
        description="the prompts and the judging: 'default', this project's (code help in the target prompt, "
        "the judge asked only where a reply is not a bare refusal code, a grade only for answerable items); "
        "'paper', the released benchmarks' authors' (a prompt that lists the seven codes and asks for the "
        "code alone on a refusal; one judge call per reply returning CLASSIFICATION and QUALITY_SCORE; "
        "correct answer at quality 4 or 5, or RAF 1 for multi-document items; correct refusal = the exact code)",
    )
    confidence: bool = False
    shard_size: int = Field(default=128, ge=1)
    bootstrap: int = Field(default=1000, ge=0)
    seed: int = 0
    min_coverage: float = Field(
        default=0.95,
        ge=0,
        le=1,
        description="a target whose scorable share of rows is below this is marked incomplete "
        "on the leaderboard (and fails evaluate --strict)",
    )

    @model_validator(mode="after")
    def _paper_protocol_has_the_judge_decide(self) -> EvaluationConfig:
        if self.protocol == "paper" and self.decision == "codes":
            raise ValueError("protocol: paper has the judge classify every reply: leave decision at 'judge'")
        return self


SystemPromptName = Literal["basic", "conservative", "opinion"]


# The defaults of KnowOrNotConfig's list fields, as functions with declared return types: a lambda
# given to Field(default_factory=...) is inferred as list[str], not as a list of the Literal.
def _every_prompt() -> list[SystemPromptName]:
    return ["basic", "conservative", "opinion"]


def _every_filter() -> list[Literal["keyword", "semantic"]]:
    return ["keyword", "semantic"]


class KnowledgeBaseSource(Strict):
    """One knowledge base of a multi-base KnowOrNot run: its documents or its QA file."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="a simple name: the base's sub-folder (kb/<name>/) and its question ids' prefix",
    )
    documents: list[str] | None = None
    qa_pairs: str | None = None
    # Each base may carry its own diversity filtering (the paper built CPF with 0.4, the others with
    # 0.3; a released set that is already filtered takes `filters: []`). Unset: the run-wide values.
    filters: list[Literal["keyword", "semantic"]] | None = Field(
        default=None, description="this base's diversity filters ([] keeps every pair); default: knowornot.filters"
    )
    keyword_threshold: float | None = Field(
        default=None, ge=0, le=1, description="this base's keyword threshold; default: knowornot's"
    )
    semantic_threshold: float | None = Field(
        default=None, ge=0, le=1, description="this base's semantic threshold; default: knowornot's"
    )

    def filtering(self, run: KnowOrNotConfig) -> dict[str, object]:
        """This base's filters and thresholds: its own where it sets them, the run's otherwise."""
        return {
            "filters": run.filters if self.filters is None else self.filters,
            "keyword_threshold": run.keyword_threshold if self.keyword_threshold is None else self.keyword_threshold,
            "semantic_threshold": run.semantic_threshold
            if self.semantic_threshold is None
            else self.semantic_threshold,
        }

    @model_validator(mode="after")
    def _one_source(self) -> KnowledgeBaseSource:
        if bool(self.documents) == bool(self.qa_pairs):
            raise ValueError(f"knowledge base {self.name!r}: give either documents or qa_pairs")
        return self


class KnowOrNotConfig(Strict):
    documents: list[str] | None = None
    qa_pairs: str | None = None
    knowledge_bases: list[KnowledgeBaseSource] | None = Field(
        default=None,
        min_length=1,
        description="several knowledge bases in one run, each leave-one-out within itself (instead of documents/qa_pairs)",
    )
    retrieval: list[str] = Field(
        default_factory=lambda: ["direct", "long_context", "basic_rag", "hyde_rag"],
        description="registered retrieval strategies (tasks/knowornot/stages/retrieval.py; "
        "checked by tasks/knowornot/config_checks.py)",
    )
    prompts: list[SystemPromptName] = Field(default_factory=_every_prompt)
    targets: list[str] = Field(min_length=1)
    evaluator: str
    extractor: str | None = Field(
        default=None, description="model for fact extraction / QA / HyDE (default: evaluator)"
    )
    k: int = Field(default=5, ge=1)
    filters: list[Literal["keyword", "semantic"]] = Field(default_factory=_every_filter)
    keyword_threshold: float = Field(default=0.3, ge=0, le=1)
    semantic_threshold: float = Field(default=0.3, ge=0, le=2)
    max_questions: int | None = Field(default=None, ge=1)
    max_sentences: int | None = Field(
        default=None,
        ge=1,
        description="turn at most this many document sentences into facts, taken in turn from each document "
        "(demos, cost control); all if unset",
    )
    synthetic_ookb: int = Field(default=0, ge=0, description="extra synthetic out-of-KB questions")
    hyde_answers: int = Field(default=3, ge=1)
    label_sample: int = Field(
        default=200,
        ge=0,
        description="responses drawn for human labels per evaluation spec, "
        "from the rows it applies to (the paper: 200, labelled "
        "by two annotators)",
    )
    evaluator_comparison: list[str] = Field(
        default_factory=list,
        description="evaluator models (registry names) that also judge the label sample, each "
        "scored against the human consensus like the evaluator (App. D.3)",
    )
    evaluations: list[EvalSpec] = Field(
        default_factory=list,
        description="the run's own evaluation specs, applied after abstention and factuality: name, tag, "
        "outcomes (or values), prompt, optional input_fields and applies_to (all | answered)",
    )
    embedder: str = Field(
        default="minilm",
        description="a registered embedder: 'minilm' (all-MiniLM-L6-v2, offline); 'api' (an embedding model of the "
        "registry through LiteLLM, named by embedding_model); 'hashing' is a model-free stand-in for tests",
    )
    embedding_model: str | None = Field(
        default=None,
        description="the models: entry the 'api' embedder calls, e.g. one with "
        "model: openai/text-embedding-3-large (the KnowOrNot paper's)",
    )
    seed: int = 0
    shard_size: int = Field(default=128, ge=1)

    @model_validator(mode="after")
    def _one_source(self) -> KnowOrNotConfig:
        if self.knowledge_bases:
            if self.documents or self.qa_pairs:
                raise ValueError("give knowledge_bases or documents/qa_pairs, not both")
            names = [kb.name for kb in self.knowledge_bases]
            if len(set(names)) != len(names):
                raise ValueError(f"knowledge base names must differ: {', '.join(names)}")
        elif not self.documents and not self.qa_pairs:
            raise ValueError("give either documents or qa_pairs (or knowledge_bases)")
        return self

    @model_validator(mode="after")
    def _embedding_model_for_api(self) -> KnowOrNotConfig:
        if self.embedder == "api" and not self.embedding_model:
            raise ValueError("embedder 'api' calls an embedding model: name it in knowornot.embedding_model")
        if self.embedding_model and self.embedder != "api":
            raise ValueError(
                f"embedding_model is called only by embedder 'api' (this config's embedder: {self.embedder!r})"
            )
        return self


class RefreshConfig(Strict):
    """Statistics of refresh rounds: the trend's change flags and the error bound of a round (README,
    Tracking models over time)."""

    fdr: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="false-discovery rate of the trend's change flags (Benjamini-Hochberg across models x metrics)",
    )
    rounds: int = Field(default=52, ge=1, description="T of Theorem 3.1: the rounds the error guarantee covers")
    delta: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="delta of Theorem 3.1: the chance that any of those rounds misses by more than epsilon",
    )
    contamination_static: str | None = Field(
        default=None,
        description="a static benchmark file (a released file or an earlier benchmark.parquet; relative to the "
        "config file) every round is also evaluated on: the gaps fresh - static go into the round's "
        "contamination.json",
    )


class BedrockBatchConfig(Strict):
    """Where a Claude or Nova model on Bedrock keeps its batch jobs' files, and the role the jobs run as
    (``batch.bedrock``): Bedrock batch inference reads its requests from S3 and writes its results there."""

    s3_uri: str = Field(description="s3://bucket/prefix/ the jobs' input/ and output/ folders go under")
    role_arn: str = Field(description="the IAM service role a job runs as (it reads and writes s3_uri)")
    _expand = field_validator("s3_uri", "role_arn")(expand_references)

    @field_validator("s3_uri")
    @classmethod
    def _s3_uri(cls, value: str) -> str:
        if not value.startswith("s3://") or not value[len("s3://") :].split("/")[0]:
            raise ValueError("must be an S3 address, s3://bucket or s3://bucket/prefix/")
        return value


class VertexBatchConfig(Strict):
    """Where a ``vertex_ai/`` model's batch prediction jobs run and keep their files (``batch.vertex``)."""

    gcs_uri: str = Field(
        description="gs://bucket/prefix the jobs' request files are uploaded to and their predictions written under"
    )
    project: str | None = Field(
        default=None, description="Google Cloud project of the jobs (default: params.vertex_project)"
    )
    location: str | None = Field(
        default=None, description="region of the jobs (default: params.vertex_location, else us-central1)"
    )
    storage_url: str = Field(
        default="https://storage.googleapis.com", description="the Cloud Storage JSON API's address"
    )

    @field_validator("gcs_uri")
    @classmethod
    def _gs_uri(cls, value: str) -> str:
        if not value.startswith("gs://") or not value[len("gs://") :].split("/")[0]:
            raise ValueError("must be a Cloud Storage URI, gs://bucket or gs://bucket/prefix")
        return value.rstrip("/")
