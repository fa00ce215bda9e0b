"""A plan's arithmetic, shared by both methods: each stage's calls per model, sized, priced and timed.

A method's planner counts the calls each of its stages would send (:class:`StageWork`); this module
turns them into the :class:`~refusalbench.tasks.llm.plan_results.Plan` both methods print alike.

- tokens: characters / ``CHARS_PER_TOKEN`` of the rendered messages plus the JSON schema where the
  model's provider profile sends it (no tokenizer can be fetched offline); output tokens are a
  ceiling (calls x ``max_tokens``), so ``cost_usd`` is a ceiling too.
- time per model: max(calls x its seconds per call / ``max_concurrency``, calls / ``rpm`` x 60), with
  the seconds per call from ``plan_latency`` (measured, the registry's, or assumed); batch calls
  wait up to the model's ``batch.max_wait_s``. A stage takes as long as its slowest model (the
  models run in parallel) or their sum when they take turns; the total is the sum of the stages.
- totals: every count, token and dollar of a stage is the sum of its models', of the run the sum of
  its stages'.
- prompt caching: where a stage's calls share a prompt prefix (``shared_by`` calls per prefix, the
  template's split), the tokens the provider would read from its cache and what that saves
  (``prompt_cache.expected_cache_tokens``, LiteLLM's ``token_counter`` for the prefix; priced with the
  cache read and write prices), for synchronous calls; ``cost_usd`` stays the ceiling without it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.llm.context_limits import overflow
from refusalbench.tasks.llm.gateway import json_schema
from refusalbench.tasks.llm.plan_keys import missing_key_warnings
from refusalbench.tasks.llm.plan_latency import Latency, is_local, latency_note, model_latencies
from refusalbench.tasks.llm.plan_prices import (
    Rates,
    batch_protocol_of,
    batch_provider,
    model_rates,
    sends_batches,
    sum_or_none,
)
from refusalbench.tasks.llm.plan_results import ModelPlan, Plan, PlanTotal, StagePlan
from refusalbench.tasks.llm.prompt_cache import caches_prefixes, expected_cache_tokens, prefix_tokens, shared_prefix
from refusalbench.tasks.llm.providers import SCHEMA_MODES, profile_for, structured_mode

CHARS_PER_TOKEN = 4

# (characters of the messages, response schema, the messages, the characters of the last one the stage's
# calls share: ``RenderedPrompt.shared_chars``)
Prompt = tuple[int, type[BaseModel] | None, list[dict[str, str]], int | None]


def max_tokens(cfg: ModelConfig) -> int | None:
    """The output ceiling of one call of ``cfg`` (None: unbounded)."""
    return profile_for(cfg.model, cfg.api_base).max_output_tokens(cfg.params)


def schema_chars(cfg: ModelConfig, schema: type[BaseModel] | None) -> int:
    """The characters of ``schema`` that travel with a request of ``cfg``."""
    # In the json_schema and tool modes the whole schema travels with the request; in json_object
    # mode only {"type": "json_object"}, in none nothing (the model's provider profile decides).
    if schema is None or structured_mode(cfg, profile_for(cfg.model, cfg.api_base)) not in SCHEMA_MODES:
        return 0
    return len(json.dumps(json_schema(schema)))


def exceeds_window(cfg: ModelConfig, messages: list[dict[str, str]], schema: type[BaseModel] | None) -> bool:
    """Whether the gateway would record this prompt too_long for ``cfg`` instead of sending it."""
    sent = json_schema(schema) if schema is not None and schema_chars(cfg, schema) else None
    return overflow(cfg, messages, max_tokens(cfg), sent) is not None


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes: "1 generator", "2 generators"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def prompt(
    messages: list[dict[str, str]], schema: type[BaseModel] | None = None, shared_chars: int | None = None
) -> Prompt:
    return sum(len(m["content"]) for m in messages), schema, messages, shared_chars


@dataclass
class StageWork:
    """Calls and input characters per model of one stage, before pricing."""

    note: str
    sequential: bool = False
    calls: Counter[str] = field(default_factory=Counter)
    chars: Counter[str] = field(default_factory=Counter)
    bounded: set[str] = field(default_factory=set)  # models whose count is a ceiling
    estimated: set[str] = field(default_factory=set)  # models whose count rests on an assumed ratio
    too_long: Counter[str] = field(default_factory=Counter)  # calls whose prompt exceeds the model's window
    batch_calls: Counter[str] = field(default_factory=Counter)  # of the calls, those sent through the batch API
    batch_chars: Counter[str] = field(default_factory=Counter)
    cache_read: Counter[str] = field(default_factory=Counter)  # prompt tokens read from the provider's cache
    cache_write: Counter[str] = field(default_factory=Counter)  # prompt tokens written to it (billed: Anthropic)
    embeddings: set[str] = field(default_factory=set)  # models whose calls are embedding requests: no output

    def add(
        self,
        model: str,
        cfg: ModelConfig,
        calls: int,
        prompts: list[Prompt],
        *,
        bounded: bool,
        stage: str,
        estimated: bool = False,
        shared_by: int = 1,
    ) -> None:
        """``calls`` calls whose prompts look like ``prompts`` on average (all of them when equal in number);
        ``stage``: the stage they count for (accounting's name: the calibration pass's is ``calibrate``);
        ``shared_by``: how many of the calls share each prompt's shared prefix."""
        batch = sends_batches(cfg, stage)
        self.calls[model] += calls
        self.batch_calls[model] += calls if batch else 0
        if bounded:
            self.bounded.add(model)
        if estimated:
            self.estimated.add(model)
        if prompts and calls:
            total = sum(chars + schema_chars(cfg, schema) for chars, schema, _, _ in prompts)
            self.chars[model] += round(total * calls / len(prompts))
            self.batch_chars[model] += round(total * calls / len(prompts)) if batch else 0
            over = sum(exceeds_window(cfg, messages, schema) for _, schema, messages, _ in prompts)
            self.too_long[model] += round(over * calls / len(prompts))
            if shared_by > 1 and not batch:
                read, written = _cache_tokens(cfg, prompts, shared_by)
                groups = calls / shared_by / len(prompts)  # the prefixes each prompt stands for
                self.cache_read[model] += round(read * groups)
                self.cache_write[model] += round(written * groups)


