"""Persistent cache of completed LLM calls, with backends chosen by name from a registry.

Every successful call is written as it completes (the gateway commits the calls that complete
together in one transaction, ``WriteBehind``, before any of their results is handed back), so a
crash or SIGKILL loses nothing a caller saw and a re-run repeats no finished call. Backends share one tiny Protocol so a
single machine uses SQLite (WAL mode, safe across threads and processes) and a fleet of
workers shares Redis.

A backend is a factory registered under the name a config's ``cache.backend`` gives::

    @register_cache_backend("memory")
    def open_memory_cache(*, path: str | None = None, url: str | None = None) -> CallCache:
        return MyCache()

The factory receives the ``cache:`` section's options (``path``, ``url``) as keywords and uses
the ones it needs. ``cache.backend`` is checked against the registry when a config is loaded
(the check is registered below); a backend of one's own lives in a plugin (``tasks/core/plugins.py``),
which is loaded before that check. A name already taken is an error unless ``replace=True``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import platformdirs

from refusalbench.tasks.core.config import CONFIG_CHECKS, RunConfig
from refusalbench.tasks.core.registry import Registry


@runtime_checkable
class CallCache(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, value: dict[str, Any]) -> None: ...


class CacheBackend(Protocol):
    """Opens a cache from the config's ``cache:`` options; options a backend does not use are ignored."""

    def __call__(self, *, path: str | None = None, url: str | None = None) -> CallCache: ...


CACHE_BACKENDS: Registry[CacheBackend] = Registry("cache backend")
Factory = TypeVar("Factory", bound=CacheBackend)


def register_cache_backend(name: str, *, replace: bool = False) -> Callable[[Factory], Factory]:
    """Decorator: make ``factory`` the cache backend a config selects with ``cache.backend: <name>``."""
    return CACHE_BACKENDS.register(name, replace=replace)


def cache_backends() -> list[str]:
    """Names of the registered cache backends, sorted."""
    return sorted(CACHE_BACKENDS)


def _unknown_backend(backend: str) -> str:
    return CACHE_BACKENDS.unknown_message([backend], known=cache_backends())


@CONFIG_CHECKS.register("cache.backend")
def check_cache_backend(config: RunConfig) -> tuple[str, str] | None:
    """``cache.backend`` names a registered backend (not a fixed list: a new one needs no edit here)."""
    return None if config.cache.backend in CACHE_BACKENDS else ("cache.backend", _unknown_backend(config.cache.backend))


def open_cache(backend: str = "sqlite", **options: Any) -> CallCache:
    """The cache the backend registered as ``backend`` opens with ``options`` (``path``, ``url``)."""
    if backend not in CACHE_BACKENDS:
        raise ValueError(_unknown_backend(backend))
    return CACHE_BACKENDS[backend](**options)


class NullCache:
    """Caches nothing (``cache.backend: none``)."""

    def get(self, key: str) -> dict[str, Any] | None:
        return None

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        return {}

    def put(self, key: str, value: dict[str, Any]) -> None:
        return None


_INSERT = "INSERT OR REPLACE INTO calls (key, value, created) VALUES (?, ?, ?)"
_KEYS_PER_SELECT = 500  # well under SQLite's limit on bound parameters (999 in older builds)


