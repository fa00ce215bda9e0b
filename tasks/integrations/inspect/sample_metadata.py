"""Where a RefusalBench sample keeps its data inside inspect_ai: the keys both sides agree on.

The task (``task.py``, through ``bridge``) writes the benchmark item into each Sample's
metadata under :data:`ITEM_KEY` and the whole judgment into its Score's metadata under
:data:`SCORE_KEY`; ``logs`` reads them back. Light: no inspect_ai, no prompt or judge module.
"""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

SCORE_KEY = "refusalbench"  # Score.metadata[SCORE_KEY] = {"judgment": ..., "variant": ..., "response_error": ...}
ITEM_KEY = "item"  # Sample.metadata[ITEM_KEY] = the BenchmarkItem


def item_of(metadata: dict[str, Any] | None) -> BenchmarkItem:
    """The benchmark item a Sample's metadata carries."""
    return BenchmarkItem.model_validate((metadata or {})[ITEM_KEY])
