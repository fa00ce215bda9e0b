"""What ``budget_usd`` needs before a run: every model it calls priced, and a ceiling for one call of each.

- A model is free when it makes no billed call: the rule-based generator, and a ``local`` model on our
  own llama.cpp server. Otherwise its price is its ``price`` in the config, else LiteLLM's offline map
  (``plan/prices.model_rates``); a model with neither is unpriced.
- A budget over an unpriced model bounds nothing, so a run with one is refused before any call (one
  line, exit 2) unless the config says how to count them: ``budget_unpriced: free`` counts their calls
  as $0 (a manifest note says so).
- One call's ceiling: its prompt tokens (``plan``'s measure: characters / 4 of the rendered messages)
  at the input price, plus the call's output cap at the output price: ``max_tokens`` where the model
  sets it, else the provider's own cap for the model in LiteLLM's map, else :data:`DEFAULT_OUTPUT_CAP`.
  Calls a model sends through the batch API count at the batch price.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.plan_prices import model_rates, sends_batches
from refusalbench.tasks.llm.plan_pricing import CHARS_PER_TOKEN, max_tokens

# Output tokens counted for a call of a model that sets no max_tokens and that LiteLLM's map gives no
# cap for (a self-hosted server): the common default cap of OpenAI-compatible servers and of
# LiteLLM's Anthropic calls. Setting ``params.max_tokens`` makes the estimate exact.
DEFAULT_OUTPUT_CAP = 4096


def free(cfg: ModelConfig) -> bool:
    """Whether ``cfg``'s calls cost nothing: run in process, or on our own llama.cpp server."""
    return cfg.rule_based or (cfg.local is not None and not cfg.api_base)


@functools.lru_cache(maxsize=256)
def _mapped_output_cap(model: str) -> int | None:
    from refusalbench.tasks.llm.litellm_import import litellm_module

    try:
        info = litellm_module().get_model_info(model)
    except Exception:  # not in the map: a self-hosted model
        return None
    cap = info.get("max_output_tokens") or info.get("max_tokens")
    return int(cap) if isinstance(cap, (int, float)) and cap > 0 else None


def output_cap(cfg: ModelConfig) -> int:
    """The most output tokens one call of ``cfg`` can bill: its max_tokens, else the provider's cap."""
    return max_tokens(cfg) or _mapped_output_cap(cfg.model) or DEFAULT_OUTPUT_CAP


def unpriced(cfg: RunConfig, names: Iterable[str]) -> list[str]:
    """The models of ``names`` that make billed calls and have no price in the config or LiteLLM's map."""
    billed = sorted({n for n in names if n in cfg.models and not free(cfg.models[n])})
    rates = model_rates(cfg, billed)
    return [n for n in billed if rates[n] is None]


def check_budget_prices(cfg: RunConfig, names: Iterable[str]) -> None:
    """Refuse a budget that cannot bound the models ``names`` (bad input, exit 2, before any call)."""
    if cfg.budget_usd is None or cfg.budget_unpriced == "free":
        return
    missing = unpriced(cfg, names)
    if missing:
        listed = ", ".join(missing)
        raise InputError(
            str(cfg.source),
            f"budget_usd cannot bound {listed}: no price in the config or LiteLLM's price map; set "
            f"models.<name>.price.input_per_mtok and output_per_mtok for {listed}, or budget_unpriced: free "
            "to count their calls as $0",
            field="budget_usd",
        )


def call_ceiling(cfg: RunConfig, name: str, stage: str, prompt_tokens: float) -> float:
    """USD one call of model ``name`` in ``stage`` can cost at most: ``prompt_tokens`` in, its output cap out;
    0 for a free model or an unpriced one the config counts as free."""
    model = cfg.models[name]
    rates = None if free(model) else model_rates(cfg, [name])[name]
    if rates is None:
        return 0.0
    unit_in, unit_out = rates.of(sends_batches(model, stage))
    return prompt_tokens * unit_in + output_cap(model) * unit_out


def text_tokens(chars: float) -> float:
    """Tokens of ``chars`` characters of prompt, as ``plan`` counts them."""
    return chars / CHARS_PER_TOKEN
