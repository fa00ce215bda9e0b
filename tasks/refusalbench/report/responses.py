"""Report section on the targets' replies themselves (``responses.parquet``).

- :func:`reply_metadata_table`: per model, how many replies carried reasoning, the reasoning
  tokens the providers reported, how the replies finished and which model served them.
- :func:`response_sample_html`: a few replies per model, each beside its question and what was
  expected (the gold answer or the refusal code), with the judged decision and its outcome; the
  reply wrapped to the page's width, its reasoning behind a ``<details>`` element.

A run folder written before replies carried their metadata has none of these columns: the
section then shows what there is (the sample without reasoning) or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.html_page import escape, is_nan, section
from refusalbench.tasks.refusalbench.decisions import ANSWER
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

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
    # Grouped once, on the columns the table reads: filtering the whole frame per model (30 targets x
    # 180 replies, every text column along) cost more than the table.
    columns = ("reasoning_tokens", "completion_tokens", "reasoning", "finish_reason", "served_model")
    slim = responses[[c for c in columns if c in responses.columns]]
    by_model = dict(tuple(slim.groupby(responses["model"].astype(str).to_numpy(), sort=False)))
    for model in _models(responses, order):
        part = by_model[model]
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
        f"<pre class='wrap'>{escape(_clip(answer))}</pre>"
        if isinstance(answer, str) and answer
        else "<span class='note'>(no text)</span>"
    )
    reasoning = row.get("reasoning")
    if isinstance(reasoning, str) and reasoning.strip():
        tokens = row.get("reasoning_tokens")
        label = "reasoning" if tokens is None or is_nan(tokens) else f"reasoning ({int(tokens)} tokens)"
        text += (
            f"<details><summary>{escape(label)}</summary><pre class='wrap'>{escape(_clip(reasoning))}</pre></details>"
        )
    return text


def sampled_rows(responses: pd.DataFrame, per_model: int = SAMPLE_PER_MODEL) -> pd.DataFrame:
    """The replies the sample shows: up to ``per_model`` per model, those with reasoning first, then by item."""
    # Chosen on the three columns that decide, then only the chosen rows taken whole: filtering every
    # column of every model's rows (30 targets x 180 replies) cost more than the rest of the sample.
    keys = pd.DataFrame(
        {
            "model": responses["model"].astype(str).to_numpy(),
            "_reasoned": (~_has_text(_column(responses, "reasoning"))).to_numpy(),
            "item_id": responses["item_id"].to_numpy(),
        }
    )
    chosen: list[int] = []
    for model in _models(responses, ()):
        chosen.extend(keys[keys["model"] == model].sort_values(["_reasoned", "item_id"]).head(per_model).index)
    return responses.iloc[chosen].assign(_reasoned=keys["_reasoned"].to_numpy()[chosen])  # taken once


def reply_outcome(row: dict[str, Any]) -> str:
    """What became of a judged reply: correct or wrong answer, correct, wrong-category, false or missed
    refusal; or why it was not scored."""
    outcome = row.get("outcome")
    if isinstance(outcome, str) and outcome != "ok":
        return f"not scored ({outcome.replace('_', ' ')})"
    decision, expected = row.get("judged_decision"), row.get("expected")
    if not isinstance(decision, str) or not isinstance(expected, str):
        return "—"
    if expected == ANSWER_CORRECTLY:
        if decision != ANSWER:
            return "false refusal"
        correct = row.get("answer_correct")
        return "—" if correct is None or is_nan(correct) else ("correct answer" if correct else "wrong answer")
    if decision == ANSWER:
        return "missed refusal"
    return "correct refusal" if decision == expected else "wrong-category refusal"


def _expected_cell(row: dict[str, Any]) -> str:
    expected = row.get("expected")
    if not isinstance(expected, str):
        return "—"
    if expected != ANSWER_CORRECTLY:
        return f"refusal: <code>{escape(expected)}</code>"
    answers = row.get("answers")
    # Parquet gives a list column back as an array; a missing item (no benchmark row) as NaN.
    listed = [str(a) for a in answers] if isinstance(answers, (list, tuple, np.ndarray)) else []
    return "answer: " + (escape(" | ".join(listed)) if listed else "<span class='note'>(not recorded)</span>")


def _with_items(rows: pd.DataFrame, judged: pd.DataFrame | None, items: pd.DataFrame | None) -> pd.DataFrame:
    """The sampled replies with their item's question and answers and their judged row's verdict."""
    if items is not None and not items.empty:
        wanted = [c for c in ("item_id", "question", "answers", "expected") if c in items.columns]
        rows = rows.merge(items[wanted].drop_duplicates("item_id"), on="item_id", how="left")
    if judged is not None and not judged.empty:
        verdict = judged[
            [c for c in ("model", "item_id", "expected", "decision", "answer_correct", "outcome") if c in judged]
        ]
        verdict = verdict.rename(columns={"decision": "judged_decision", "outcome": "judged_outcome"})
        rows = rows.drop(columns=[c for c in ("expected",) if c in rows.columns and "expected" in verdict]).merge(
            verdict.astype({"model": str, "item_id": str}), on=["model", "item_id"], how="left"
        )
        rows["outcome"] = rows["judged_outcome"].where(rows["judged_outcome"].notna(), _column(rows, "outcome"))
    return rows


def response_sample_html(
    responses: pd.DataFrame,
    order: Sequence[str],
    per_model: int = SAMPLE_PER_MODEL,
    judged: pd.DataFrame | None = None,
    items: pd.DataFrame | None = None,
) -> str:
    """Up to ``per_model`` replies per model (those with reasoning first, then by item): the question
    (``items``: the benchmark's), what was expected, the reply wrapped, the decision and the outcome
    (``judged``); the reasoning of each folded away until opened."""
    head = (
        "<tr><th class='name'>Model</th><th class='name'>Question</th><th class='name'>Expected</th>"
        "<th class='name'>Reply</th><th class='name'>Decision</th><th class='name'>Outcome</th></tr>"
    )
    rows = []
    sample = _with_items(sampled_rows(responses, per_model).astype({"model": str, "item_id": str}), judged, items)
    for model in _models(sample, order):
        for row in sample[sample["model"] == model].to_dict("records"):
            decision = row.get("judged_decision")
            if not isinstance(decision, str):
                decision = row.get("decision") if not is_nan(row.get("decision")) else f"error: {row.get('error')}"
            finish = row.get("finish_reason")
            question = row.get("question")
            question_html = (
                escape(_clip(question))
                if isinstance(question, str)
                else f"<span class='note'>item {escape(row['item_id'])}</span>"
            )
            finished = "" if is_nan(finish) else f"<br><span class='ci'>finish: {escape(finish)}</span>"
            rows.append(
                f"<tr><td class='name'>{escape(model)}</td><td class='name wrap' title='item {escape(row['item_id'])}'>"
                f"{question_html}</td><td class='name wrap'>{_expected_cell(row)}</td>"
                f"<td class='name wrap'>{_reply_cell(row)}</td><td class='name'>{escape(decision)}{finished}</td>"
                f"<td class='name'>{escape(reply_outcome(row))}</td></tr>"
            )
    return f"<table>{head}{''.join(rows)}</table>"


def responses_section(
    responses: pd.DataFrame | None,
    order: Sequence[str],
    judged: pd.DataFrame | None = None,
    items: pd.DataFrame | None = None,
) -> str | None:
    """The section: the per-model table, then the sample; None when the run kept no replies."""
    if responses is None or responses.empty or "model" not in responses.columns:
        return None
    body = (
        "<p>The targets' replies as the providers returned them: reasoning is kept apart from the answer "
        "(only the answer is scored), with the reasoning tokens the provider reported (— where it reported "
        "none, e.g. reasoning written inline in &lt;think&gt; tags).</p>"
        + reply_metadata_table(responses, order)
        + f"<h3>Sample replies</h3><p class='note'>Up to {SAMPLE_PER_MODEL} per model; open "
        "“reasoning” to read a reply's reasoning; hover a question for its item id.</p>"
        + response_sample_html(responses, order, judged=judged, items=items)
    )
    return section("Replies and reasoning", body)
