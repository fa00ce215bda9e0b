"""Seconds per call ``plan`` assumes for each model: measured, from the registry, or the default.

A local model (llama.cpp, served by the run itself) answers one request at a time on the machine's
cores, so a flat 2 s per call says nothing about it: a 135M model replies in a second or two where a
1.5B one takes tens of seconds. Its figure comes, in this order, from:

1. measured: the mean latency of its past calls in the call cache (the mean, since the time bound
   is calls x seconds per call) (the llama.cpp server answers as
   the model's alias, which the cache records as ``served_model``), once there are enough of them;
2. registry: its ``local.seconds_per_call`` (measured on a 2-core machine, ``configs/models.yaml``);
3. assumed: the ``--latency`` given to ``plan`` (2 s by default), as for every API model, whose
   latency depends on the provider's load rather than on this machine.
"""

from __future__ import annotations

import sqlite3
import statistics
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from refusalbench.tasks.core.config import ModelConfig, RunConfig
from refusalbench.tasks.llm.callcache import default_cache_dir

# Fewer past calls than this say more about one prompt than about the model.
MIN_MEASURED_CALLS = 3


@dataclass(frozen=True)
class Latency:
    """One model's seconds per call and where the figure comes from."""

    seconds: float
    source: str  # measured | registry | assumed
    calls: int = 0  # measured: how many past calls the mean is of


def is_local(cfg: ModelConfig) -> bool:
    """A GGUF model the run serves itself with llama.cpp (no ``api_base`` of its own)."""
    return cfg.local is not None and not cfg.api_base


def cache_file(cfg: RunConfig) -> Path | None:
    """The config's SQLite call cache, if it uses one and it exists."""
    if cfg.cache.backend != "sqlite":
        return None
    path = Path(cfg.cache.path).expanduser() if cfg.cache.path else default_cache_dir() / "calls.sqlite"
    return path if path.is_file() else None


def past_latencies(path: Path, aliases: Collection[str]) -> dict[str, list[float]]:
    """Latencies of the cached calls answered under each alias; {} when the cache cannot be read."""
    if not aliases:
        return {}
    marks = ",".join("?" * len(aliases))
    query = (
        "SELECT json_extract(value, '$.served_model'), json_extract(value, '$.latency_s') FROM calls "
        f"WHERE json_extract(value, '$.served_model') IN ({marks})"
    )
    found: dict[str, list[float]] = {}
    try:
        # Read-only: planning never creates or locks a cache a run may be writing.
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            for alias, seconds in conn.execute(query, list(aliases)):
                if isinstance(seconds, (int, float)) and seconds > 0:
                    found.setdefault(alias, []).append(float(seconds))
    except sqlite3.Error:
        return {}
    return found


def model_latencies(cfg: RunConfig, names: Collection[str], default_s: float) -> dict[str, Latency]:
    """Each model's :class:`Latency` (see the module doc)."""
    local = {name: cfg.models[name] for name in names if is_local(cfg.models[name])}
    aliases = {name: (m.local.alias if m.local and m.local.alias else name) for name, m in local.items()}
    path = cache_file(cfg)
    measured = past_latencies(path, set(aliases.values())) if path is not None else {}
    out: dict[str, Latency] = {}
    for name in names:
        seen = measured.get(aliases.get(name, ""), []) if name in local else []
        spec = cfg.models[name].local if name in local else None
        if len(seen) >= MIN_MEASURED_CALLS:
            out[name] = Latency(round(statistics.fmean(seen), 3), "measured", len(seen))
        elif spec is not None and spec.seconds_per_call is not None:
            out[name] = Latency(spec.seconds_per_call, "registry")
        else:
            out[name] = Latency(default_s, "assumed")
    return out


def latency_note(latencies: dict[str, Latency], default_s: float) -> str | None:
    """One line: which models' time bound rests on which figure."""
    parts = []
    for source, label in (
        ("measured", "measured (mean of past calls in the call cache)"),
        ("registry", "the registry's local.seconds_per_call"),
    ):
        names = sorted(n for n, lat in latencies.items() if lat.source == source)
        if names:
            parts.append(f"{label}: " + ", ".join(f"{n} {latencies[n].seconds:g} s" for n in names))
    assumed = sorted(n for n, lat in latencies.items() if lat.source == "assumed")
    if assumed:
        parts.append(f"assumed {default_s:g} s (--latency): {', '.join(assumed)}")
    return "seconds per call: " + "; ".join(parts) if parts else None
