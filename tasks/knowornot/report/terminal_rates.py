"""The rates a finished KnowOrNot run prints in the terminal, and the bars ``--fail-under`` checks.

Read from the run's metrics.json (its ``configurations``: the leave-one-out questions): one row
per target, retrieval strategy and system prompt, with the abstention and factuality rates and
their 95% intervals, laid out for the terminal's width without cutting a target's name
(``core.text_table``). The same rows give the markdown table of the run's Prefect summary.
Both rates are better higher: a leave-one-out question's answer was taken out of the context,
so abstaining is right, and an answer given should be factual.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from refusalbench.tasks.core.metric_bars import MetricBar, parse_bars
from refusalbench.tasks.core.text_table import Cell, Column, FittedTable, fit_table

# metric -> (label, the columns of its interval in metrics.json); both are shares, higher is better.
RATES = {
    "abstention_rate": ("Abstention", ("abstention_ci_low", "abstention_ci_high")),
    "factuality_rate": ("Factuality", ("factuality_ci_low", "factuality_ci_high")),
}
ALIASES = {"abstention": "abstention_rate", "factuality": "factuality_rate"}


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _percent(value: Any) -> str:
    number = _number(value)
    return "—" if math.isnan(number) else f"{100 * number:.1f}%"


def _details(low: Any, high: Any) -> tuple[str, ...]:
    low, high = _number(low), _number(high)
    if math.isnan(low) or math.isnan(high):
        return ()
    return (
        f"[{100 * low:.1f}, {100 * high:.1f}]",
        f"{100 * low:.1f}–{100 * high:.1f}",
        f"{100 * low:.0f}–{100 * high:.0f}",
    )


def configurations(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The leave-one-out rows of metrics.json, by target, retrieval and prompt."""
    rows = list(document.get("configurations") or [])
    return sorted(rows, key=lambda r: (str(r.get("target")), str(r.get("retrieval")), str(r.get("prompt"))))


def _several_prompts(rows: Sequence[Mapping[str, Any]]) -> bool:
    return len({r.get("prompt") for r in rows}) > 1


def fitted_rates(document: Mapping[str, Any], width: int) -> FittedTable:
    """The rates table laid out for ``width`` characters; a prompt column only when the run has several."""
    rows = configurations(document)
    prompts = _several_prompts(rows)
    columns = [Column("Target", align="left"), Column("Retrieval", align="left")]
    columns += [Column("Prompt", align="left")] if prompts else []
    columns += [Column(label) for label, _ in RATES.values()] + [Column("n")]
    cells = []
    for row in rows:
        line = [Cell(str(row.get("target"))), Cell(str(row.get("retrieval")))]
        line += [Cell(str(row.get("prompt")))] if prompts else []
        line += [Cell(_percent(row.get(name)), _details(*(row.get(c) for c in ci))) for name, (_, ci) in RATES.items()]
        cells.append([*line, Cell(str(int(_number(row.get("n")) if row.get("n") is not None else 0)))])
    return fit_table(columns, cells, width, key=0)


def rates_note(width: int) -> list[str]:
    return textwrap.wrap(
        "Leave-one-out questions; intervals: 95% bootstrap. Higher is better for both rates.", width=max(width, 20)
    )


def _label(row: Mapping[str, Any], prompts: bool) -> str:
    where = f"{row.get('retrieval')}, {row.get('prompt')}" if prompts else str(row.get("retrieval"))
    return f"{row.get('target')} ({where})"


def target_values(document: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{"target (retrieval[, prompt])": {rate: value}} for ``--fail-under``."""
    rows = configurations(document)
    prompts = _several_prompts(rows)
    return {_label(row, prompts): {name: _number(row.get(name)) for name in RATES} for row in rows}


def parse_fail_under(texts: Iterable[str]) -> list[MetricBar]:
    """``--fail-under`` bars against KnowOrNot's rates (InputError, exit 2, on a bad one)."""
    return parse_bars(texts, {name: True for name in RATES}, ALIASES, shares=RATES)


def rates_markdown(document: Mapping[str, Any]) -> str:
    """The rates as a markdown table (the run's Prefect summary)."""
    rows = configurations(document)
    header = ["Target", "Retrieval", "Prompt", *(label for label, _ in RATES.values()), "n"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        rates = [
            f"{_percent(row.get(name))} {(_details(*(row.get(c) for c in ci)) or ('',))[0]}".strip()
            for name, (_, ci) in RATES.items()
        ]
        cells = [str(row.get("target")), str(row.get("retrieval")), str(row.get("prompt")), *rates, str(row.get("n"))]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
