"""The clusters the bootstrap resamples: base items, not benchmark items (paper §3.1, App. G).

A base item is written into up to 18 benchmark items (one per perturbation class × intensity),
which share its question and context: a model that misreads the context tends to fail all of
them. Resampling benchmark items as if they were independent makes the intervals too narrow,
so every interval and standard error resamples base items, each with all of its rows, across
models alike.

Decisions the contract leaves open:
- A row without a ``base_id`` (a judged file that does not carry the column, or an empty
  cell) is its own cluster: its item (the same item for every model, so pairs stay paired).
- Cluster numbers follow the sorted base ids (then the items without one), so the one
  resample-index matrix (:func:`cluster_counts`) depends on the seed and the set of base items
  only: adding a model evaluated on the same items leaves the others' intervals unchanged.
- Where each cluster holds at most one row of a group (a model, a breakdown row), resampling
  clusters is resampling rows, so the i.i.d. computation gives the cluster figure and the two
  are the same.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from refusalbench.tasks.core.stats import cluster_resample_counts, seeded_rng
from refusalbench.tasks.refusalbench.scoring.inputs import CLUSTER_COLUMN

# The label that seeds the one resample-index matrix of a score (with the score's seed).
CLUSTER_STREAM = "base items"
UNIT_DESCRIPTION = (
    "base item (cluster bootstrap: every resample draws base items with replacement, each with "
    "all of its benchmark items, the same draws for every model; an item without a base_id is its "
    "own cluster)"
)


def cluster_codes(df: pd.DataFrame) -> tuple[np.ndarray, int]:
    """(row -> cluster number, number of clusters) of a prepared frame: its base item, else its item."""
    items, _ = pd.factorize(df["item_id"], sort=True)
    if CLUSTER_COLUMN not in df.columns:
        return items.astype(np.int64), int(items.max()) + 1 if len(items) else 0
    bases, base_names = pd.factorize(df[CLUSTER_COLUMN], sort=True, use_na_sentinel=True)
    missing = bases < 0
    if not missing.any():
        return bases.astype(np.int64), len(base_names)
    alone, alone_items = pd.factorize(items[missing], sort=True)
    codes = bases.astype(np.int64)
    codes[missing] = len(base_names) + alone
    return codes, len(base_names) + len(alone_items)


def multi_row_groups(groups: np.ndarray, clusters: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group (0..n_groups-1): whether some cluster holds more than one of its rows."""
    pairs, counts = np.unique(
        groups.astype(np.int64) * (int(clusters.max(initial=0)) + 1) + clusters, return_counts=True
    )
    width = int(clusters.max(initial=0)) + 1
    out = np.zeros(n_groups, dtype=bool)
    out[(pairs[counts > 1] // width)] = True
    return out


def cluster_counts(n_clusters: int, n_resamples: int, seed: int) -> np.ndarray:
    """The score's one resample-index matrix: (n_resamples × n_clusters) draws of each cluster,
    seeded by (seed, :data:`CLUSTER_STREAM`); every per-model and breakdown interval reuses it."""
    return cluster_resample_counts(seeded_rng(seed, CLUSTER_STREAM), n_clusters, n_resamples)
