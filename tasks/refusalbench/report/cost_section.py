"""The report's "Cost of this run" section, and the rows of the Prefect ``run-costs`` table.

Read from the manifest's ``costs`` (``tasks/llm/accounting.py``: ``cost_summary``): spend per stage
and model, the calls no price was known for (counted apart, never as $0), the prompt tokens the
providers served from their prompt caches with what that saved (``cached_savings_usd``: at the full
input price less the cached price, the cache-write premium taken off) beside what the calls sharing a
prompt prefix were expected to read and save (``expected_cached_*``), and what sending calls
through the batch API saved (``batch_savings_usd``). A manifest without costs (a run folder from
before they were recorded, ``score FILE``) has no section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.core.html_page import escape, section

EXPECTED = (
    "what the calls sharing a prompt prefix (the judge's per item, the verifier's per item and lever) were "
    "expected to read from the provider's prompt cache, as plan forecasts it"
)
# (label, field of a cost entry, what it is): the table's columns after stage and model.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("calls", "http_calls", "requests sent to the provider"),
    ("cache hits", "cache_hits", "calls answered from the call cache, at no cost"),
    ("prompt tokens", "prompt_tokens", "prompt tokens billed, cached ones included"),
    ("expected cached tokens", "expected_cached_tokens", EXPECTED),
    ("cached prompt tokens", "cached_tokens", "prompt tokens the provider read from its prompt cache"),
    ("completion tokens", "completion_tokens", "completion tokens billed, reasoning included"),
    ("cost (USD)", "cost_usd", "what the priced calls cost; 'unpriced' when some call had no known price"),
    ("unpriced calls", "unpriced_calls", "calls with no known price (neither the config's nor LiteLLM's)"),
    ("expected cached-prefix savings (USD)", "expected_cached_savings_usd", EXPECTED),
    ("cached-prefix savings (USD)", "cached_savings_usd", "saved by the provider's prompt cache"),
    ("batch savings (USD)", "batch_savings_usd", "saved by sending calls through the batch API"),
)
USD_FIELDS = frozenset({"cost_usd", "cached_savings_usd", "expected_cached_savings_usd", "batch_savings_usd"})


def _value(entry: Mapping[str, Any], name: str) -> Any:
    if name == "cost_usd" and entry.get("cost_usd") is None:
        # Some call was unpriced: the priced part, marked, never a silent total.
        return f"{entry.get('priced_cost_usd') or 0:.4f} + unpriced"
    value = entry.get(name)
    if value is None:
        return 0
    return round(float(value), 6) if name in USD_FIELDS else int(value)


def _row(stage: str, model: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"stage": stage, "model": model, **{label: _value(entry, name) for label, name, _ in COLUMNS}}


def cost_rows(costs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One row per stage and model, each stage's total after its models, and the run's total last."""
    if not costs or not costs.get("total"):
        return []
    rows = []
    for stage, entry in (costs.get("by_stage") or {}).items():
        models = entry.get("by_model") or {}
        rows += [_row(stage, model, models[model]) for model in sorted(models)]
        if len(models) > 1:
            rows.append(_row(stage, "all models", entry))
    rows.append(_row("all stages", "all models", costs["total"]))
    return rows


def _usd(value: Any) -> str:
    return f"${float(value or 0):,.4f}"


def cost_summary_line(costs: Mapping[str, Any]) -> str:
    """One sentence: the spend, the unpriced calls and both savings."""
    total = costs["total"]
    spent = _usd(total.get("priced_cost_usd"))
    unpriced = int(total.get("unpriced_calls") or 0)
    line = f"Spent {spent} on {int(total.get('http_calls') or 0)} calls"
    if unpriced:
        line += f" (and {unpriced} calls with no known price, not counted)"
    # The savings clauses only where there was something to save: a local run's line stays short.
    cached, expected = int(total.get("cached_tokens") or 0), int(total.get("expected_cached_tokens") or 0)
    if cached or expected:
        saved = _usd(total.get("cached_savings_usd"))
        line += f"; the providers' prompt caches served {cached:,} prompt tokens, saving {saved}"
    if expected:
        line += f" (expected: {expected:,}, saving {_usd(total.get('expected_cached_savings_usd'))})"
    if total.get("batch_savings_usd"):
        line += f"; the batch API saved {_usd(total.get('batch_savings_usd'))}"
    line += "."
    budget = costs.get("budget_usd")
    return line + (f" Budget: {_usd(budget)}." if budget is not None else "")


def cost_section(manifest: Mapping[str, Any] | None) -> str | None:
    """The section, or None when the manifest records no costs."""
    costs = (manifest or {}).get("costs") or {}
    rows = cost_rows(costs)
    if not rows:
        return None
    head = (
        "<tr><th class='name'>Stage</th><th class='name'>Model</th>"
        + "".join(f"<th title='{escape(tip)}'>{escape(label)}</th>" for label, _, tip in COLUMNS)
        + "</tr>"
    )
    body = "".join(
        "<tr>"
        + f"<td class='name'>{escape(row['stage'])}</td><td class='name'>{escape(row['model'])}</td>"
        + "".join(f"<td>{escape(row[label])}</td>" for label, _, _ in COLUMNS)
        + "</tr>"
        for row in rows
    )
    lead = (
        f"<p>{escape(cost_summary_line(costs))} Prices: the model's <code>price</code> in the config, else "
        "LiteLLM's price map; cached prompt tokens at the cached price. Savings compare with the same calls "
        "sent synchronously at the full input price.</p>"
    )
    return section("Cost of this run", lead + f"<table>{head}{body}</table>")
