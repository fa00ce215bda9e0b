"""How fresh a refresh round is, from the data of the rounds under one ``out_root``.

The method's argument rests on each round being a fresh sample, independent of earlier ones.
``freshness.json`` says how far a round is from that: how many of its benchmark items (question
+ context digest) and of its (base item, lever) pairs appeared in an earlier round, how many of
its calls the cache served from entries an earlier round wrote (per role, from the counts its
runs' manifests recorded), the cache policy it ran under, and the model fingerprints its replies
carried (``system_fingerprint``, else the served model name), so a report can say which models
changed behind an unchanged name (:func:`fingerprint_changes`).

Earlier rounds are the round folders under the same root whose names sort before this one's
(round names start with their UTC start time).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.cache_policy import CACHE_ROLES
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.rounds.trend import ROUND_PREFIX
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import FreshnessDocument
from refusalbench.tasks.refusalbench.schema.records import Assignment, BenchmarkItem

Pair = tuple[str, str]  # (base item id, lever id)


def item_digest(item: BenchmarkItem) -> str:
    """What makes a benchmark item the same item in two rounds: its question and its context (or passages)."""
    context = item.context if item.passages is None else [p.model_dump(mode="json") for p in item.passages]
    return hashlib.sha256(json.dumps([item.question, context], sort_keys=True).encode()).hexdigest()[:16]


def split_round_folder(round_folder: str) -> tuple[ArtifactStore, str]:
    """(the root holding the rounds, the round's folder name) of a round folder's path or URI."""
    parent, _, name = round_folder.rstrip("/").rpartition("/")
    return ArtifactStore(parent or "."), name


def earlier_rounds(root: ArtifactStore, round_id: str) -> list[str]:
    """The round folders under ``root`` that started before ``round_id`` (oldest first)."""
    return [name for name in root.folders() if name.startswith(ROUND_PREFIX) and name < round_id]


def round_pairs(store: ArtifactStore) -> set[Pair]:
    """The (base item, lever) pairs a round assigned (none before its assignment was written)."""
    if not store.has(rb_files.ASSIGNMENTS):
        return set()
    return {(a.base_id, a.lever_id) for a in store.read_records(rb_files.ASSIGNMENTS.name, Assignment)}


def round_items(store: ArtifactStore) -> list[str]:
    """The digest of each of a round's benchmark items (none before its benchmark was written)."""
    if not store.has(rb_files.BENCHMARK):
        return []
    return [item_digest(item) for item in store.load(rb_files.BENCHMARK)]


def earlier_pairs(round_folder: str) -> set[Pair]:
    """Every (base item, lever) pair an earlier round under the same root assigned: what assignment avoids."""
    root, round_id = split_round_folder(round_folder)
    return set().union(*(round_pairs(root.child(name)) for name in earlier_rounds(root, round_id)))


def fingerprint_of(served_model: Any, system_fingerprint: Any) -> str | None:
    """One reply's fingerprint: the served model name and the provider's fingerprint, whichever it gave."""
    parts = [str(part) for part in (served_model, system_fingerprint) if isinstance(part, str) and part]
    return " / ".join(parts) or None


# The reply tables of a round folder: (table, the column naming the model, its fingerprint columns' prefix).
REPLY_TABLES = (
    (rb_files.CANDIDATES, "generator", ""),
    (rb_files.VERIFICATIONS, "verifier", ""),
    (rb_files.RESPONSES, "model", ""),
    (rb_files.JUDGMENTS, "judge", "judge_"),
)


def round_fingerprints(store: ArtifactStore) -> dict[str, list[str]]:
    """{model: its replies' distinct fingerprints, sorted} over the round's reply tables."""
    found: dict[str, set[str]] = {}
    for artifact, model_column, prefix in REPLY_TABLES:
        if not store.has(artifact):
            continue
        assert artifact.schema is not None, "a reply table is a table of records"
        for record in store.read_records(artifact.name, artifact.schema):
            row = record.model_dump()
            fingerprint = fingerprint_of(row.get(f"{prefix}served_model"), row.get(f"{prefix}system_fingerprint"))
            if fingerprint is not None and row.get(model_column):
                found.setdefault(row[model_column], set()).add(fingerprint)
    return {model: sorted(values) for model, values in sorted(found.items())}


def fingerprint_changes(previous: dict[str, list[str]], latest: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The models whose fingerprints differ between two rounds' ``freshness.json`` ``fingerprints``:
    ``[{"model", "before", "after"}]``, by model. A model without fingerprints in either round
    (its provider sends none, or it was not called) is no change."""
    return [
        {"model": model, "before": previous[model], "after": latest[model]}
        for model in sorted(set(previous) & set(latest))
        if previous[model] and latest[model] and set(previous[model]) != set(latest[model])
    ]


def fingerprint_lines(changes: list[dict[str, Any]]) -> list[str]:
    """One line per changed model, for a report or a log: ``gpt: fp_1 -> fp_2``."""
    return [f"{c['model']}: {', '.join(c['before'])} -> {', '.join(c['after'])}" for c in changes]


def freshness_lines(fresh: FreshnessDocument | None) -> list[str]:
    """The round's freshness in words, a line per figure ([] when it was not recorded)."""
    if fresh is None:
        return []
    exhausted = " (the pool of pairs ran out: some repeat)" if fresh.pool_exhausted else ""
    return [
        f"items seen in earlier rounds: {fresh.items_seen_before:,} of {fresh.items_total:,}",
        f"(base item, lever) pairs seen in earlier rounds: {fresh.pairs_seen_before:,} of "
        f"{fresh.pairs_total:,}{exhausted}",
        f"calls served from earlier rounds' cache entries: {fresh.calls_from_earlier_rounds:,} of "
        f"{fresh.calls_total:,}",
    ]


def previous_fingerprints(root: ArtifactStore, round_id: str) -> dict[str, list[str]]:
    """The ``fingerprints`` of the latest earlier round that wrote ``freshness.json`` ({} if none)."""
    for name in reversed(earlier_rounds(root, round_id)):
        store = root.child(name)
        if store.has(rb_files.FRESHNESS):
            fingerprints: dict[str, list[str]] = store.load(rb_files.FRESHNESS).fingerprints
            return fingerprints
    return {}


def calls_by_role(store: ArtifactStore) -> dict[str, dict[str, int]]:
    """{role: {"calls", "from_earlier_rounds"}} summed over the round's manifests (generation and evaluation)."""
    totals = {role: {"calls": 0, "from_earlier_rounds": 0} for role in CACHE_ROLES}
    for artifact in (rb_files.GENERATION_MANIFEST, runfolder.MANIFEST):
        if not store.has(artifact):
            continue
        manifest = store.load(artifact)
        if artifact is runfolder.MANIFEST and manifest.kind == "generate" and store.has(rb_files.GENERATION_MANIFEST):
            continue  # the same run's manifest, already counted
        for role, counts in (manifest.counts.get("calls_by_role") or {}).items():
            entry = totals.setdefault(role, {"calls": 0, "from_earlier_rounds": 0})
            for name in entry:
                entry[name] += int(counts.get(name, 0))
    return totals


def round_freshness(root: ArtifactStore, round_id: str, cache_policy: dict[str, str]) -> FreshnessDocument:
    """``freshness.json`` of the round ``round_id`` under ``root``, computed from the rounds' files."""
    store = root.child(round_id)
    earlier = [root.child(name) for name in earlier_rounds(root, round_id)]
    items, pairs = round_items(store), round_pairs(store)
    seen_items = {digest for s in earlier for digest in round_items(s)}
    seen_pairs = set().union(*(round_pairs(s) for s in earlier))
    by_role = calls_by_role(store)
    return FreshnessDocument(
        round_id=round_id,
        items_total=len(items),
        items_seen_before=sum(digest in seen_items for digest in items),
        pairs_total=len(pairs),
        pairs_seen_before=len(pairs & seen_pairs),
        pool_exhausted=bool(pairs & seen_pairs),
        calls_total=sum(r["calls"] for r in by_role.values()),
        calls_from_earlier_rounds=sum(r["from_earlier_rounds"] for r in by_role.values()),
        by_role=by_role,
        cache_policy=dict(cache_policy),
        fingerprints=round_fingerprints(store),
    )
