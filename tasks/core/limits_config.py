"""Where a model's ``max_concurrency``, ``rpm`` and ``tpm`` are counted: the ``limits:`` section.

In one process (the embedded default) the gateway counts them itself. Where many flow runs,
processes or workers call one model (server mode, ``runner: dask``), they count them together
in Redis (``tasks/llm/shared_limits.py``), so the provider sees the limits a config states
however many runs share it. ``backend: auto`` (the default) counts in Redis exactly when the
call cache is already shared there (``cache.backend: redis``), at ``cache.url``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from refusalbench.tasks.core.envexpand import expand_references


class LimitsConfig(BaseModel):
    """The ``limits:`` section of a run config."""

    model_config = ConfigDict(extra="forbid")  # as every config section: a typo is an error

    backend: Literal["auto", "process", "redis"] = Field(
        default="auto",
        description="process: each process counts its own calls; redis: all processes that share "
        "a model count together (at url); auto: redis when cache.backend is redis",
    )
    url: str | None = Field(
        default=None,
        description="redis://host:port/db holding the shared counts (default: "
        "cache.url; ${NAME:-default} is read from the environment)",
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        description="a slot held by a process that died is free again after "
        "at most this long (a living process renews its slots)",
    )

    _expand_url = field_validator("url")(expand_references)

    def shared_url(self, cache_backend: str, cache_url: str | None) -> str | None:
        """The Redis URL where limits are counted across processes; None: each process counts its own."""
        if self.backend == "process":
            return None
        if self.backend == "redis":
            return self.url or cache_url
        return self.url or (cache_url if cache_backend == "redis" else None)
