"""The inspect_ai integration's pure half: no ``inspect_ai`` import at module level.

``tasks/integrations/inspect/task.py`` (the inspect glue: task, scorer, model provider) builds on these
helpers, which reuse the evaluate path's own pieces, so a RefusalBench run inside inspect
asks, parses and judges exactly as ``refusalbench evaluate`` does:

- prompts: ``respond.target_messages`` (target templates) and ``judge.judge_messages``;
- reply -> decision/confidence: ``respond.response_from_result`` (``decisions.py``);
- judge reply -> verdict: ``structured_outputs.parse_output`` and
  ``judge.judgment_from_result`` / ``judgment_without_model``;
- the task's metrics: the metrics declared ``inspect_task=True``, computed by ``scoring``'s
  ``compute_metrics`` over the scored samples (:func:`sample_metrics`).

Each inspect Score carries the whole :class:`Judgment` (and the item's variant) in its
metadata under ``sample_metadata.SCORE_KEY``; ``logs.read_inspect_logs`` turns eval logs
back into the judged-responses frame that ``refusalbench score`` scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
from pydantic import BaseModel

from refusalbench.tasks.integrations.inspect.sample_metadata import ITEM_KEY, SCORE_KEY
from refusalbench.tasks.llm.gateway import CallResult
from refusalbench.tasks.llm.providers import PLACEHOLDER_KEY, profile_for, response_format_for
from refusalbench.tasks.llm.reply_outcomes import OK, outcome_error, reply_outcome
from refusalbench.tasks.llm.structured_outputs import json_schema_for, parse_output
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.scoring.metrics import compute_metrics
from refusalbench.tasks.refusalbench.stages.judge import (
    DecisionMode,
    judge_messages,
    judge_schema,
    judgment_from_result,
    judgment_without_model,
    needs_judge,
)
from refusalbench.tasks.refusalbench.stages.respond import response_from_result, target_messages
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY

# ----------------------------------------------------------------- the task's side


def sample_fields(item: BenchmarkItem, confidence: bool) -> dict[str, Any]:
    """An inspect Sample's fields for one benchmark item (messages as role/content dicts)."""
    return {
        "id": item.item_id,
        "messages": target_messages(item, confidence),
        "target": list(item.answers),
        "metadata": {ITEM_KEY: item.model_dump(mode="json"), "confidence": confidence},
    }


def response_of(
    item: BenchmarkItem,
    model: str,
    text: str | None,
    confidence: bool,
    error: str | None = None,
    stop_reason: str | None = None,
) -> Response:
    """The target's reply read as ``respond`` reads it. A reply that is no answer has its outcome,
    as in the gateway (``reply_outcomes``): cut at the limit (inspect's stop reason
    ``max_tokens``), blocked (``content_filter``) or empty; a sample's error is a failed call."""
    kind = None
    if error is None and (outcome := reply_outcome(text, stop_reason)) != OK:
        error, kind = outcome_error(outcome, stop_reason), outcome
    return response_from_result(
        item, model, CallResult(model=model, key="", text=text, error=error, error_kind=kind), confidence
    )


def judge_request(
    item: BenchmarkItem, response: Response, decision: DecisionMode = "judge"
) -> tuple[list[dict[str, str]], str, dict[str, Any]] | None:
    """(messages, schema name, JSON schema) when the judge model must decide, else None (no call)."""
    if not needs_judge(item, response, decision):
        return None
    schema: type[BaseModel] = judge_schema(item)
    return judge_messages(item, response), schema.__name__, json_schema_for(schema)


def judgment_of(
    item: BenchmarkItem,
    response: Response,
    judge: str | None = None,
    text: str | None = None,
    error: str | None = None,
    decision: DecisionMode = "judge",
) -> Judgment:
    """The judgment of one response: without a call where none is needed, else from the judge's reply."""
    if not needs_judge(item, response, decision):
        return judgment_without_model(item, response)
    parsed = None
    if error is None:
        parsed, problem = parse_output(judge_schema(item), text)
        if parsed is None:
            error = f"parse error: {problem}"
    result = CallResult(model=judge or "", key="", text=text, parsed=parsed, error=error)
    return judgment_from_result(item, response, judge or "", result, decision)


