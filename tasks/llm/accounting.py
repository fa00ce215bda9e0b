"""What the model calls cost: the gateway's counters per model and per stage, and each reply's price.

- Every counter is kept twice: per model (the manifest's ``calls``) and per (stage, model) (its
  ``costs``). A call's stage is the caller's tag, never the time it ran: respond and judge overlap,
  and each call still counts for its own stage. The tag is set on the spec (``CallSpec.stage``), or
  taken from :func:`stage` around the calls, or from the resolver the pipeline installs (the
  Prefect task's name); without any of them the call's cache role stands in.
- A reply's cost: the model's ``price`` in the config (USD per million tokens, cached prompt tokens
  at their own price) overrides LiteLLM's offline map; the map's price (LiteLLM's
  ``completion_cost``) otherwise; our own llama.cpp server costs nothing; anything else is
  unknown: ``None``, counted as an unpriced call, never as $0.
- A billed reply the gateway rejects (empty, filtered, truncated) keeps its tokens and cost.
- A reply through a batch API (``batch_calls``) costs the batch price: the config's ``batch_*`` prices
  (default half), else LiteLLM's ``*_cost_per_token_batches``, else half; ``batch_savings_usd`` is
  its synchronous price less that.
- Prompt caching (``prompt_cache``): prompt tokens read from the provider's cache (``cached_tokens``)
  cost the cached price (the config's ``cached_input_per_mtok``, else LiteLLM's
  ``cache_read_input_token_cost``), tokens written to it (``cache_write_tokens``, Anthropic's cache
  creation) :data:`CACHE_WRITE_PRICE_SHARE` of the input price; ``cached_savings_usd`` is what the
  cached tokens would have cost at the full input price less what they cost, the write premium
  taken off. Beside them, what the calls sharing a prompt prefix were expected to read and save
  (``expected_cached_tokens``, ``expected_cached_savings_usd``: ``prompt_cache.expected_amounts``).
- An embedding request (``embedding_calls``) counts under the stage :data:`EMBED_STAGE`: its input tokens
  (the provider's ``usage``, else characters / 4) at the model's input price (:func:`embedding_token_price`).
- A budget that admits calls before they are sent (the pipeline's ``budget_usd``) is a :class:`SpendGate`
  set around a run's stages (:func:`spend_gate`); the calls sent inside ask it first (:func:`admitted`).
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from refusalbench.tasks.core.config import BATCH_PRICE_SHARE, ModelConfig

if TYPE_CHECKING:
    from refusalbench.tasks.llm.calls import CallSpec
    from refusalbench.tasks.llm.transport import Reply

# The counters a stage keeps per model (the per-model ``calls`` keep these and the rest: retries, errors ...).
STAGE_COUNTERS: tuple[str, ...] = (
    "http_calls",
    "cache_hits",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "cost_usd",
    "unpriced_calls",
    "cached_savings_usd",
)
TOKEN_COUNTERS = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens", "cache_write_tokens")
# The counters in USD a run's cost summary sums beside ``cost_usd`` (the batch path's, where it counts them).
SAVINGS_COUNTERS = ("cached_savings_usd", "batch_savings_usd")
# What a prompt-cache write costs against the input price: Anthropic (and Bedrock's Claude) bill a
# 5-minute cache write at 1.25x; providers with automatic caching report no writes and bill none.
CACHE_WRITE_PRICE_SHARE = 1.25
# The batch path's counters (``batch_calls``), kept per stage too: replies a batch API answered, requests
# a batch failed that were sent synchronously instead, what the batch price saved against the sync price.
BATCH_COUNTERS = ("batch_calls", "batch_fallbacks", "batch_savings_usd")
STAGE_COUNTERS += BATCH_COUNTERS
# What the calls sharing a prompt prefix were expected to read from the provider's cache and save
# (``prompt_cache.expected_amounts``, plan's arithmetic over the calls sent), beside what they did.
EXPECTED_CACHE_COUNTERS = ("expected_cached_tokens", "expected_cached_savings_usd")
STAGE_COUNTERS += EXPECTED_CACHE_COUNTERS
UNTAGGED = "other"  # the stage of a call nobody tagged and that has no cache role
EMBED_STAGE = "embed"  # the stage embedding requests count under
EMBED_CHARS_PER_TOKEN = 4  # an embedding request's tokens before the provider says (as ``plan`` counts prompts)

_stage: ContextVar[str | None] = ContextVar("refusalbench_call_stage", default=None)
_stage_resolver: list[Callable[[], str | None]] = []  # the pipeline's: the running Prefect task's stage


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Tag the calls made inside this block (in this thread or task) with stage ``name``."""
    token = _stage.set(name)
    try:
        yield
    finally:
        _stage.reset(token)


