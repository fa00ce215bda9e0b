"""The gateway's per-call CPU savings keep its behaviour: the same cache keys, no result handed back
before its reply is committed, and the direct path's lean HTTP client reads every reply shape."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from pydantic import BaseModel

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.calls import request_key
from refusalbench.tasks.llm.gateway import CallSpec, Gateway
from refusalbench.tasks.llm.http_post import PostClient


class Verdict(BaseModel):
    verdict: str
    score: int


def test_call_keys_are_the_keys_existing_caches_hold():
    # Computed by the code before the key was made cheaper: existing caches keep hitting.
    cfg = ModelConfig(
        model="openai/bench",
        api_base="HTTP://Host:80/v1/",
        params={"temperature": 0.0, "max_tokens": 256},
        extra_headers={"X-Deployment": "eu", "Authorization": "Bearer k"},
    )
    messages = [
        {"role": "system", "content": "Réponds brièvement."},
        {"role": "user", "content": "Was ist 2+2? \u2603"},
    ]
    assert (
        request_key(cfg, messages, {"seed": 3}, Verdict)
        == "607052e9e0ed73c9109ed5b0a91b0c985b8274f795b1641d5bd1293a7177113a"
    )
    assert (
        request_key(cfg, messages, {"seed": 3}, Verdict, deployment=False)
        == "26d50486c3902eadfb8eef42d0035d18b153c1a0c0d69b5e0bf0ef3db590be13"
    )
    assert (
        request_key(cfg, messages, {}, None, scope="round:r1")
        == "850c00df8731b598a23fd6620b2f756a5e557317aa0a5a71e04ab6148e3f6f0b"
    )


class CommittedCache:
    """A cache that remembers which keys were committed, and in what groups."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.groups: list[int] = []

    def get(self, key):
        return self.rows.get(key)

    def put(self, key, value):
        self.put_many({key: value})

    def put_many(self, items):
        self.groups.append(len(items))
        self.rows.update(items)


def test_each_result_is_handed_back_after_its_reply_is_committed(fake_llm, tmp_path):
    fake_llm.latency_s = 0.02  # replies of the calls in flight come back together: written together
    cache = CommittedCache()
    gateway = Gateway({"m": ModelConfig(model="openai/fake", api_base=fake_llm.url, max_concurrency=8)}, cache)
    specs = [CallSpec(model="m", messages=[{"role": "user", "content": f"q{i % 30}"}]) for i in range(40)]
    seen = []

    def on_result(result):
        assert result.ok and result.key in cache.rows  # durable before anyone sees it
        seen.append(result.tag)

    results = gateway.complete_many(specs, on_result)
    assert len(seen) == 40 and sum(cache.groups) == 30  # 10 repeats: deduplicated or served from the cache
    assert len(fake_llm.calls) == 30 and [r.key for r in results] == [
        gateway.scope.key(gateway.models["m"], s) for s in specs
    ]

    sqlite_cache = SQLiteCache(tmp_path / "calls.sqlite")
    on_disk = Gateway({"m": ModelConfig(model="openai/fake", api_base=fake_llm.url, max_concurrency=8)}, sqlite_cache)
    keys = [r.key for r in on_disk.complete_many(specs[:20])]
    with sqlite3.connect(tmp_path / "calls.sqlite") as conn:  # another connection sees every row committed
        assert {row[0] for row in conn.execute("SELECT key FROM calls")} == set(keys)


# ---------------------------------------------------------------- the lean HTTP client


async def _serve(replies: list[bytes], *, close_after: bool = False, hold_s: float = 0.0):
    """A loopback server answering each request on a connection with the next of ``replies``; the
    connections it accepted are counted in the returned list."""
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        while replies:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            )
            await reader.readexactly(length)
            reply = replies.pop(0)
            if reply:
                writer.write(reply)
                await writer.drain()
            if close_after or not reply:
                break
        await asyncio.sleep(hold_s)  # silent, the connection open
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions", accepted


def test_lean_client_reads_each_reply_shape_on_one_kept_connection():
    async def scenario():
        replies = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n{}",
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n4\r\n": 1\r\n1\r\n}\r\n0\r\n\r\n',
            b"HTTP/1.1 429 Too Many\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n",
        ]
        server, url, accepted = await _serve(replies)
        client = PostClient()
        got = [
            await client.post(url, b'{"x": 1}', {"Content-Type": "application/json"}, connect_timeout=5, read_timeout=5)
            for _ in range(3)
        ]
        client.close()
        server.close()
        return got, accepted

    got, accepted = asyncio.run(scenario())
    assert [(status, body) for status, _, body in got] == [(200, b"{}"), (200, b'{"a": 1}'), (429, b"")]
    assert got[0][1]["x-a"] == "1" and got[2][1]["retry-after"] == "2"
    assert len(accepted) == 1  # kept alive


def test_lean_client_fails_cleanly_on_close_delimited_dropped_and_silent_replies():
    async def scenario():
        client = PostClient()
        server, url, _ = await _serve([b"HTTP/1.0 200 OK\r\n\r\nuntil close"], close_after=True)
        until_close = await client.post(url, b"{}", {}, connect_timeout=5, read_timeout=5)
        server.close()
        server, url, _ = await _serve([b""])  # the server hangs up without a reply
        with pytest.raises(ConnectionError):
            await client.post(url, b"{}", {}, connect_timeout=5, read_timeout=5)
        server.close()
        server, url, _ = await _serve([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{"], hold_s=2)  # then silence
        with pytest.raises(TimeoutError):
            await client.post(url, b"{}", {}, connect_timeout=5, read_timeout=0.2)
        server.close()
        with pytest.raises(ValueError):
            await client.post(url, b"{}", {"X-Bad": "a\r\nInjected: 1"}, connect_timeout=5, read_timeout=5)
        client.close()
        return until_close

    assert asyncio.run(scenario())[::2] == (200, b"until close")