def _cache_tokens(cfg: ModelConfig, prompts: list[Prompt], shared_by: int) -> tuple[int, int]:
    """Prompt tokens read from and written to the provider's cache by ``shared_by`` calls sharing the
    prefix of each of ``prompts``, summed over the prompts."""
    profile = profile_for(cfg.model, cfg.api_base)
    read = written = 0
    if not caches_prefixes(profile, cfg.model):
        return 0, 0  # counted no further: the tokenizer is the slow part
    for _, _, messages, shared_chars in prompts:
        prefix = shared_prefix(messages, shared_chars)
        if prefix is not None:
            r, w = expected_cache_tokens(profile, cfg.model, prefix_tokens(cfg.model, prefix), shared_by)
            read, written = read + r, written + w
    return read, written


def time_bound(cfg: ModelConfig, calls: int, latency_s: float) -> float:
    """Seconds ``calls`` calls need: limited by concurrency or by the rate limit, whichever is slower."""
    by_concurrency = calls * latency_s / cfg.max_concurrency
    by_rate = calls / cfg.rpm * 60 if cfg.rpm else 0.0
    return max(by_concurrency, by_rate)


def _price_model(mcfg: ModelConfig, work: StageWork, name: str, rates: Rates | None, latency: Latency) -> ModelPlan:
    """One model's calls of a stage: tokens, cost at each call's mode's price, and time."""
    calls, batch_calls = work.calls[name], work.batch_calls[name]
    tokens_in = -(-work.chars[name] // CHARS_PER_TOKEN)
    batch_in = -(-work.batch_chars[name] // CHARS_PER_TOKEN)
    ceiling = 0 if name in work.embeddings else max_tokens(mcfg)  # an embedding request bills its input alone
    tokens_out: int | None = None
    batch_out: int | None = None
    sync_out: int | None = None
    if ceiling is not None:
        tokens_out, batch_out = calls * ceiling, batch_calls * ceiling
        sync_out = tokens_out - batch_out
    cost_in = cost = sync_cost = batch_cost = None
    if rates is not None:  # the synchronous calls at the synchronous price, the batch calls at the batch price
        sync_in, sync_total = rates.cost(tokens_in - batch_in, sync_out, batch=False)
        queued_in, queued_total = rates.cost(batch_in, batch_out, batch=True)
        cost_in, cost = round(sync_in + queued_in, 6), sum_or_none([sync_total, queued_total])
        sync_cost = sum_or_none([rates.cost(tokens_in, tokens_out, batch=False)[1]])
        batch_cost = sum_or_none([rates.cost(tokens_in, tokens_out, batch=batch_provider(mcfg))[1]])
    read, written = work.cache_read[name], work.cache_write[name]
    savings = 0.0 if not read and not written else rates.cache_savings(read, written) if rates is not None else None
    # Batch calls are waited for up to the model's batch window, whatever its concurrency.
    seconds = time_bound(mcfg, calls - batch_calls, latency.seconds)
    if batch_calls:
        seconds = max(seconds, mcfg.batch.max_wait_s)
    return ModelPlan(
        calls=calls,
        upper_bound=name in work.bounded,
        input_tokens=tokens_in,
        output_tokens_max=tokens_out,
        input_cost_usd=cost_in,
        cost_usd=cost,
        time_bound_s=round(seconds, 3),
        too_long=work.too_long[name],
        batch_calls=batch_calls,
        sync_cost_usd=sync_cost,
        batch_cost_usd=batch_cost,
        estimated=name in work.estimated,
        free=is_local(mcfg) and mcfg.price is None,
        latency_s=latency.seconds,
        latency_source=latency.source,
        cached_tokens=read,
        cache_write_tokens=written,
        cached_savings_usd=savings,
    )


def _price_stage(cfg: RunConfig, work: StageWork, rates: dict[str, Rates | None], lat: dict[str, Latency]) -> StagePlan:
    models = {name: _price_model(cfg.models[name], work, name, rates.get(name), lat[name]) for name in work.calls}
    times = [m.time_bound_s for m in models.values()]
    outs = [m.output_tokens_max for m in models.values()]
    return StagePlan(
        calls=sum(m.calls for m in models.values()),
        by_model={k: m.calls for k, m in models.items()},
        upper_bound=bool(work.bounded & set(models)),
        input_tokens=sum(m.input_tokens for m in models.values()),
        output_tokens_max=None if None in outs else sum(outs),
        input_cost_usd=sum_or_none([m.input_cost_usd for m in models.values()]),
        cost_usd=sum_or_none([m.cost_usd for m in models.values()]),
        time_bound_s=round(sum(times) if work.sequential else max(times, default=0.0), 3),
        models=models,
        note=work.note,
        batch_calls=sum(m.batch_calls for m in models.values()),
        sync_cost_usd=sum_or_none([m.sync_cost_usd for m in models.values()]),
        batch_cost_usd=sum_or_none([m.batch_cost_usd for m in models.values()]),
        estimated=bool(work.estimated & set(models)),
        cached_tokens=sum(m.cached_tokens for m in models.values()),
        cached_savings_usd=sum_or_none([m.cached_savings_usd for m in models.values()]),
    )


def _price_notes(cfg: RunConfig, per_model: list[tuple[str, ModelPlan]], rates: dict[str, Rates | None]) -> list[str]:
    notes = []
    unpriced = sorted({name for name, m in per_model if m.cost_usd is None})
    no_ceiling = sorted(name for name in unpriced if rates.get(name) is not None)
    if no_ceiling:
        notes.append(f"no params.max_tokens, so output is unbounded: {', '.join(no_ceiling)}")
    no_batch_api = sorted({name for name, _ in per_model if not batch_provider(cfg.models[name])})
    unbatched = [name for name in no_batch_api if cfg.models[name].mode != "sync"]
    # Where a provider's batch API takes some of its models only, its protocol says which.
    protocols = {batch_protocol_of(cfg.models[name]) for name in no_batch_api}
    why = "".join(f"; {p.takes_only}" for p in sorted(protocols - {None}, key=str) if p.takes_only)
    if unbatched:
        notes.append(
            f"mode: batch, but no batch API the gateway speaks for the model (OpenAI-style, Anthropic, Vertex AI "
            f"and Bedrock's Claude and Nova models have one{why}): {', '.join(unbatched)}: sent, priced and timed "
            "synchronously"
        )
    if no_batch_api:
        notes.append(
            f"batch_cost_usd (every model in mode: batch) keeps these synchronous, the gateway speaking no batch "
            f"API for them{f' ({why[2:]})' if why else ''}: {', '.join(no_batch_api)}"
        )
    return notes


def price_warnings(cfg: RunConfig, names: list[str], rates: dict[str, Rates | None]) -> list[str]:
    """Models that are not local and have no price: their cost is unknown, never counted as $0."""
    unknown = sorted(name for name in names if rates.get(name) is None)
    if not unknown:
        return []
    return [
        f"no price for {', '.join(unknown)} (not local; neither the config's price nor LiteLLM's map has one): "
        "the cost is unknown, not zero; set models.NAME.price"
    ]


def priced_plan(
    cfg: RunConfig,
    work: dict[str, StageWork],
    *,
    latency_s: float,
    notes: list[str],
    method: str = "refusalbench",
    warnings: list[str] | None = None,
    uses: Collection[str] = (),
) -> Plan:
    """The plan of the stages in ``work`` (in its order): priced, timed, summed; with the missing
    credentials (of the planned models and of ``uses``, the models the run names, also those
    left out as unavailable), the unknown prices and where each model's seconds per call come from."""
    names = list(dict.fromkeys(m for w in work.values() for m in w.calls))
    rates = model_rates(cfg, set(names))
    latencies = model_latencies(cfg, names, latency_s)
    stages = {name: _price_stage(cfg, stage, rates, latencies) for name, stage in work.items()}
    per_model = [m for s in stages.values() for m in s.models.items()]
    notes = list(notes)
    if line := latency_note(latencies, latency_s):
        notes.append(line)
    notes += _price_notes(cfg, per_model, rates)
    outs = [s.output_tokens_max for s in stages.values()]
    total = PlanTotal(
        calls=sum(s.calls for s in stages.values()),
        upper_bound=any(s.upper_bound for s in stages.values()),
        input_tokens=sum(s.input_tokens for s in stages.values()),
        output_tokens_max=None if None in outs else sum(outs),
        input_cost_usd=sum_or_none([s.input_cost_usd for s in stages.values()]),
        cost_usd=sum_or_none([s.cost_usd for s in stages.values()]),
        priced_cost_usd=round(sum(m.cost_usd for _, m in per_model if m.cost_usd is not None), 6),
        unpriced_models=sorted({name for name, m in per_model if m.cost_usd is None}),
        time_bound_s=round(sum(s.time_bound_s for s in stages.values()), 3),
        batch_calls=sum(s.batch_calls for s in stages.values()),
        sync_cost_usd=sum_or_none([s.sync_cost_usd for s in stages.values()]),
        batch_cost_usd=sum_or_none([s.batch_cost_usd for s in stages.values()]),
        priced_sync_cost_usd=round(sum(m.sync_cost_usd for _, m in per_model if m.sync_cost_usd is not None), 6),
        priced_batch_cost_usd=round(sum(m.batch_cost_usd for _, m in per_model if m.batch_cost_usd is not None), 6),
        estimated=any(s.estimated for s in stages.values()),
        cached_tokens=sum(s.cached_tokens for s in stages.values()),
        cached_savings_usd=sum_or_none([s.cached_savings_usd for s in stages.values()]),
    )
    if total.batch_calls:
        notes.append(
            "batch-mode calls are priced at the batch price and take up to the model's batch.max_wait_s "
            "(the provider's window; most batches finish sooner); items a batch fails are sent synchronously"
        )
    alerts = [*(warnings or []), *missing_key_warnings(cfg, [*names, *uses]), *price_warnings(cfg, names, rates)]
    guessed = sorted(n for n, lat in latencies.items() if lat.source == "assumed" and is_local(cfg.models[n]))
    if guessed:
        alerts.append(
            f"no measured speed for local {'model' if len(guessed) == 1 else 'models'} {', '.join(guessed)}: "
            f"timed at --latency ({latency_s:g} s per call), likely too little on a small machine; a run's "
            "calls measure it (the call cache), or set local.seconds_per_call"
        )
    return Plan(
        config=cfg.source,
        latency_s=latency_s,
        stages=stages,
        total=total,
        notes=notes,
        method=method,
        warnings=alerts,
    )
