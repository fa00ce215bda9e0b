"""``plan``'s prices: what one token costs each model, sent synchronously and through the batch API.

The config's ``price`` overrides LiteLLM's offline map; our own llama.cpp server costs nothing;
a model in neither is unknown (None), never $0. The batch price: the config's
``batch_input_per_mtok`` / ``batch_output_per_mtok``, else the map's ``*_cost_per_token_batches``,
else the share of the synchronous price the model's batch protocol declares (``BatchProtocol.price_share``:
the share the providers publish). Whether a model has a batch API at all is its provider profile's say.
The prompt cache's read and write prices: the config's ``cached_input_per_mtok`` (writes at
``accounting.CACHE_WRITE_PRICE_SHARE`` of the input price), else the map's ``cache_read_input_token_cost``
and ``cache_creation_input_token_cost``.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from refusalbench.tasks.core.config import BATCH_PRICE_SHARE, ModelConfig, ModelPrice, RunConfig
from refusalbench.tasks.llm.accounting import CACHE_WRITE_PRICE_SHARE
from refusalbench.tasks.llm.providers import profile_for

# (input, output) USD per token
TokenPrice = tuple[float, float]


@dataclass(frozen=True)
class Rates:
    """One model's USD per token: synchronous and through the provider's batch API."""

    sync: TokenPrice
    batch: TokenPrice
    cache_read: float | None = None  # a prompt token read from the provider's cache (None: the input price)
    cache_write: float | None = None  # a prompt token written to it (None: the write premium's share of it)

    def of(self, batch: bool) -> TokenPrice:
        return self.batch if batch else self.sync

    def cache_savings(self, read: int, written: int) -> float:
        """What ``read`` tokens from the cache save against the input price, less the premium of ``written``."""
        full = self.sync[0]
        cached = full if self.cache_read is None else self.cache_read
        write = full * CACHE_WRITE_PRICE_SHARE if self.cache_write is None else self.cache_write
        return round(read * (full - cached) - written * (write - full), 6)

    def cost(self, input_tokens: int, output_tokens: int | None, *, batch: bool) -> tuple[float, float | None]:
        """(the input's cost, input + output) of these tokens; the second None when output is unbounded."""
        unit_in, unit_out = self.of(batch)
        cost_in = input_tokens * unit_in
        return cost_in, None if output_tokens is None else cost_in + output_tokens * unit_out


def batch_protocol_of(cfg: ModelConfig) -> Any:
    """The batch protocol ``cfg``'s provider profile names (a ``BatchProtocol`` class), or None."""
    return None if cfg.rule_based else profile_for(cfg.model, cfg.api_base).batch_protocol


def batch_provider(cfg: ModelConfig) -> bool:
    """Whether ``cfg``'s provider has a batch API the gateway speaks for the model: its profile names a batch
    protocol that takes it."""
    protocol = batch_protocol_of(cfg)
    return protocol is not None and protocol.takes(cfg.model)


def batch_share(cfg: ModelConfig) -> float:
    """The batch price as a share of the synchronous one where neither the config nor LiteLLM's map says:
    what the model's batch protocol declares (the published half where it has none)."""
    protocol = profile_for(cfg.model, cfg.api_base).batch_protocol
    return protocol.price_share if protocol is not None else BATCH_PRICE_SHARE


def sends_batches(cfg: ModelConfig, stage: str | None) -> bool:
    """Whether ``cfg``'s calls of ``stage`` go through a batch API: in batch mode for the stage, with a provider
    that has one; a model of another provider in batch mode is sent synchronously, as the gateway sends it."""
    return cfg.batch_mode(stage) and batch_provider(cfg)


def _share(price: TokenPrice, share: float) -> TokenPrice:
    return price[0] * share, price[1] * share


def _config_rates(cfg: ModelConfig, price: ModelPrice) -> Rates:
    """The rates of ``cfg``'s own ``price`` (the batch ones the share of the synchronous where it names none)."""
    unit = (price.input_per_mtok / 1e6, price.output_per_mtok / 1e6)
    batch_in, batch_out = _share(unit, batch_share(cfg))
    if price.batch_input_per_mtok is not None:
        batch_in = price.batch_input_per_mtok / 1e6
    if price.batch_output_per_mtok is not None:
        batch_out = price.batch_output_per_mtok / 1e6
    cached = None if price.cached_input_per_mtok is None else price.cached_input_per_mtok / 1e6
    return Rates(unit, (batch_in, batch_out), cached)


def model_rates(cfg: RunConfig, names: Collection[str]) -> dict[str, Rates | None]:
    """Each model's :class:`Rates`; None: its price is unknown."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    rates: dict[str, Rates | None] = {}
    for name in names:
        model = cfg.models[name]
        if model.price is not None:  # the user's price overrides the map
            rates[name] = _config_rates(model, model.price)
            continue
        if model.local is not None and not model.api_base:
            rates[name] = Rates((0.0, 0.0), (0.0, 0.0))  # our own llama.cpp server: no provider bills these calls
            continue
        try:
            info = litellm.get_model_info(model.model)
        except Exception:  # "This model isn't mapped yet": self-hosted and local models
            rates[name] = None
            continue
        unit_in, unit_out = info.get("input_cost_per_token"), info.get("output_cost_per_token")
        if unit_in is None or unit_out is None:
            rates[name] = None
            continue
        sync = (float(unit_in), float(unit_out))
        batch_in, batch_out = _share(sync, batch_share(model))
        if (batch_unit_in := info.get("input_cost_per_token_batches")) is not None:
            batch_in = float(batch_unit_in)
        if (batch_unit_out := info.get("output_cost_per_token_batches")) is not None:
            batch_out = float(batch_unit_out)
        read, write = info.get("cache_read_input_token_cost"), info.get("cache_creation_input_token_cost")
        rates[name] = Rates(
            sync, (batch_in, batch_out), None if read is None else float(read), None if write is None else float(write)
        )
    return rates


def sum_or_none(values: list[float | None]) -> float | None:
    """The sum, rounded to a millionth of a dollar; None as soon as one value is unknown."""
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else round(sum(known), 6)