class SQLiteCache:
    """One row per call in a local SQLite file; one connection per thread."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._connection() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
            )

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            # WAL + NORMAL: a committed row survives a killed process; writers do not block readers.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._connection().execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """{key: value} of the ``keys`` cached (the others left out): one SELECT per 500 keys, not one per key."""
        conn, found = self._connection(), {}
        for start in range(0, len(keys), _KEYS_PER_SELECT):
            chunk = keys[start : start + _KEYS_PER_SELECT]
            marks = ",".join("?" * len(chunk))
            for key, value in conn.execute(f"SELECT key, value FROM calls WHERE key IN ({marks})", chunk):
                found[key] = json.loads(value)
        return found

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._connection().execute(_INSERT, (key, json.dumps(value), time.time()))

    def put_many(self, items: dict[str, dict[str, Any]]) -> None:
        """Write ``items`` in one transaction: one commit for the calls that completed together."""
        now = time.time()
        rows = [(key, json.dumps(value), now) for key, value in items.items()]
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def __len__(self) -> int:
        count: int = self._connection().execute("SELECT COUNT(*) FROM calls").fetchone()[0]
        return count

    def __getstate__(self) -> dict[str, Any]:
        # Picklable for process-based runners: connections are reopened on the other side.
        return {"path": str(self.path)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["path"])


class RedisCache:
    """Shared cache for many machines (``cache.backend: redis``)."""

    def __init__(self, url: str, prefix: str = "refusalbench:call:"):
        import redis

        self.url = url
        self.prefix = prefix
        self._client = redis.Redis.from_url(url)

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._client.get(self.prefix + key)
        return json.loads(raw) if raw else None

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """{key: value} of the ``keys`` cached, in one round trip (MGET)."""
        raws = self._client.mget([self.prefix + key for key in keys]) if keys else []
        return {key: json.loads(raw) for key, raw in zip(keys, raws) if raw}

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._client.set(self.prefix + key, json.dumps(value))

    def put_many(self, items: dict[str, dict[str, Any]]) -> None:
        """Write ``items`` in one round trip."""
        self._client.mset({self.prefix + key: json.dumps(value) for key, value in items.items()})

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "prefix": self.prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["url"], state["prefix"])


def put_many(cache: CallCache, items: dict[str, dict[str, Any]]) -> None:
    """Write ``items`` to ``cache``: together where the backend can (``put_many``), else one by one."""
    many = getattr(cache, "put_many", None)
    if many is not None:
        many(items)
    else:
        for key, value in items.items():
            cache.put(key, value)


def get_many(cache: CallCache, keys: list[str]) -> dict[str, dict[str, Any]]:
    """{key: value} of the ``keys`` in ``cache``: in one read where the backend can (``get_many``), else
    one ``get`` per key; keys not cached are left out."""
    many = getattr(cache, "get_many", None)
    if many is not None:
        found_together: dict[str, dict[str, Any]] = many(keys)
        return found_together
    found = {}
    for key in keys:
        value = cache.get(key)
        if value is not None:
            found[key] = value
    return found


class WriteBehind:
    """A cache as the gateway's event loop writes it: the replies that complete in one turn of the
    loop are written together (SQLite: one transaction, not one per call), before the next request
    goes out (:meth:`flush`, called by the gateway as it sends) or at the end of that turn.

    So a crash loses no more than before: the calls still in flight. A call awaits :meth:`committed`
    before its result is handed back; until then :meth:`get` serves a pending reply from memory, so
    an identical call that comes meanwhile is not sent again. Loop-only.

    :meth:`read_ahead` reads the cached replies of a batch's keys in one query (``get_many``); each
    is handed out once, by the :meth:`get` of its key, and a key not found is read again by its own
    ``get`` (an entry another process writes meanwhile still serves it, as before).
    """

    def __init__(self, cache: CallCache):
        self.cache = cache
        self._pending: dict[str, dict[str, Any]] = {}
        self._flushed: asyncio.Future[None] | None = None
        self._read_ahead: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        value = self._pending.get(key)
        if value is not None:
            return dict(value)
        value = self._read_ahead.pop(key, None)
        return value if value is not None else self.cache.get(key)

    def read_ahead(self, keys: list[str]) -> set[str]:
        """Read the cached replies of ``keys`` now, in one query, for their :meth:`get` to hand out; the keys
        found (or pending)."""
        found = get_many(self.cache, [key for key in keys if key not in self._pending])
        self._read_ahead.update(found)
        return {key for key in keys if key in found or key in self._pending}

    def forget(self, keys: list[str]) -> None:
        """Drop what :meth:`read_ahead` read for ``keys`` and no ``get`` took (a batch that ended early)."""
        for key in keys:
            self._read_ahead.pop(key, None)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._read_ahead.pop(key, None)  # the reply read ahead is no longer the entry
        self._pending[key] = value
        if self._flushed is None:
            loop = asyncio.get_running_loop()
            self._flushed = loop.create_future()
            loop.call_soon(self.flush)  # after every callback ready now: the calls completing together

    async def committed(self) -> None:
        """Return once every write made so far is in the cache (raising what the cache raised)."""
        if self._flushed is not None:
            await asyncio.shield(self._flushed)

    def flush(self) -> None:
        """Write what is pending now."""
        if self._flushed is None:
            return
        pending, self._pending = self._pending, {}
        flushed, self._flushed = self._flushed, None
        try:
            put_many(self.cache, pending)
        except Exception as exc:  # each call that wrote raises it, as a failed put always did
            flushed.set_exception(exc)
            flushed.exception()  # retrieved: the awaiting calls report it
        else:
            flushed.set_result(None)


def default_cache_dir() -> Path:
    return Path(os.environ.get("REFUSALBENCH_CACHE_DIR") or platformdirs.user_cache_dir("refusalbench"))


# ---------------------------------------------------------------- built-in backends


@register_cache_backend("none")
def open_null_cache(*, path: str | None = None, url: str | None = None) -> CallCache:
    return NullCache()


@register_cache_backend("sqlite")
def open_sqlite_cache(*, path: str | None = None, url: str | None = None) -> CallCache:
    return SQLiteCache(path or default_cache_dir() / "calls.sqlite")


@register_cache_backend("redis")
def open_redis_cache(*, path: str | None = None, url: str | None = None) -> CallCache:
    if not url:
        raise ValueError("cache.backend redis needs cache.url (redis://host:port/db)")
    return RedisCache(url)
