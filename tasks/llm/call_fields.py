"""What a model call came to besides its text, declared once for every row that holds a reply.

``CallResult`` and the records that keep a call's reply (a generation candidate, a verification,
a target's response, an experiment's output, an evaluation) inherit these fields instead of each
declaring its own copy, so a field's type and meaning cannot drift between tables. Each record takes
the smallest group that fits:

- ``ReplyFields``: a reply's metadata (why it stopped, its reasoning, who served it) and whether the
  call cache served it; every row holding a reply has these.
- ``CallFields``: adds what the call billed, for rows that are one call each.
- ``TimedCallFields``: adds how long the call took, for rows whose callers time it.

A field only one of them has stays in that class (``CallResult.cached_tokens``, ``CallResult.batch``).
The judge's metadata in a judgment row is prefixed (``judge_...``), so it is not one of these groups.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from refusalbench.tasks.core.tables import FieldGroup

# The reply's metadata every table holding a reply carries, under these names (CallResult.metadata).
REPLY_METADATA: tuple[str, ...] = (
    "finish_reason",
    "reasoning",
    "reasoning_tokens",
    "served_model",
    "system_fingerprint",
)
# What a call billed, under these names, in the tables whose rows are calls (CallResult.billing).
REPLY_BILLING: tuple[str, ...] = ("cached", "prompt_tokens", "completion_tokens", "cost_usd")
# Where these fields sit in a table: after the record's own columns, in this order (the order the
# tables had when each record declared them itself). A group lacking some of them skips those.
CALL_COLUMNS: tuple[str, ...] = (
    "cached",
    "latency_s",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    *REPLY_METADATA,
)


class ReplyFields(FieldGroup):
    """A reply's metadata: why it stopped, its reasoning (split off the answer text), who served it,
    and whether the call cache served it."""

    TRAILING_COLUMNS: ClassVar[tuple[str, ...]] = CALL_COLUMNS

    cached: bool = False
    finish_reason: str | None = Field(
        default=None, description="the reply's finish reason (stop, length, content_filter, ...)"
    )
    reasoning: str | None = Field(default=None, description="the reply's reasoning, kept apart from its answer")
    reasoning_tokens: int | None = Field(
        default=None, description="completion tokens spent on reasoning, as the provider reports"
    )
    served_model: str | None = Field(default=None, description="the model name the provider says answered")
    system_fingerprint: str | None = None


class CallFields(ReplyFields):
    """A reply's metadata and what its call billed: the run's costs add up over these."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = Field(
        default=None, description="what the call billed, a re-asked reply included; None: unpriced"
    )


class TimedCallFields(CallFields):
    """A call's metadata and billing, and how long it took."""

    latency_s: float | None = None
