"""Calls started before their asker asks: the judge's calls, sent as each target reply comes in.

A judge task starts when its respond task has answered its whole shard (Prefect runs it then), so
without this the judge sends nothing while the targets answer and all of its calls come after the
last target reply: one round of the judge's concurrency per 16 answers to judge, after the last
response (5 rounds at 30 targets with 16-way concurrency). The respond task now starts, for each reply
the judge will be asked about, the very call the judge task will ask for (the same spec, so the same
cache key) on the gateway, and does not wait for it.

When the judge task asks for that call in the same process, it gets the result the started call
came to, as if it had sent the call itself at that moment: the counters (HTTP calls, tokens, cost)
are counted once, by the started call, for the judge's stage; the result is not a cache hit unless
the started call's was one (a re-run), so ``judge_cached`` and the manifest are what they were. A
started call nobody asks for (its judge task failed first) is in the call cache like any other.
Registered on the gateway's loop in the order the calls were started, so before any later
submission's calls look for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class CallsAhead:
    """{cache key: the task of a call started ahead}, taken once by the call that asks for it. Used on the
    gateway's event loop only."""

    def __init__(self) -> None:
        self._started: dict[str, asyncio.Task[Any]] = {}

    def start(self, key: str, answer: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start ``answer()`` for ``key`` now, unless a call for it is already started and not yet asked for."""
        if key not in self._started:
            self._started[key] = asyncio.get_running_loop().create_task(answer())

    def take(self, key: str) -> asyncio.Task[Any] | None:
        """The started call for ``key`` (then no longer held here), or None."""
        return self._started.pop(key, None)
