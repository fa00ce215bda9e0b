"""A batch's cached replies read in one query (``get_many``, ``WriteBehind.read_ahead``): the same
replies as reading them one by one, the same scope rules (ttl, migration), and no call on a re-run."""

from __future__ import annotations

import time
from typing import Any

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.cache_scope import CacheScope
from refusalbench.tasks.llm.callcache import NullCache, SQLiteCache, get_many
from refusalbench.tasks.llm.gateway import CallSpec, Gateway, request_key


class CountingCache:
    """A SQLite cache that counts its reads: ``get`` per key, ``get_many`` per batch."""

    def __init__(self, path):
        self.inner = SQLiteCache(path)
        self.gets = 0
        self.many: list[int] = []

    def get(self, key: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.inner.get(key)

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        self.many.append(len(keys))
        return self.inner.get_many(keys)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.inner.put(key, value)

    def put_many(self, items: dict[str, dict[str, Any]]) -> None:
        self.inner.put_many(items)


class GetOnly:
    """A backend with only the Protocol's two methods."""

    def __init__(self, entries: dict[str, dict[str, Any]]):
        self.entries = entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.entries[key] = value


def test_get_many_gives_what_get_gives_key_by_key(tmp_path):
    cache = SQLiteCache(tmp_path / "c.sqlite")
    cache.put_many({f"k{i}": {"text": f"reply {i}", "n": i} for i in range(0, 1200, 2)})
    keys = [f"k{i}" for i in range(1200)] + ["k4"]  # more keys than one SELECT takes, one twice
    expected = {key: cache.get(key) for key in keys if cache.get(key) is not None}
    assert cache.get_many(keys) == expected and len(expected) == 600
    assert get_many(GetOnly({"a": {"text": "x"}}), ["a", "b"]) == {"a": {"text": "x"}}
    assert cache.get_many([]) == {} and NullCache().get_many(["a"]) == {}


def _specs(n: int, role: str | None = None, model: str = "m") -> list[CallSpec]:
    return [
        CallSpec(model=model, messages=[{"role": "user", "content": f"Question {i}?"}], role=role) for i in range(n)
    ]


def test_a_cached_batch_is_read_in_one_query_and_sends_nothing(fake_llm, tmp_path):
    fake_llm.responder = lambda request: "answer " + request["messages"][-1]["content"]
    model = {"m": ModelConfig(model="openai/m", api_base=fake_llm.url)}
    first = Gateway(model, SQLiteCache(tmp_path / "c.sqlite")).complete_many(_specs(30)[:20])
    assert len(fake_llm.calls) == 20
    cache = CountingCache(tmp_path / "c.sqlite")
    gateway = Gateway(model, cache)
    again = gateway.complete_many(_specs(30) + _specs(2))  # 20 cached, 10 new, 2 twins of cached ones
    assert [r.text for r in again[:20]] == [r.text for r in first] and all(r.cached for r in again[:20])
    assert not any(r.cached for r in again[20:30]) and all(r.cached for r in again[30:])
    assert len(fake_llm.calls) == 30  # only the 10 new ones were sent
    # One read for the batch, one for the keys from before the endpoint joined the key of the calls it did not
    # find; a key it did not find is read again by its call (another process may have written it meanwhile),
    # and so is a second spec with a key whose entry the first one took.
    assert cache.many == [32, 10] and cache.gets == 10 + 2
    assert (gateway.scope._keys, gateway.scope._legacy, gateway.writes._read_ahead) == ({}, {}, {})  # none kept
    assert all(r.cached for r in gateway.complete_many(_specs(30)))
    assert len(fake_llm.calls) == 30


def test_read_ahead_keeps_the_ttl_and_the_migration_of_entries_from_before_the_endpoint(fake_llm, tmp_path):
    fake_llm.responder = lambda request: "fresh"
    path = tmp_path / "c.sqlite"
    cfg = ModelConfig(model="openai/m", api_base=fake_llm.url)
    cache = SQLiteCache(path)
    specs = _specs(3, role="targets")
    keys = [request_key(cfg, s.messages, {}, None) for s in specs]
    cache.put(keys[0], {"text": "young", "finish_reason": "stop", "created_at": time.time()})
    cache.put(keys[1], {"text": "old", "finish_reason": "stop", "created_at": time.time() - 7200})
    cache.put(
        request_key(cfg, specs[2].messages, {}, None, deployment=False), {"text": "legacy", "finish_reason": "stop"}
    )
    results = Gateway({"m": cfg}, cache, scope=CacheScope({"targets": "ttl:3600s"})).complete_many(specs)
    assert [(r.text, r.cached) for r in results] == [("young", True), ("fresh", False), ("fresh", False)]
    assert len(fake_llm.calls) == 2  # the legacy entry is of unknown age under a ttl: asked again
    plain = Gateway({"m": cfg}, SQLiteCache(path)).complete_many(_specs(3))
    assert [(r.text, r.cached) for r in plain] == [("young", True), ("fresh", True), ("fresh", True)]
    other = _specs(1)[0].model_copy(update={"messages": [{"role": "user", "content": "Moved?"}]})
    cache.put(request_key(cfg, other.messages, {}, None, deployment=False), {"text": "legacy", "finish_reason": "stop"})
    moved, twin = Gateway({"m": cfg}, SQLiteCache(path)).complete_many([other, other.model_copy()])
    assert (moved.text, moved.cached, twin.text, twin.cached) == ("legacy", True, "legacy", True)
    assert cache.get(request_key(cfg, other.messages, {}, None))["text"] == "legacy" and len(fake_llm.calls) == 2


def test_a_failing_read_ahead_leaves_each_call_to_its_own_read(fake_llm, tmp_path):
    fake_llm.responder = lambda request: "answer"
    cache = CountingCache(tmp_path / "c.sqlite")

    def fail(keys):
        raise RuntimeError("cache down")

    cache.get_many = fail
    results = Gateway({"m": ModelConfig(model="openai/m", api_base=fake_llm.url)}, cache).complete_many(_specs(3))
    assert [r.text for r in results] == ["answer"] * 3 and cache.gets == 6  # each key and its legacy key


def test_a_batch_longer_than_a_wave_is_read_ahead_wave_by_wave(fake_llm, tmp_path):
    from refusalbench.tasks.llm.loop_thread import WAVE

    model = {"m": ModelConfig(model="openai/m", api_base=fake_llm.url)}
    Gateway(model, SQLiteCache(tmp_path / "c.sqlite")).complete_many(_specs(2 * WAVE + 6))
    sent = len(fake_llm.calls)
    cache = CountingCache(tmp_path / "c.sqlite")
    again = Gateway(model, cache).complete_many(_specs(2 * WAVE + 6))
    assert all(r.cached for r in again) and len(fake_llm.calls) == sent
    assert cache.many == [WAVE, WAVE, 6] and cache.gets == 0  # each wave read in one query before it starts


def test_batches_arriving_together_take_turns_wave_by_wave():
    """Two batches handed to the loop at once: the second one's first calls start before the first one's
    second wave, so when every model's batch arrives together none waits for all the others' preparation."""
    import asyncio

    from refusalbench.tasks.llm.loop_thread import WAVE, Handoff

    started: list[tuple[str, int]] = []
    prepared: list[tuple[str, int]] = []

    async def call(argument: tuple[str, int]) -> tuple[str, int]:
        started.append(argument)
        await asyncio.sleep(0)
        return argument

    async def both() -> None:
        batches = {name: Handoff(3 * WAVE) for name in "ab"}
        await asyncio.gather(
            *(
                handoff.fill(
                    [(i, call, (name, i)) for i in range(3 * WAVE)],
                    lambda wave: prepared.append((wave[0][0], len(wave))),
                )
                for name, handoff in batches.items()
            )
        )
        for name, handoff in batches.items():
            assert [handoff.get(i) for i in range(3 * WAVE)] == [(name, i) for i in range(3 * WAVE)]

    asyncio.run(both())
    assert prepared[:2] == [("a", WAVE), ("b", WAVE)] and len(prepared) == 6
    assert started.index(("b", 0)) < started.index(("a", WAVE))


def test_a_batch_cancelled_between_waves_leaves_no_result_unanswered():
    """The loop closing while a batch is between waves: every call not started yet, and every one started,
    hands its asking thread a cancellation instead of leaving it waiting."""
    import asyncio
    import concurrent.futures

    from refusalbench.tasks.llm.loop_thread import _EMPTY, WAVE, Handoff

    async def call(argument: int) -> int:
        await asyncio.sleep(60)
        return argument

    async def cancelled_in_flight() -> Handoff:
        handoff = Handoff(2 * WAVE)
        fill = asyncio.ensure_future(handoff.fill([(i, call, i) for i in range(2 * WAVE)]))
        await asyncio.sleep(0)  # the first wave started; the fill yields before the second
        fill.cancel()
        await asyncio.gather(fill, return_exceptions=True)
        return handoff

    handoff = asyncio.run(cancelled_in_flight())
    assert not any(slot is _EMPTY for slot in handoff._slots)  # else ``get`` below would wait for ever
    for index in (0, WAVE - 1, WAVE, 2 * WAVE - 1):
        try:
            handoff.get(index)
        except concurrent.futures.CancelledError:
            continue
        raise AssertionError(f"call {index} was not handed its cancellation")


def test_a_batch_prepares_its_next_wave_only_as_its_calls_finish():
    """A wave is prepared (its keys worked out, its cached replies read) only once fewer than a wave of the
    batch's started calls are unfinished: while the first wave's replies are out, the loop is left to the
    sockets of every batch's first requests instead of preparing the rest of every batch."""
    import asyncio

    from refusalbench.tasks.llm.loop_thread import WAVE, Handoff

    prepared: list[int] = []

    async def run() -> None:
        released = {i: asyncio.Event() for i in range(3 * WAVE)}

        async def call(index: int) -> int:
            await released[index].wait()
            return index

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        handoff = Handoff(3 * WAVE)
        fill = asyncio.ensure_future(
            handoff.fill([(i, call, i) for i in range(3 * WAVE)], lambda wave: prepared.append(wave[0]))
        )
        await settle()
        assert prepared == [0]  # no reply yet: one wave prepared, however long the batch
        released[0].set()
        await settle()
        assert prepared == [0, WAVE]  # one call done: fewer than a wave unfinished, the next wave goes
        for i in range(1, WAVE):  # the first wave done: 32 of the second still out, no third yet
            released[i].set()
        await settle()
        assert prepared == [0, WAVE]
        released[WAVE].set()
        await settle()
        assert prepared == [0, WAVE, 2 * WAVE]
        for event in released.values():
            event.set()
        await fill
        assert [handoff.get(i) for i in range(3 * WAVE)] == list(range(3 * WAVE))

    asyncio.run(run())


def test_a_wave_fills_every_slot_of_a_model_allowed_more_than_a_wave():
    from refusalbench.tasks.llm.loop_thread import WAVE, wave_for

    models = {
        "narrow": ModelConfig(model="openai/narrow", max_concurrency=4),
        "wide": ModelConfig(model="openai/wide", max_concurrency=3 * WAVE),
    }
    assert wave_for(models, _specs(10, model="narrow")) == WAVE
    assert wave_for(models, _specs(10, model="wide")) == 3 * WAVE
    assert wave_for(models, _specs(10, model="unknown")) == WAVE  # its calls end with an error, not a slot
