"""A model's ``max_concurrency``, ``rpm``, ``tpm`` and 429 pause, counted in Redis by every process that calls it.

Server mode runs many flow runs at once, each in its own process, on several workers (and
``runner: dask`` adds worker processes): limits counted per process let N processes send N times
what the config allows. Where a config's limits are shared (``limits:``,
``tasks/core/limits_config.py``) every gateway counts them here, in the Redis server that
already holds the cluster's call cache.

**Why Redis, and not Prefect's global concurrency limits.** Prefect's limits are the engine's
own tool, but taking a slot is an HTTP round trip to the Prefect server (and its database) per
call, waiting is polling that server, and the model layer must not import Prefect (the layers
rule; the gateway also runs with no Prefect API at all, in the inspect_ai integration and the
benchmarks). Redis answers in microseconds, a Lua script (``limit_scripts``) changes a model's
counts atomically, its server clock is one clock for every machine, and its pub/sub wakes a
waiting process the moment a slot comes free.

**Slots.** A model's slots are a queue in Redis: a sorted set of tokens in the order they first
asked (by Redis's clock) beside a sorted set of lease ends; both are empty, so gone, when the
model is idle. A token whose rank is below the limit holds a slot; the others wait their turn
(first come, first served across processes). Every lease expires ``lease_s`` after it was last
renewed; a living gateway renews its own every ``lease_s`` / 3, so a killed process frees its
slots within ``lease_s``. Redis out of reach is a failed attempt of the call (retried with
backoff like any), never a request sent unlimited.

**No round trip per call in one run.** A gateway keeps the slots it was granted and hands a
finished call's slot straight to its next waiting call, without asking Redis, as long as nobody
else waits for the model (one run alone pays nothing per call: the throughput benchmarks of
README's Measured figures stay where they were). When another process queues (it publishes
``waiting``, and every script's answer says how many tokens are queued), each finished call's
slot goes back to Redis and the next call queues behind the others: the processes share the
model in turn. A slot no call needs is given back after ``IDLE_S``.

**Pacing.** For a model that sets ``rpm`` or ``tpm``, a request asks Redis before it starts: it
is admitted when its turn has come (starts at least 60/``rpm`` apart, by Redis's clock; else it
sleeps until then and asks again, so requests that wake late never bunch up) and takes its
tokens from a bucket of ``tpm`` a minute (overdrawn: it waits the debt off). One request per
process asks at a time, and the askers wait in one line in Redis in the order they first asked:
the turns go round the processes, so a run that started later is not starved by one whose many
requests would otherwise win each turn's race. A 429's pause is
written to Redis and published, so every process pauses the model, and a process that starts
later reads it with its first slot.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Coroutine
from typing import Any

from refusalbench.tasks.core.config import CONFIG_CHECKS, ModelConfig, RunConfig
from refusalbench.tasks.llm import limit_scripts as scripts
from refusalbench.tasks.llm.endpoints import endpoint_identity
from refusalbench.tasks.llm.rate_limits import ModelLimiter, Slot
from refusalbench.tasks.llm.transport import CallFailed

log = logging.getLogger("refusalbench.shared_limits")

PREFIX = "refusalbench:limits:"
IDLE_S = 0.25  # a granted slot no call needs is given back after this long
POLL_S = 0.5  # a waiting process asks again at least this often (a lost message, a dead holder's lease)
TURN_GRACE_S = 5.0  # an asker's place in a paced model's line lapses this long after it should have asked


def limits_ident(cfg: ModelConfig) -> str:
    """What names a model's shared counts: its model string and the deployment it reaches
    (``endpoints``), never its registry name, so two configs that call one model share them."""
    blob = json.dumps({"model": cfg.model, **endpoint_identity(cfg)}, sort_keys=True)
    return f"{cfg.model}|{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@CONFIG_CHECKS.register("limits.backend")
def check_limits_backend(config: RunConfig) -> tuple[str, str] | None:
    """``limits.backend: redis`` needs a Redis URL: ``limits.url`` or ``cache.url``."""
    if config.limits.backend == "redis" and not (config.limits.url or config.cache.url):
        return "limits.backend", "limits.backend redis needs limits.url or cache.url (redis://host:port/db)"
    return None


class SharedModelLimits:
    """One model's limits as one gateway takes part in them: the slots it holds (``free`` or
    ``busy``), the tokens it has queued (``pending``) and the calls waiting for a slot."""

    def __init__(self, store: RedisLimits, cfg: ModelConfig):
        self.store = store
        self.limit = cfg.max_concurrency
        self.interval = 60.0 / cfg.rpm if cfg.rpm else 0.0
        self.tpm = cfg.tpm or 0
        self.channel = f"{PREFIX}{{{limits_ident(cfg)}}}"  # {...}: one hash slot on a Redis Cluster
        self.keys = [f"{self.channel}:{part}" for part in ("order", "lease", "pace", "turns", "turn-lease")]
        self.local = ModelLimiter()  # the pause only: rpm and tpm are paced in Redis
        self.free: list[str] = []
        self.busy: set[str] = set()
        self.pending: list[str] = []  # oldest first
        self.waiters: deque[asyncio.Future[str]] = deque()  # each given a token
        self.contended = False  # someone else waits: finished calls give their slots back
        self._serial = itertools.count()
        self._idle: asyncio.TimerHandle | None = None
        self._rechecking = self._recheck_again = False
        self._asking: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.in_line = False  # this gateway has a place in the paced model's line of askers

    # ------------------------------------------------------------ what the gateway uses

    def slot(self, tokens: int = 0) -> Slot:
        return Slot(self, tokens)

    def pause(self, seconds: float) -> None:
        """Pause the model here at once, and in every process through Redis."""
        self.local.pause(seconds)
        self.store.spawn(self.store.pause(self, seconds))

    @property
    def paused_for(self) -> float:
        return self.local.paused_for

    async def acquire(self, tokens: int = 0) -> str:
        """A slot's token, once the model's pace and any pause allow the request to start. Redis out
        of reach is a failed attempt (retried with backoff like any), never a call sent unlimited."""
        try:
            await self.store.ready()
        except Exception as exc:  # redis.RedisError, OSError, a timeout
            raise CallFailed(f"shared limits at {self.store.url}: {exc}", retriable=True) from exc
        token = await self._take()
        try:
            if self.interval or (self.tpm and tokens):
                async with self._asker():
                    await self._paced(tokens)
            await self.local.wait()
        except BaseException:
            self.release(token)
            raise
        return token

    async def _paced(self, tokens: int) -> None:
        while True:
            try:
                admitted, wait, paused = await self.store.pace(self, tokens)
            except Exception as exc:
                raise CallFailed(f"shared limits at {self.store.url}: {exc}", retriable=True) from exc
            self.local.pause(paused)
            self.in_line = not admitted
            if wait > 0:
                await asyncio.sleep(wait)
            if admitted:
                return

    def _asker(self) -> asyncio.Lock:
        """One request of this process asks Redis for a start at a time: the line of askers then
        holds one place per process, so the processes that share a model take turns. The lock is
        made on the running loop (a gateway may outlive one loop)."""
        loop = asyncio.get_running_loop()
        if self._asking is None or self._asking[0] is not loop:
            self._asking = (loop, asyncio.Lock())
        return self._asking[1]

    def release(self, token: str) -> None:
        if token not in self.busy:
            return  # its lease ran out while this process stalled: the slot is no longer ours
        self.busy.discard(token)
        if self.contended:
            self._give_back([token])
            self._ask()
        else:
            self._hand_over(token)

    # ------------------------------------------------------------ slots

    async def _take(self) -> str:
        if self.free and not self.contended:
            token = self.free.pop()
            self.busy.add(token)
            return token
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self._ask()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())
            elif waiter in self.waiters:
                self.waiters.remove(waiter)
            raise

    def _hand_over(self, token: str) -> None:
        """A held slot to the oldest waiting call, else kept free for a moment."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.busy.add(token)
                waiter.set_result(token)
                return
        self.free.append(token)
        if self.contended:  # another process waits for it
            self._give_back(self.free)
        elif self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(IDLE_S, self._give_back_idle)

    def _give_back_idle(self) -> None:
        self._idle = None
        self._give_back(self.free)

    def _give_back(self, tokens: list[str]) -> None:
        tokens = list(tokens)
        for token in tokens:
            if token in self.free:
                self.free.remove(token)
        if tokens:
            self.store.spawn(self._released(tokens))

    async def _released(self, tokens: list[str]) -> None:
        self._observe(await self.store.release(self, tokens))

    def _ask(self) -> None:
        """Queue as many new tokens in Redis as the waiting calls need, within the limit."""
        room = self.limit - len(self.free) - len(self.busy) - len(self.pending)
        if room <= 0:  # every slot the limit allows is held or asked for (the usual case: checked first)
            return
        new = max(min(len(self.waiters) - len(self.pending), room), 0)
        for _ in range(new):
            self.pending.append(f"{self.store.owner}:{next(self._serial)}")
        if new:
            self.store.spawn(self.recheck())

    async def recheck(self) -> None:
        """Queue or re-ask for every pending token in one script; a granted one goes to a waiting call."""
        if self._rechecking:
            self._recheck_again = True
            return
        self._rechecking = True
        try:
            while self.pending:
                self._recheck_again = False
                queued, paused, granted = await self.store.acquire(self, list(self.pending))
                self.local.pause(paused)
                for token in granted:
                    if token in self.pending:
                        self.pending.remove(token)
                        self._hand_over(token)
                self._observe(queued)
                if not self._recheck_again:
                    break
        finally:
            self._rechecking = False

    async def renew(self) -> None:
        """Extend the leases of the slots held; drop any that ran out (this process stalled past its lease)."""
        held = self.free + list(self.busy)
        if not held:
            return
        queued, missing = await self.store.renew(self, held)
        for token in missing:
            if token in self.free:
                self.free.remove(token)
            self.busy.discard(token)
        if missing:
            log.warning("%s: %d slot lease(s) ran out before they were renewed", self.channel, len(missing))
            self._ask()
        self._observe(queued)

    def _observe(self, queued: int) -> None:
        """More tokens queued than the limit: another process waits for the model."""
        if queued > self.limit:
            self.on_waiting()
        else:
            self.contended = False

    def on_waiting(self) -> None:
        if not self.contended:
            self.contended = True
            self._give_back(self.free)

    def tokens(self) -> list[str]:
        return self.free + list(self.busy) + self.pending