def is_correct(judgment: Judgment) -> bool | None:
    """Right answer to an answerable item or right code for an unanswerable one; None when left out."""
    if judgment.error is not None:
        return None
    if judgment.expected == ANSWER_CORRECTLY:
        return judgment.decision == "ANSWER" and bool(judgment.answer_correct)
    return bool(judgment.refusal_correct)


def score_fields(item: BenchmarkItem, response: Response, judgment: Judgment) -> dict[str, Any]:
    """An inspect Score's fields: C/I (N when left out of the metrics) and everything the metrics need."""
    correct = is_correct(judgment)
    value = "N" if correct is None else ("C" if correct else "I")
    verdict = judgment.error or (
        f"judge quality {judgment.quality}"
        if judgment.quality is not None
        else f"judge RAF {judgment.raf}"
        if judgment.raf is not None
        else "no judge call"
    )
    return {
        "value": value,
        "answer": judgment.decision,
        "explanation": f"expected {item.expected}, decision {judgment.decision} (by the "
        f"{judgment.decision_source or 'parser'}); {verdict}",
        "metadata": {
            SCORE_KEY: {
                "judgment": judgment.model_dump(mode="json"),
                "variant": item.variant,
                "response_error": response.error,
            }
        },
    }


SAMPLES = "samples"  # the one "model" the scored samples of a metric are grouped under


def sample_metrics(payloads: Iterable[dict[str, Any] | None], names: Sequence[str]) -> dict[str, float]:
    """The declared metrics ``names`` over scored samples, computed as ``refusalbench score``
    computes them; failed judgments (and samples without a score) are left out, NaN where undefined."""
    judged = [(Judgment.model_validate(p["judgment"]), p.get("variant")) for p in payloads if p]
    rows = [{**j.model_dump(), "model": SAMPLES, "variant": variant} for j, variant in judged if j.error is None]
    if not rows:
        return {name: math.nan for name in names}
    values = compute_metrics(pd.DataFrame(rows), names)[SAMPLES]
    return {name: values[name] for name in names}


# ----------------------------------------------------------------- the model provider's side

# inspect GenerateConfig field -> LiteLLM keyword, for the settings passed through as they are.
_PASSED = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "stop_seqs": "stop",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "logit_bias": "logit_bias",
    "extra_headers": "extra_headers",
    "extra_body": "extra_body",
}
_STOP_REASONS = {
    "stop": "stop",
    "length": "max_tokens",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


def litellm_kwargs(model: str, settings: dict[str, Any], base_url: str | None, api_key: str | None) -> dict[str, Any]:
    """LiteLLM keywords for one call to ``model`` (a LiteLLM model string) from inspect's generate
    settings (``GenerateConfig`` as a dict), shaped by the model's provider profile as the gateway
    shapes its calls: parameter rewrites, the profile's ``response_format`` for a response schema,
    the placeholder key for a server without auth.
    """
    profile = profile_for(model, base_url)
    kwargs = profile.rewrite_params(
        {key: settings[name] for name, key in _PASSED.items() if settings.get(name) is not None}
    )
    schema = settings.get("response_schema")
    if schema:
        response_format = response_format_for(
            profile.structured_output, schema["name"], schema["json_schema"], strict=bool(schema.get("strict"))
        )
        if response_format is not None:
            kwargs["response_format"] = response_format
    if base_url:
        kwargs["api_base"] = base_url
    key = api_key or (PLACEHOLDER_KEY if profile.keyless(base_url) else None)
    if key:
        kwargs["api_key"] = key
    return kwargs


def stop_reason(finish_reason: str | None) -> str:
    return _STOP_REASONS.get(finish_reason or "", "unknown")