def install_stage_resolver(resolver: Callable[[], str | None]) -> None:
    """Where untagged calls learn their stage (the pipeline: the running task's name); one at a time."""
    _stage_resolver[:] = [resolver]


def current_stage(role: str | None = None) -> str:
    """The stage of a call made here now: :func:`stage`'s tag, the resolver's, else ``role``."""
    return _tag() or role or UNTAGGED


def _tag() -> str | None:
    tagged = _stage.get()
    if tagged is None and _stage_resolver:
        try:
            tagged = _stage_resolver[0]()
        except Exception:  # accounting must never fail a call
            tagged = None
    return tagged


class SpendGate(Protocol):
    """What admits calls against a budget before they are sent (the pipeline's ``budget.Budget``)."""

    def admitted(self, stage: str, model: str, estimate_usd: float, what: str) -> AbstractContextManager[None]:
        """Held while calls estimated at ``estimate_usd`` are sent; raises instead when they would exceed it."""
        ...


_gate: ContextVar[SpendGate | None] = ContextVar("refusalbench_spend_gate", default=None)


@contextmanager
def spend_gate(gate: SpendGate | None) -> Iterator[None]:
    """Calls that ask :func:`admitted` inside this block (and in the threads a task runner starts from it,
    which copy the context) ask ``gate``; None: nothing to ask."""
    token = _gate.set(gate)
    try:
        yield
    finally:
        _gate.reset(token)


def admitted(stage: str, model: str, estimate_usd: float, what: str) -> AbstractContextManager[None]:
    """The gate's admission of calls estimated at ``estimate_usd`` (``what``: which, for its message);
    nothing to hold where no gate is set."""
    gate = _gate.get()
    return nullcontext() if gate is None else gate.admitted(stage, model, estimate_usd, what)


def gated() -> bool:
    """Whether a spend gate is set here."""
    return _gate.get() is not None


def tagged(specs: Iterable[CallSpec]) -> list[CallSpec]:
    """``specs`` each with its stage: read in the caller's thread, since the calls run on the gateway's loop
    (once per batch: the resolver asks Prefect's context)."""
    out = []
    unread, tag = True, None
    for spec in specs:
        if not spec.stage and unread:
            unread, tag = False, _tag()
        out.append(spec if spec.stage else spec.model_copy(update={"stage": tag or spec.role or UNTAGGED}))
    return out


# ---------------------------------------------------------------- prices


def reply_cost(cfg: ModelConfig, reply: Reply, cached_tokens: int | None, *, batch: bool = False) -> float | None:
    """What ``reply`` cost in USD: the config's ``price``, else LiteLLM's, else 0 on our own llama.cpp
    server; None when unknown. A reply the provider withheld with a 400 (no usage) billed nothing.
    ``batch``: it came through a batch API, at the batch price (``batch_cost``)."""
    if reply.prompt_tokens is None and reply.completion_tokens is None and reply.finish_reason == "content_filter":
        return 0.0
    if cfg.price is not None:
        if reply.prompt_tokens is None and reply.completion_tokens is None:
            return None  # no usage reported: the user's price has nothing to multiply
        written = min(reply.cache_write_tokens or 0, reply.prompt_tokens or 0)
        premium = written * cfg.price.input_per_mtok * (CACHE_WRITE_PRICE_SHARE - 1) / 1e6
        return (
            cfg.price.cost(reply.prompt_tokens or 0, reply.completion_tokens or 0, cached_tokens or 0, batch=batch)
            + premium
        )
    if reply.cost_usd is not None:
        return map_batch_cost(cfg.model, reply) if batch else float(reply.cost_usd)
    if cfg.local is not None and not cfg.api_base:
        return 0.0  # our own llama.cpp server: no provider bills these calls (as ``plan`` prices them)
    return None


def embedding_token_price(cfg: ModelConfig) -> float | None:
    """USD per input token of an embedding model: the config's ``price`` (its ``input_per_mtok``), else
    LiteLLM's offline map (``input_cost_per_token``, read without importing LiteLLM), 0 on our own
    llama.cpp server; None when unknown (its requests count as unpriced, never as $0)."""
    if cfg.price is not None:
        return cfg.price.input_per_mtok / 1e6
    if cfg.local is not None and not cfg.api_base:
        return 0.0
    return _map_input_price(cfg.model)


