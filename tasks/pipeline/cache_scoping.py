"""The config as one run's calls see it: its cache scope settled when the flow starts.

A flow reads its config, then :func:`scoped_config` settles the ``cache`` section for the run:
every role's scope (``cache.policy`` resolved: the refresh defaults when the run is a round,
else forever), the round id (the refresh flow passes it down; ``round.json`` keeps it
across a resumed round), and a salt for each role ``--fresh`` asks afresh. The settled section
is part of the typed config every stage task receives (so the gateway it opens keys with it,
and Prefect's task cache tells a fresh run from a resumed one) and of ``manifest.json``, where
a resumed run finds its salts again.
"""

from __future__ import annotations

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.cache_policy import ROUND, CachePolicy, fresh_salts
from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.store import ArtifactStore


def recorded_fresh(out: str) -> dict[str, str]:
    """The ``--fresh`` salts an earlier start of the run in ``out`` recorded in its manifest ({} if none)."""
    store = ArtifactStore(out)
    if not store.has(runfolder.MANIFEST):
        return {}
    cache = store.load(runfolder.MANIFEST).config.get("cache") or {}
    return dict(cache.get("fresh") or {})


def scoped_config(cfg: RunConfig, out: str, round_id: str | None = None, fresh: list[str] | None = None) -> RunConfig:
    """``cfg`` with its cache scope settled for the run in ``out`` (see module doc).

    ``round_id``: the refresh round (else a ``cache.round`` the config names); a round takes the
    refresh defaults. A run that is no round but scopes a role ``round`` is its own round, keyed by
    its run folder: a resume there repeats nothing, a run in another folder asks again.
    """
    round_id = round_id or cfg.cache.round
    policy = cfg.cache.policy.resolved(refresh=round_id is not None)
    if round_id is None and ROUND in policy.values():
        round_id = f"run:{ArtifactStore(out).uri('')}"
    salts = fresh_salts(fresh or [], recorded_fresh(out) if fresh else None)
    cache = cfg.cache.model_copy(update={"policy": CachePolicy(**policy), "round": round_id, "fresh": salts})
    return cfg.model_copy(update={"cache": cache})