class RedisLimits:
    """One gateway's part in the shared limits: a client and the scripts, one subscriber for every
    model's events (``released``, ``waiting``, ``pause:<s>``), and a task that renews the gateway's
    leases and asks again for its waiting slots."""

    def __init__(self, url: str, lease_s: float = 30.0):
        self.url = url
        self.lease_s = lease_s
        self.owner = uuid.uuid4().hex[:16]  # names this gateway's tokens
        self.models: dict[str, SharedModelLimits] = {}
        self._by_channel: dict[bytes, list[SharedModelLimits]] = {}
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._starting: asyncio.Future[None] | None = None
        self._ready = self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()

    def for_model(self, name: str, cfg: ModelConfig) -> SharedModelLimits:
        limits = self.models.get(name)
        if limits is None:
            limits = self.models[name] = SharedModelLimits(self, cfg)
            self._by_channel.setdefault(limits.channel.encode(), []).append(limits)
        return limits

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background; a failure is logged (the next poll asks again)."""
        if self._closing:  # the gateway's loop is stopping: close() gives every token back
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("shared limits at %s: %s", self.url, task.exception())

    # ------------------------------------------------------------ connection

    async def ready(self) -> None:
        """Connected and subscribed (the first call of the gateway connects)."""
        if self._ready:
            return
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_future()
            try:
                await self._start()
            except BaseException as exc:
                self._starting.set_exception(exc)
                self._starting.exception()  # retrieved: the caller sees it raised
                self._starting = None
                raise
            self._starting.set_result(None)
            self._ready = True
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        import redis.asyncio as aioredis  # only where limits are shared

        self._client = aioredis.Redis.from_url(self.url)
        for name in ("acquire", "release", "renew", "pace", "pause"):
            self._scripts[name] = self._client.register_script(getattr(scripts, name.upper()))
        await self._client.ping()
        subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for job in (self._listen(subscribed), self._upkeep()):
            task = asyncio.get_running_loop().create_task(job)
            self._tasks.add(task)
        await asyncio.wait_for(subscribed, 10)

    async def _listen(self, subscribed: asyncio.Future[None]) -> None:
        """Events of every model, as they are published; after a lost connection, subscribe again."""
        failures = 0
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(PREFIX + "*")
                if not subscribed.done():
                    subscribed.set_result(None)
                failures = 0
                async for message in pubsub.listen():
                    self._dispatch(message["channel"], message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection dropped: the poll covers the gap
                failures += 1  # said once per outage, not on every try
                (log.warning if failures == 1 else log.debug)(
                    "shared limits at %s: subscriber lost (%s); subscribing again", self.url, exc
                )
                await asyncio.sleep(POLL_S)
            finally:
                await pubsub.aclose()

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        for limits in self._by_channel.get(channel, ()):
            if data == b"released":
                if limits.pending:
                    self.spawn(limits.recheck())
            elif data == b"waiting":
                limits.on_waiting()
            elif data.startswith(b"pause:"):
                limits.local.pause(float(data[6:]))

    async def _upkeep(self) -> None:
        """Ask again for waiting slots every poll; renew held leases every ``lease_s`` / 3."""
        poll = min(POLL_S, self.lease_s / 4)
        renewed, failures = time.monotonic(), 0
        while True:
            await asyncio.sleep(poll)
            try:
                for limits in list(self.models.values()):
                    if limits.pending:
                        await limits.recheck()
                if time.monotonic() - renewed >= self.lease_s / 3:
                    renewed = time.monotonic()
                    for limits in list(self.models.values()):
                        await limits.renew()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away for a moment: the next round tries again (said once)
                failures += 1
                (log.warning if failures == 1 else log.debug)("shared limits at %s: %s", self.url, exc)

    async def close(self) -> None:
        """Give back every slot and queued token (a clean exit frees them at once, not after the lease)."""
        if self._client is None:
            return
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for limits in self.models.values():
            tokens = limits.tokens()
            try:
                if limits.in_line:  # its place in the line of askers (else it lapses after the grace)
                    for key in limits.keys[3:]:
                        await self._client.zrem(key, self.owner)
                if tokens:
                    await self.release(limits, tokens)
            except Exception as exc:
                log.warning("shared limits at %s: slots not given back (%s); they expire", self.url, exc)
        await self._client.aclose()
        self._client, self._starting, self._ready, self._closing = None, None, False, False

    # ------------------------------------------------------------ scripts

    async def acquire(self, limits: SharedModelLimits, tokens: list[str]) -> tuple[int, float, list[str]]:
        queued, paused, granted = await self._scripts["acquire"](
            keys=limits.keys, args=[limits.limit, self.lease_s, limits.channel, *tokens]
        )
        return int(queued), float(paused), [token.decode() for token in granted]

    async def release(self, limits: SharedModelLimits, tokens: list[str]) -> int:
        return int(await self._scripts["release"](keys=limits.keys[:2], args=[limits.channel, *tokens]))

    async def renew(self, limits: SharedModelLimits, tokens: list[str]) -> tuple[int, list[str]]:
        queued, missing = await self._scripts["renew"](keys=limits.keys[:2], args=[self.lease_s, *tokens])
        return int(queued), [token.decode() for token in missing]

    async def pace(self, limits: SharedModelLimits, tokens: int) -> tuple[bool, float, float]:
        admitted, wait, paused = await self._scripts["pace"](
            keys=limits.keys[2:], args=[limits.interval, limits.tpm, tokens, self.owner, TURN_GRACE_S]
        )
        return bool(admitted), float(wait), float(paused)

    async def pause(self, limits: SharedModelLimits, seconds: float) -> None:
        await self.ready()
        await self._scripts["pause"](keys=limits.keys[2:3], args=[seconds, limits.channel])
