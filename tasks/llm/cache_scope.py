"""The call cache as one run sees it: each role's scope, the run's round, the roles it asks afresh.

The config's side (roles, scopes, defaults) is ``tasks/core/cache_policy.py``; here is what a
scope does to a call (a call's role comes with its ``CallSpec``):

- its key: a ``round`` role's key also holds the round id, a ``--fresh`` role's the run's salt;
  a ``forever`` or ``ttl`` call's key is byte-identical to the key it always had, so existing
  caches keep hitting;
- which cached reply serves it: a ``ttl`` role's only while younger than the limit (by the
  entry's ``created_at``; an entry without one is of unknown age and asked again); a reply
  cached before the deployment joined the key is migrated only for a call whose key has no
  scope (``endpoints``);
- what the entry says: written in a round, it records the round, so a later round can tell
  which of its calls an earlier round's entries served (``freshness.json``).

A batch of calls (:meth:`CacheScope.reading_ahead`) has its keys worked out and its cached replies
read in one query before its calls start, part by part (``loop_thread.Handoff.fill``); each call then
takes its key and reply from there (``WriteBehind.read_ahead``), through the same rules as a call read alone.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from refusalbench.tasks.core.cache_policy import ROUND, ttl_seconds
from refusalbench.tasks.core.config import CacheConfig, ModelConfig
from refusalbench.tasks.llm.callcache import CallCache, WriteBehind, get_many
from refusalbench.tasks.llm.calls import CallSpec, request_key
from refusalbench.tasks.llm.endpoints import sole_deployment
from refusalbench.tasks.llm.reply_outcomes import cacheable

# Where a cached value records the round that wrote it.
ROUND_FIELD = "round"
T = TypeVar("T")


class CacheScope:
    """Each role's scope (``cache.policy`` resolved), the run's round and ``--fresh`` salts, and how
    many calls of each role the cache served from entries an earlier round wrote."""

    def __init__(
        self, policy: dict[str, str] | None = None, round_id: str | None = None, fresh: dict[str, str] | None = None
    ):
        self.policy = dict(policy or {})
        self.round_id = round_id
        self.fresh = dict(fresh or {})
        self._lock = threading.Lock()
        self._by_role: dict[str, Counter[str]] = {}
        # {model: (its config, the registry, its size, whether it is its model string's sole deployment)}: asked on
        # every cache miss, it compares the model with every other one, so it is worked out once.
        self._sole: dict[str, tuple[ModelConfig, Any, int, bool]] = {}
        # {id(spec): (spec, key)}: the keys a batch worked out before its calls start (``reading_ahead``),
        # each taken by its call's ``key``; the spec is kept so its id is not reused meanwhile. Loop-only.
        self._keys: dict[int, tuple[CallSpec, str]] = {}
        # {id(spec): (spec, the entry under its key from before the deployment joined it, or None)}: read with the
        # batch for the calls its cache did not have; nothing writes such keys any more, so None is final. Loop-only.
        self._legacy: dict[int, tuple[CallSpec, dict[str, Any] | None]] = {}

    @classmethod
    def of(cls, cache: CacheConfig) -> CacheScope:
        """The scope a run's ``cache`` section gives (a config never scoped by a flow: everything forever)."""
        return cls(cache.policy.resolved(refresh=cache.round is not None), cache.round, cache.fresh)

    def identity(self) -> list[Any]:
        """What tells two scopes apart (one shared gateway per scope in a process)."""
        return [sorted(self.policy.items()), self.round_id, sorted(self.fresh.items())]

    def salt(self, role: str | None) -> str | None:
        """What the role's calls add to their key: the round (``round``), the ``--fresh`` salt; None: nothing."""
        if role is None:
            return None
        parts = []
        if self.policy.get(role) == ROUND and self.round_id:
            parts.append(f"round:{self.round_id}")
        if role in self.fresh:
            parts.append(f"fresh:{self.fresh[role]}")
        return "|".join(parts) or None

    def key(self, cfg: ModelConfig, spec: CallSpec) -> str:
        known = self._keys.pop(id(spec), None)
        if known is not None and known[0] is spec:
            return known[1]
        return request_key(cfg, spec.messages, spec.params, spec.schema_, scope=self.salt(spec.role))

    async def reading_ahead(
        self,
        cache: WriteBehind,
        models: dict[str, ModelConfig],
        calls: Callable[[Callable[[Sequence[CallSpec]], None]], Awaitable[T]],
    ) -> T:
        """Await ``calls(ahead)`` (a batch's calls on the gateway's loop), which calls ``ahead(specs)`` before it
        starts each part of the batch: their keys are worked out and their cached replies read in one query.
        What no call took is dropped when the calls end."""
        read: list[tuple[int, str]] = []

        def ahead(specs: Sequence[CallSpec]) -> None:
            read.extend(self._read_ahead(cache, specs, models))

        try:
            return await calls(ahead)
        finally:
            for ident, _ in read:
                self._keys.pop(ident, None)
                self._legacy.pop(ident, None)
            cache.forget([key for _, key in read])

    def _read_ahead(
        self, cache: WriteBehind, specs: Sequence[CallSpec], models: dict[str, ModelConfig]
    ) -> list[tuple[int, str]]:
        """Work out the keys of ``specs`` and read their cached replies (and, for those missing, their entries from
        before the deployment joined the key) in one query each; [(id(spec), key)] of those read."""
        keys = {}
        for spec in specs:
            cfg = models.get(spec.model)
            if cfg is None or cfg.rule_based:  # these end before their key (Gateway._answer)
                continue
            try:
                keys[id(spec)] = (spec, self.key(cfg, spec))
            except Exception:  # noqa: BLE001, S112 - its call works the key out again and reports the error
                continue
        legacy: dict[int, tuple[CallSpec, dict[str, Any] | None]] = {}
        try:
            found = cache.read_ahead([key for _, key in keys.values()])
            legacy = self._legacy_entries(
                cache, [(i, spec) for i, (spec, key) in keys.items() if key not in found], models
            )
        except Exception:  # noqa: BLE001, S110 - each call's own read then meets the error and reports it, as before
            pass
        self._keys.update(keys)
        self._legacy.update(legacy)
        return [(ident, key) for ident, (_, key) in keys.items()]

    def _legacy_entries(
        self, cache: WriteBehind, missing: list[tuple[int, CallSpec]], models: dict[str, ModelConfig]
    ) -> dict[int, tuple[CallSpec, dict[str, Any] | None]]:
        """{id(spec): (spec, its entry from before the deployment joined the key, or None)} of the specs ``missing``
        from the cache that such an entry may serve (``cached_reply``), read in one query."""
        legacy_keys = {}
        for ident, spec in missing:
            cfg = models[spec.model]
            if self.salt(spec.role) is None and self._sole_deployment(spec.model, cfg, models):
                legacy_keys[ident] = (
                    spec,
                    request_key(cfg, spec.messages, spec.params, spec.schema_, deployment=False),
                )
        found = get_many(cache.cache, sorted({key for _, key in legacy_keys.values()})) if legacy_keys else {}
        return {ident: (spec, found.get(key)) for ident, (spec, key) in legacy_keys.items()}

    def cached_reply(
        self, cache: CallCache, key: str, spec: CallSpec, cfg: ModelConfig, models: dict[str, ModelConfig]
    ) -> dict[str, Any] | None:
        """The cached reply that may serve ``spec`` (None: ask the model), counted for its role."""
        value = cache.get(key)
        if value is None and self.salt(spec.role) is None:
            value = self._migrated(cache, key, spec, cfg) if self._sole_deployment(spec.model, cfg, models) else None
        if value is not None and not cacheable(value, structured=spec.schema_ is not None):
            value = None  # cached before truncated or blocked replies were told apart: ask again
        if value is not None and not self._young_enough(spec.role, value):
            value = None  # older than the role's ttl: asked again, and the new reply replaces it
        self._tally(spec.role, value)
        return value

    def stamped(self, value: dict[str, Any]) -> dict[str, Any]:
        """``value`` as the cache keeps it: with the round that wrote it, when the run is a round."""
        if self.round_id is not None:
            value[ROUND_FIELD] = self.round_id
        return value

    def role_stats(self) -> dict[str, dict[str, int]]:
        """{role: {"calls": n, "from_earlier_rounds": m}} of the calls this scope has seen."""
        with self._lock:
            return {role: dict(counter) for role, counter in self._by_role.items()}

    def _migrated(self, cache: CallCache, key: str, spec: CallSpec, cfg: ModelConfig) -> dict[str, Any] | None:
        """A reply cached before the deployment was part of the key, moved to its new key (``endpoints``);
        for the sole deployment of its model string only. Read with its batch where it was (``reading_ahead``)."""
        known = self._legacy.pop(id(spec), None)
        if known is not None and known[0] is spec:
            legacy = dict(known[1]) if known[1] is not None else None  # a copy: twins in a batch share the entry read
        else:
            legacy = cache.get(request_key(cfg, spec.messages, spec.params, spec.schema_, deployment=False))
        if legacy is not None:
            cache.put(key, legacy)
        return legacy

    def _sole_deployment(self, name: str, cfg: ModelConfig, models: dict[str, ModelConfig]) -> bool:
        known = self._sole.get(name)
        if known is None or known[0] is not cfg or known[1] is not models or known[2] != len(models):
            known = self._sole[name] = (cfg, models, len(models), sole_deployment(cfg, models.values()))
        return known[3]

    def _young_enough(self, role: str | None, value: dict[str, Any]) -> bool:
        limit = ttl_seconds(self.policy.get(role, "")) if role is not None else None
        if limit is None:
            return True
        created = value.get("created_at")
        return created is not None and time.time() - float(created) <= limit

    def _tally(self, role: str | None, value: dict[str, Any] | None) -> None:
        if role is None:
            return
        earlier = value is not None and self.round_id is not None and value.get(ROUND_FIELD) != self.round_id
        with self._lock:
            counter = self._by_role.setdefault(role, Counter())
            counter["calls"] += 1
            counter["from_earlier_rounds"] += int(earlier)