@functools.lru_cache(maxsize=64)
def _map_input_price(model: str) -> float | None:
    from refusalbench.tasks.llm.litellm_import import cost_map

    prices = cost_map()
    for name in (model, model.split("/", 1)[-1]):  # LiteLLM's map names OpenAI's models without the prefix
        entry = prices.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("input_cost_per_token"), (int, float)):
            return float(entry["input_cost_per_token"])
    return None


def embedding_tokens(texts: Iterable[str]) -> int:
    """An embedding request's input tokens before the provider counts them: characters / 4, at least one per text."""
    return sum(max(1, -(-len(text) // EMBED_CHARS_PER_TOKEN)) for text in texts)


def map_batch_cost(model: str, reply: Reply) -> float:
    """A batch reply's price from LiteLLM's map: its ``*_cost_per_token_batches`` where the map has
    them, else half of each token's price (LiteLLM's own batch rule); the share of the synchronous
    cost where the map cannot price it per token."""
    from litellm.cost_calculator import batch_cost_calculator

    from refusalbench.tasks.llm.transport import litellm_module

    usage = litellm_module().Usage(
        prompt_tokens=reply.prompt_tokens or 0,
        completion_tokens=reply.completion_tokens or 0,
        total_tokens=(reply.prompt_tokens or 0) + (reply.completion_tokens or 0),
    )
    try:
        prompt, completion = batch_cost_calculator(usage, model)
    except Exception:  # a model the map names differently: the published batch share of what it cost
        prompt = completion = 0.0
    if not prompt and not completion:
        return float(reply.cost_usd or 0) * BATCH_PRICE_SHARE
    return float(prompt + completion)


def batch_billing(cfg: ModelConfig, reply: Reply) -> dict[str, Any]:
    """What a batch reply adds to its cached value: the mark, and ``batch_savings_usd`` (its synchronous
    price less its batch price; None when either is unknown)."""
    sync, batch = reply_cost(cfg, reply, reply.cached_tokens), reply_cost(cfg, reply, reply.cached_tokens, batch=True)
    return {"batch": True, "batch_savings_usd": None if sync is None or batch is None else round(sync - batch, 12)}


def prompt_cache_billing(cfg: ModelConfig, reply: Reply) -> dict[str, Any]:
    """What a reply's prompt-cache tokens add to its cached value: the tokens written to the cache and
    ``cached_savings_usd`` (None when the model's prices are unknown); nothing when it used no cache."""
    read, written = reply.cached_tokens or 0, reply.cache_write_tokens or 0
    if not read and not written:
        return {}
    prices = prompt_token_prices(cfg)
    savings = None
    if prices is not None:
        full, cached, write = prices
        savings = round(read * (full - cached) - written * (write - full), 12)
    return {"cache_write_tokens": written or None, "cached_savings_usd": savings}


def prompt_token_prices(cfg: ModelConfig) -> tuple[float, float, float] | None:
    """USD per prompt token of ``cfg``: (full, read from the cache, written to it); None when unknown."""
    if cfg.price is not None:
        full = cfg.price.input_per_mtok / 1e6
        cached = full if cfg.price.cached_input_per_mtok is None else cfg.price.cached_input_per_mtok / 1e6
        return full, cached, full * CACHE_WRITE_PRICE_SHARE
    return _map_prompt_token_prices(cfg.model)


@functools.lru_cache(maxsize=256)
def _map_prompt_token_prices(model: str) -> tuple[float, float, float] | None:
    """LiteLLM's map's prices for ``model`` (read once per model: a priced reply came through LiteLLM,
    so it is imported already). A model the direct path may call is one the map has no price for
    (``transport.unpriced_model``): its savings are unknown without importing LiteLLM (seconds of CPU
    in a process whose calls all went direct)."""
    from refusalbench.tasks.llm.transport import litellm_module, unpriced_model

    if unpriced_model(model):
        return None
    try:
        info = litellm_module().get_model_info(model=model)
    except Exception:  # not in the map: the savings are unknown, as the cost is
        return None
    full = info.get("input_cost_per_token")
    if not full:
        return None
    cached = info.get("cache_read_input_token_cost")
    write = info.get("cache_creation_input_token_cost")
    return (
        float(full),
        float(full if cached is None else cached),
        float(full * CACHE_WRITE_PRICE_SHARE if write is None else write),
    )


def billed_amounts(value: dict[str, Any]) -> dict[str, float]:
    """The counters one billed reply adds (its cached value's tokens and cost)."""
    amounts: dict[str, float] = {name: value.get(name) or 0 for name in TOKEN_COUNTERS}
    amounts["cached_savings_usd"] = value.get("cached_savings_usd") or 0
    if value.get("batch"):
        amounts.update(batch_calls=1, batch_savings_usd=value.get("batch_savings_usd") or 0)
    if value.get("cost_usd") is None:
        amounts["unpriced_calls"] = 1
    else:
        amounts["cost_usd"] = value["cost_usd"]
    return amounts


def add_billing(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """``second`` (a reply asked again) carrying what both replies billed: a record's tokens and
    cost are what its call cost in all, so records add up to the manifest's totals."""
    merged = dict(second)
    for name in TOKEN_COUNTERS:
        if first.get(name) is not None or second.get(name) is not None:
            merged[name] = (first.get(name) or 0) + (second.get(name) or 0)
    first_cost, second_cost = first.get("cost_usd"), second.get("cost_usd")
    merged["cost_usd"] = None if first_cost is None or second_cost is None else first_cost + second_cost
    if first.get("cached_savings_usd") or second.get("cached_savings_usd"):
        merged["cached_savings_usd"] = (first.get("cached_savings_usd") or 0) + (second.get("cached_savings_usd") or 0)
    return merged


# ---------------------------------------------------------------- counters


def _tally() -> defaultdict[str, float]:
    """Counters of one model (or one stage's model): calls and tokens (ints), costs (floats). A
    ``defaultdict(int)`` rather than a ``Counter``, which is typed for int counts only; an int counter
    stays an int, as it did in a ``Counter``."""
    return defaultdict(int)


class UsageCounters:
    """The gateway's counters: per model, and per (stage, model) for :data:`STAGE_COUNTERS`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_model: dict[str, defaultdict[str, float]] = defaultdict(_tally)
        self.by_stage: dict[str, dict[str, defaultdict[str, float]]] = defaultdict(lambda: defaultdict(_tally))

    def count(self, model: str, stage_name: str | None = None, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                if amount:
                    self.by_model[model][name] += amount
                    if stage_name is not None and name in STAGE_COUNTERS:
                        self.by_stage[stage_name][model][name] += amount

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {model: dict(counter) for model, counter in self.by_model.items()}

    def stage_snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        """{stage: {model: counters}} so far."""
        with self._lock:
            return {name: {model: dict(c) for model, c in models.items()} for name, models in self.by_stage.items()}


# ---------------------------------------------------------------- a run's cost summary


def cost_entry(counters: Iterable[dict[str, float]]) -> dict[str, Any]:
    """Calls, tokens and cost of some counters summed: ``cost_usd`` is None as soon as one call
    was unpriced (``priced_cost_usd`` then sums the priced ones, ``unpriced_calls`` says how many)."""
    counted = list(counters)
    total = {name: sum(c.get(name, 0) for c in counted) for name in STAGE_COUNTERS}
    priced = round(float(total["cost_usd"]), 10)
    unpriced = int(total["unpriced_calls"])
    entry: dict[str, Any] = {"http_calls": int(total["http_calls"]), "cache_hits": int(total["cache_hits"])}
    entry.update({name: int(total[name]) for name in TOKEN_COUNTERS})
    entry.update(cost_usd=None if unpriced else priced, priced_cost_usd=priced, unpriced_calls=unpriced)
    # What prompt caching and the batch API saved against full-price synchronous calls (priced calls only).
    entry.update({name: round(float(sum(c.get(name, 0) for c in counted)), 10) for name in SAVINGS_COUNTERS})
    entry.update({name: int(sum(c.get(name, 0) for c in counted)) for name in ("batch_calls", "batch_fallbacks")})
    entry["expected_cached_tokens"] = int(round(total["expected_cached_tokens"]))
    entry["expected_cached_savings_usd"] = round(float(total["expected_cached_savings_usd"]), 10)
    return entry


def cost_summary(by_stage: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """A run's costs (the manifest's ``costs``): ``total``, ``by_stage`` (each with ``by_model``) and
    ``by_model``, from its per-stage counters; the total is the sum of the stages by construction."""
    stages = {
        name: {**cost_entry(models.values()), "by_model": {m: cost_entry([c]) for m, c in sorted(models.items())}}
        for name, models in sorted(by_stage.items())
    }
    models = sorted({m for per_model in by_stage.values() for m in per_model})
    by_model = {m: cost_entry([per_model[m] for per_model in by_stage.values() if m in per_model]) for m in models}
    return {
        "total": cost_entry([c for per_model in by_stage.values() for c in per_model.values()]),
        "by_stage": stages,
        "by_model": by_model,
    }
