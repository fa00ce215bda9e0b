"""Step of the refresh flow: ``freshness.json`` for the round just evaluated.

What is new in the round (``tasks/refusalbench/rounds/freshness.py``: items, pairs, calls served from
earlier rounds' cache entries, fingerprints) goes into the round folder and the run's Logs
tab, with a line for every model whose fingerprint changed since the previous round.
"""

from __future__ import annotations

import logging

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.cache_scoping import scoped_config
from refusalbench.tasks.pipeline.ui import story
from refusalbench.tasks.refusalbench.rounds.freshness import (
    fingerprint_changes,
    fingerprint_lines,
    previous_fingerprints,
    round_freshness,
)
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import FreshnessDocument


def record_freshness(cfg: RunConfig, root: ArtifactStore, round_id: str) -> FreshnessDocument:
    """Write ``<round>/freshness.json`` and tell the round's story of it; returns the document."""
    policy = scoped_config(cfg, root.child(round_id).uri(""), round_id).cache.policy.resolved(refresh=True)
    document = round_freshness(root, round_id, policy)
    root.child(round_id).save(rb_files.FRESHNESS, document)
    story(
        "freshness: %d of %d items and %d of %d (base item, lever) pairs seen in earlier rounds%s; %d of %d calls "
        "served from earlier rounds' cache entries",
        document.items_seen_before,
        document.items_total,
        document.pairs_seen_before,
        document.pairs_total,
        " (pool exhausted)" if document.pool_exhausted else "",
        document.calls_from_earlier_rounds,
        document.calls_total,
    )
    for line in fingerprint_lines(fingerprint_changes(previous_fingerprints(root, round_id), document.fingerprints)):
        story("fingerprint changed: %s", line, level=logging.WARNING)
    return document
