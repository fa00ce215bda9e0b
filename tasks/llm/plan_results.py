"""What ``plan`` returns, for either method: per stage and model, per stage and in total (the stage keys
``calls`` and ``by_model`` and the total's ``calls``, ``cost_usd``, ``time_bound_s`` are a public
contract that outside tools read: fields are added, never removed)."""

from __future__ import annotations

from pydantic import BaseModel, Field

ALL_BATCH = (
    "cost_usd with every model in mode: batch (synchronous where its provider has no batch API the gateway speaks)"
)

CACHED_TOKENS = "forecast prompt tokens the provider reads from its prompt cache (prefixes shared by calls)"
CACHED_SAVINGS = (
    "forecast savings of the prompt cache against the full input price, the cache-write premium taken off "
    "(not taken off cost_usd, a ceiling); None when the price is unknown"
)


class ModelPlan(BaseModel):
    """One model's calls in one stage."""

    calls: int
    upper_bound: bool
    input_tokens: int
    output_tokens_max: int | None = Field(description="calls x max_tokens; None when max_tokens is not set")
    input_cost_usd: float | None = Field(description="the input's cost; None when the price is unknown")
    cost_usd: float | None = Field(description="input + output ceiling; None when the price or max_tokens is unknown")
    time_bound_s: float
    too_long: int = Field(
        default=0,
        description="calls whose prompt does not fit the model's context window less "
        "max_tokens: recorded too_long, not sent (context_limits)",
    )
    batch_calls: int = Field(default=0, description="of the calls, those sent through the batch API (mode: batch)")
    sync_cost_usd: float | None = Field(default=None, description="cost_usd with every call synchronous")
    batch_cost_usd: float | None = Field(default=None, description=ALL_BATCH)
    estimated: bool = Field(
        default=False, description="the count rests on an assumed ratio (e.g. facts per sentence), not a bound"
    )
    free: bool = Field(default=False, description="a local model the run serves itself: no provider bills its calls")
    latency_s: float | None = Field(default=None, description="the seconds per call the time bound assumes")
    latency_source: str = Field(
        default="assumed",
        description="where latency_s comes from: measured (past calls in the call cache), registry "
        "(the model's local.seconds_per_call), assumed (--latency)",
    )
    cached_tokens: int = Field(default=0, description=CACHED_TOKENS)
    cache_write_tokens: int = Field(
        default=0, description="forecast prompt tokens written to a cache of marked prefixes (billed at a premium)"
    )
    cached_savings_usd: float | None = Field(default=0.0, description=CACHED_SAVINGS)


class StagePlan(BaseModel):
    """One stage: its models' calls summed (its time: the slowest model's, or their sum when they take turns)."""

    calls: int
    by_model: dict[str, int]
    upper_bound: bool = Field(description="calls depend on earlier outcomes: the count is a ceiling")
    input_tokens: int
    output_tokens_max: int | None
    input_cost_usd: float | None
    cost_usd: float | None
    time_bound_s: float
    models: dict[str, ModelPlan]
    note: str
    batch_calls: int = 0
    sync_cost_usd: float | None = None
    batch_cost_usd: float | None = None
    estimated: bool = False
    cached_tokens: int = Field(default=0, description=CACHED_TOKENS)
    cached_savings_usd: float | None = Field(default=0.0, description=CACHED_SAVINGS)


class PlanTotal(BaseModel):
    """The run: every stage summed."""

    calls: int
    upper_bound: bool
    input_tokens: int
    output_tokens_max: int | None
    input_cost_usd: float | None
    cost_usd: float | None = Field(description="None as soon as one model's cost is unknown; never a silent 0")
    priced_cost_usd: float = Field(description="the ceiling summed over the models whose cost is known")
    unpriced_models: list[str]
    time_bound_s: float
    batch_calls: int = Field(default=0, description="of the calls, those the config sends through the batch API")
    sync_cost_usd: float | None = Field(default=None, description="cost_usd with every call synchronous")
    batch_cost_usd: float | None = Field(default=None, description=ALL_BATCH)
    priced_sync_cost_usd: float = 0.0
    priced_batch_cost_usd: float = 0.0
    estimated: bool = False
    cached_tokens: int = Field(default=0, description=CACHED_TOKENS)
    cached_savings_usd: float | None = Field(default=0.0, description=CACHED_SAVINGS)


class Plan(BaseModel):
    """The plan of a run of a config, made without a model call."""

    config: str | None
    latency_s: float = Field(description="the assumed seconds per call of a model with no measured or registry figure")
    stages: dict[str, StagePlan]
    total: PlanTotal
    notes: list[str]
    method: str = Field(default="refusalbench", description="the method planned: refusalbench or knowornot")
    warnings: list[str] = Field(
        default_factory=list, description="what would stop or change the run: missing keys, missing prices"
    )
