"""The gateway's private event loop: one daemon thread per gateway on which every call's coroutine runs."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from typing import Any, Callable


class LoopThread:
    """A private event loop on a daemon thread; all gateway coroutines run here."""

    def __init__(self) -> None:
        self.cleanups: list[Callable[[], Any]] = []  # coroutine functions run before the loop stops
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="refusalbench-gateway", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def submit(self, coro) -> concurrent.futures.Future:
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
