"""Report section on the targets' replies themselves (``responses.parquet``).

- :func:`reply_metadata_table`: per model, how many replies carried reasoning, the reasoning
  tokens the providers reported, how the replies finished and which model served them.
- :func:`response_sample_html`: a few replies per model, each with its reasoning behind a
  ``<details>`` element, shown on demand.

A run folder written before replies carried their metadata has none of these columns: the
section then shows what there is (the sample without reasoning) or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core.html_page import escape, is_nan, section

SAMPLE_PER_MODEL = 5
SHOWN_CHARS = 1500  # of an answer or a reasoning text in the sample; the Parquet file has them whole


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index, dtype=object)


def _has_text(values: pd.Series) -> pd.Series:
    return values.map(lambda value: isinstance(value, str) and bool(value.strip()))


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"… ({len(text) - SHOWN_CHARS} more characters)"


def _models(frame: pd.DataFrame, order: Sequence[str]) -> list[str]:
    present = set(frame["model"].astype(str))
    return [m for m in order if m in present] + sorted(present - set(order))


def _counts(values: pd.Series) -> str:
    counts = values.dropna().astype(str).value_counts()
    return ", ".join(f"{name} {count}" for name, count in counts.items()) or "—"


def reply_metadata_table(responses: pd.DataFrame, order: Sequence[str]) -> str:
    """Per model: replies, those with reasoning, reasoning tokens (total, mean per reply that
    reports them, share of completion tokens), finish reasons and served model names."""
    head = (
        "<tr><th class='name'>Model</th><th>replies</th><th>with reasoning</th><th>reasoning tokens</th>"
        "<th>per reply</th><th>share of completion tokens</th><th class='name'>finish reasons</th>"
        "<th class='name'>served as</th></tr>"
    )
    rows = []
    for model in _models(responses, order):
        part = responses[responses["model"].astype(str) == model]
        tokens = pd.to_numeric(_column(part, "reasoning_tokens"), errors="coerce")
        completion = pd.to_numeric(_column(part, "completion_tokens"), errors="coerce")
        reported = tokens.notna()
        total = tokens[reported].sum()
        share = total / completion[reported].sum() if reported.any() and completion[reported].sum() > 0 else None
        numbers = [
            str(len(part)),
            str(int(_has_text(_column(part, "reasoning")).sum())),
            f"{int(total)}" if reported.any() else "—",
            f"{tokens[reported].mean():.1f}" if reported.any() else "—",
            "—" if share is None else f"{100 * share:.1f}%",
        ]
        rows.append(
            f"<tr><td class='name'>{escape(model)}</td>"
            + "".join(f"<td>{n}</td>" for n in numbers)
            + f"<td class='name'>{escape(_counts(_column(part, 'finish_reason')))}</td>"
            + f"<td class='name'>{escape(_counts(_column(part, 'served_model')))}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _reply_cell(row: dict[str, Any]) -> str:
    answer = row.get("raw")
    text = (
        f"<pre>{escape(_clip(answer))}</pre>"
        if isinstance(answer, str) and answer
        else "<span class='note'>(no text)</span>"
    )
    reasoning = row.get("reasoning")
    if isinstance(reasoning, str) and reasoning.strip():
        tokens = row.get("reasoning_tokens")
        label = "reasoning" if tokens is None or is_nan(tokens) else f"reasoning ({int(tokens)} tokens)"
        text += f"<details><summary>{escape(label)}</summary><pre>{escape(_clip(reasoning))}</pre></details>"
    return text


def response_sample_html(responses: pd.DataFrame, order: Sequence[str], per_model: int = SAMPLE_PER_MODEL) -> str:
    """Up to ``per_model`` replies per model (those with reasoning first, then by item), the
    reasoning of each folded away until opened."""
    head = (
        "<tr><th class='name'>Model</th><th class='name'>Item</th><th class='name'>Decision</th>"
        "<th class='name'>Finish</th><th class='name'>Reply</th></tr>"
    )
    rows = []
    for model in _models(responses, order):
        part = responses[responses["model"].astype(str) == model].assign(
            _reasoned=lambda f: ~_has_text(_column(f, "reasoning"))
        )
        for row in part.sort_values(["_reasoned", "item_id"]).head(per_model).to_dict("records"):
            decision = row.get("decision") if not is_nan(row.get("decision")) else f"error: {row.get('error')}"
            finish = row.get("finish_reason")
            rows.append(
                f"<tr><td class='name'>{escape(model)}</td><td class='name'>{escape(row['item_id'])}</td>"
                f"<td class='name'>{escape(decision)}</td><td class='name'>{'—' if is_nan(finish) else escape(finish)}</td>"
                f"<td class='name'>{_reply_cell(row)}</td></tr>"
            )
    return f"<table>{head}{''.join(rows)}</table>"


def responses_section(responses: pd.DataFrame | None, order: Sequence[str]) -> str | None:
    """The section: the per-model table, then the sample; None when the run kept no replies."""
    if responses is None or responses.empty or "model" not in responses.columns:
        return None
    body = (
        "<p>The targets' replies as the providers returned them: reasoning is kept apart from the answer "
        "(only the answer is scored), with the reasoning tokens the provider reported (— where it reported "
        "none, e.g. reasoning written inline in &lt;think&gt; tags).</p>"
        + reply_metadata_table(responses, order)
        + f"<h3>Sample replies</h3><p class='note'>Up to {SAMPLE_PER_MODEL} per model; open "
        "“reasoning” to read a reply's reasoning.</p>" + response_sample_html(responses, order)
    )
    return section("Replies and reasoning", body)
