"""What the dataset importers share: reproducible seeded sampling, text and id normalisation."""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any


def stable_rng(seed: int, *parts: str) -> random.Random:
    """A Random seeded from (seed, parts) through SHA-256, identical across processes and Python builds."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def seeded_subset(indices: list[int], k: int | None, rng: random.Random) -> list[int]:
    """k of the indices without replacement (all when k is None or too large), kept in input order."""
    if k is None or k >= len(indices):
        return list(indices)
    return sorted(rng.sample(indices, k))


def squash_spaces(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def id_text(value: Any) -> str | None:
    """Dataset ids arrive as strings or integers; both become strings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (str, int)) and str(value).strip():
        return str(value)
    return None
