"""The gateway's private event loop: one daemon thread per gateway on which every call's coroutine runs,
and the hand-off of a batch's results from it to the thread that asked for them."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from refusalbench.tasks.core.config import ModelConfig

T = TypeVar("T")


class LoopThread:
    """A private event loop on a daemon thread; all gateway coroutines run here."""

    def __init__(self) -> None:
        self.cleanups: list[Callable[[], Any]] = []  # coroutine functions run before the loop stops
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="refusalbench-gateway", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Cancel background tasks (LiteLLM's logging worker) and stop the loop, quietly."""
        if not self.loop.is_running():
            return

        async def cancel_all() -> None:
            for cleanup in self.cleanups:
                await cleanup()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=5)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


_EMPTY = object()

# Calls a batch starts at once (:meth:`Handoff.fill`): a model's usual ``max_concurrency`` and then some, so
# its first wave fills its slots while the rest of its batch waits its turn on the loop.
WAVE = 32


def wave_for(models: Mapping[str, ModelConfig], specs: Sequence[Any]) -> int:
    """The wave of a batch of calls (``specs`` naming their ``model``): ``WAVE``, or the largest
    ``max_concurrency`` of its models where that is more, so that its first wave fills every slot."""
    return max([WAVE, *(models[spec.model].max_concurrency for spec in specs if spec.model in models)])


class Handoff:
    """The results of one batch of calls, from the loop to the thread that asked, in input order.

    One submission per batch (:meth:`fill`) instead of one per call: submitting a coroutine across
    threads costs a future, a lock and a wake-up of the loop each time. The asking thread is woken
    only when the result it waits for next arrives, and then takes every one ready after it.
    """

    def __init__(self, size: int, wave: int = WAVE):
        self._slots: list[Any] = [_EMPTY] * size
        self._ready = threading.Condition()
        self._wanted = -1
        self._wave = wave

    async def fill(
        self,
        calls: Sequence[tuple[int, Callable[[Any], Awaitable[Any]], Any]],
        before: Callable[[list[Any]], None] | None = None,
    ) -> None:
        """Run each ``(index, call, argument)`` on the loop; each result (or error) goes to its slot.

        The calls start a wave at a time, ``before(arguments)`` called ahead of each wave: the first
        at once, each next one once fewer than a wave of the calls started are unfinished. So a
        batch's calls are prepared (``before``: their cache keys and cached replies) about as fast as
        its model's slots free up, not all in the loop's first turns: when every model's batch
        arrives at once (a stage's tasks starting together, 30 batches of 180 calls), preparing
        every wave of every batch there kept the loop from the sockets of the first waves' requests.
        """
        wave, position, unfinished = self._wave, 0, 0
        started: list[asyncio.Future[None]] = []
        more = asyncio.Event()  # set when fewer than a wave of the started calls are unfinished

        async def one(index: int, call: Callable[[Any], Awaitable[Any]], argument: Any) -> None:
            nonlocal unfinished
            try:
                self._put(index, (False, await call(argument)))
            except BaseException as exc:  # the asking thread raises it when it reaches this result
                self._put(index, (True, exc))
                if not isinstance(exc, Exception):
                    raise
            finally:
                unfinished -= 1
                if unfinished < wave:
                    more.set()

        try:
            while position < len(calls):
                part = calls[position : position + wave]
                if before is not None:
                    before([argument for _, _, argument in part])
                unfinished += len(part)
                started.extend(asyncio.ensure_future(one(*call)) for call in part)
                position += len(part)
                if position < len(calls):
                    while unfinished >= wave:
                        more.clear()
                        await more.wait()  # the loop's other work (other batches, replies) goes on meanwhile
                    await asyncio.sleep(0)  # the other batches' ready work first, as when they all arrive at once
            await asyncio.gather(*started)
        except asyncio.CancelledError as cancelled:  # the loop closing: no asking thread may wait for ever
            for task in started:
                task.cancel()
            for index, _, _ in calls[position:]:
                self._put(index, (True, cancelled))
            raise

    def _put(self, index: int, slot: tuple[bool, Any]) -> None:
        with self._ready:
            self._slots[index] = slot
            if index == self._wanted:
                self._ready.notify()

    def get(self, index: int) -> Any:
        """The result at ``index``, once it is there (its error raised here)."""
        with self._ready:
            while self._slots[index] is _EMPTY:
                self._wanted = index
                self._ready.wait()
            self._wanted = -1
            (failed, value), self._slots[index] = self._slots[index], None
        if failed:
            raise concurrent.futures.CancelledError() if isinstance(value, asyncio.CancelledError) else value
        return value
