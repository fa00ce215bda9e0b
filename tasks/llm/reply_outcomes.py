"""What a model call came to, beyond its text: the outcome of each reply.

Real providers do not always answer. A reply can stop at the output budget (``truncated``),
be withheld by the provider's safety filter (``provider_blocked``: finish reason
``content_filter``, Anthropic's ``refusal``, OpenAI's refusal channel, or a 400 whose body says
the content was filtered), come back with nothing in it (``empty``), or not fit the model's window
(``too_long``: the gateway's own check does not send it, or the provider's 400 says so, each
provider in its own words: ``context_errors``). None of these is the model's answer
or refusal: every stage records them per row, the metrics leave them out of accuracy and count
them in ``non_response_rate``, and the gateway neither retries them at the same budget nor
serves them from the call cache as a success for a structured role.

The gateway's :class:`~refusalbench.tasks.llm.gateway.CallResult` carries the outcome as its
``error_kind`` (``outcome`` is ``ok`` when there is no error); records of every method keep it
in an ``outcome`` column.
"""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.providers import ProviderProfile

OK = "ok"
TRUNCATED = "truncated"
PROVIDER_BLOCKED = "provider_blocked"
EMPTY = "empty"
TOO_LONG = "too_long"
CALL_ERROR = "call_error"
PARSE_ERROR = "parse_error"
# A judged row whose judging failed (the target's reply was fine).
JUDGE_ERROR = "judge_error"

# The model gave no usable response: excluded from accuracy, counted in non_response_rate.
NON_RESPONSES: tuple[str, ...] = (TRUNCATED, PROVIDER_BLOCKED, TOO_LONG, EMPTY)
# The call or the judging failed: excluded from accuracy, counted in failed_rate.
FAILURES: tuple[str, ...] = (CALL_ERROR, PARSE_ERROR, JUDGE_ERROR)
# Every outcome a row can have, in the order tables show them.
ROW_OUTCOMES: tuple[str, ...] = (OK, *NON_RESPONSES, *FAILURES)

# Finish reasons (as LiteLLM normalises them; the direct path reads the same words) -> outcome.
# Anthropic's ``max_tokens`` and ``refusal`` arrive as ``length`` and ``content_filter``; the
# raw spellings are listed for replies that did not pass through LiteLLM's mapping.
_FINISH_OUTCOMES: dict[str, str] = {
    "length": TRUNCATED,
    "max_tokens": TRUNCATED,
    "content_filter": PROVIDER_BLOCKED,
    "refusal": PROVIDER_BLOCKED,
}

# What each outcome means, in the words of errors, tables and the README.
DESCRIPTIONS: dict[str, str] = {
    OK: "a usable reply",
    TRUNCATED: "the reply stopped at the output token limit",
    PROVIDER_BLOCKED: "the provider's safety filter blocked the reply or the prompt",
    EMPTY: "the reply had no content",
    TOO_LONG: "the prompt does not fit the model's context window",
    CALL_ERROR: "the call failed",
    PARSE_ERROR: "the reply did not parse as the structured output asked for",
    JUDGE_ERROR: "the judge's call or reply failed",
}


def reply_outcome(text: Any, finish_reason: str | None, refusal: str | None = None) -> str:
    """The outcome of one reply: its finish reason first (a truncated or filtered reply may
    still carry text), then the refusal channel, then whether any content came back."""
    by_finish = _FINISH_OUTCOMES.get(str(finish_reason or "").lower())
    if by_finish is not None:
        return by_finish
    if refusal and str(refusal).strip():
        return PROVIDER_BLOCKED
    if text is None or not str(text).strip():
        return EMPTY
    return OK


def outcome_error(outcome: str, finish_reason: str | None = None, refusal: str | None = None, attempts: int = 1) -> str:
    """The one-line error of a reply that was not usable, naming its cause."""
    detail = DESCRIPTIONS.get(outcome, outcome)
    if finish_reason:
        detail += f" (finish_reason {finish_reason})"
    if refusal and str(refusal).strip():
        detail += f": {_first_line(str(refusal))}"
    suffix = f" (after {attempts} attempts)" if attempts > 1 else ""
    return f"{outcome}: {detail}{suffix}"


def value_outcome(value: dict[str, Any]) -> str:
    """The outcome of a cached reply (the gateway's cache value; entries cached before outcomes
    were recorded: from their finish reason and text)."""
    return value.get("outcome") or reply_outcome(value.get("text"), value.get("finish_reason"), value.get("refusal"))


def final_outcome(value: dict[str, Any], answer: str | None) -> str:
    """The outcome of a reply whose final answer (reasoning split off) is ``answer``: a reply that
    was nothing but reasoning is empty."""
    outcome = value_outcome(value)
    return EMPTY if outcome == OK and not (answer or "").strip() else outcome


def cacheable(value: dict[str, Any], *, structured: bool) -> bool:
    """Whether a reply may be kept in (and served from) the call cache. An answer may; an empty
    reply may not (asked again next run); a truncated or blocked one only for a free-text call
    (a target's: the outcome is the measurement), never for a structured role, whose re-run
    must ask again instead of repeating a cut or filtered JSON as if it were a success."""
    outcome = value_outcome(value)
    return outcome == OK or (outcome != EMPTY and not structured)


def retry_params(
    value: dict[str, Any], cfg: ModelConfig, params: dict[str, Any], profile: ProviderProfile
) -> dict[str, Any] | None:
    """The call's parameters for the one more try a reply's outcome deserves, or None. An empty
    reply is asked once more as it was (often a passing glitch); a truncated one only with a
    larger budget, the model's ``retry_truncated_max_tokens``; a blocked one never (the same
    prompt is blocked again)."""
    outcome = value_outcome(value)
    if outcome == EMPTY:
        return dict(params)
    if outcome != TRUNCATED or not cfg.retry_truncated_max_tokens:
        return None
    merged = {**cfg.params, **params}
    budget = profile.max_output_tokens(merged)
    if budget is not None and budget >= cfg.retry_truncated_max_tokens:
        return None
    # The spelling the call used (OpenAI's newer models take only max_completion_tokens).
    name = "max_completion_tokens" if "max_completion_tokens" in merged and "max_tokens" not in merged else "max_tokens"
    return {**params, name: cfg.retry_truncated_max_tokens}


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else ""
