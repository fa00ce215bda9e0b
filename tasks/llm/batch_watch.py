"""Runs waiting for batch jobs: which jobs a run waits for, and whether it is time to let it go on.

A run that leaves its batch jobs to the provider (``batch_calls.BatchWaiting``) records them in the
call cache under ``batch-wait:<run id>``, beside the ledger's per-request entries. The batch watcher
(``pipeline/batch_suspension.py``) asks :func:`run_is_due` of each run that waits: true once every
job it waits for has ended (completed, failed, expired, cancelled, or unknown to the provider), or
once one of them is past its model's ``batch.max_wait_s`` (the run then cancels it and sends what it
did not answer synchronously). A look that fails (network, 5xx) says nothing: the job is looked at
again on the watcher's next turn.

No Prefect here: the run ids are strings, the jobs the ledger's entries.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.llm.callcache import CallCache
from refusalbench.tasks.llm.calls import CallSpec
from refusalbench.tasks.llm.gateway import Gateway, gateway_for

log = logging.getLogger("refusalbench.batch_watch")

WAIT_PREFIX = "batch-wait:"
_record_lock = threading.Lock()  # the tasks of one process record their jobs one at a time


def record_waiting(cache: CallCache, run_id: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``jobs`` to the jobs run ``run_id`` waits for (each job once); all of them."""
    with _record_lock:
        merged = list((cache.get(WAIT_PREFIX + run_id) or {}).get("jobs", []))
        for job in jobs:
            if all(known["job"] != job["job"] for known in merged):
                merged.append(job)
        cache.put(WAIT_PREFIX + run_id, {"jobs": merged})
    return list(merged)


def waiting_for(cache: CallCache, run_id: str) -> list[dict[str, Any]]:
    """The jobs run ``run_id`` recorded that it waits for (none: it recorded none)."""
    return list((cache.get(WAIT_PREFIX + run_id) or {}).get("jobs", []))


def deadline(job: dict[str, Any], cfg: RunConfig) -> float:
    """When a job's wait runs out: its creation plus its model's ``batch.max_wait_s``."""
    model = cfg.models.get(job.get("model", ""))
    wait = model.batch.max_wait_s if model is not None else 0.0
    return float(job.get("created_at") or 0.0) + wait


def is_due(jobs: list[dict[str, Any]], ended: set[str], deadlines: dict[str, float], now: float) -> bool:
    """Whether a run waiting for ``jobs`` goes on: all ended, or one past its deadline (no jobs: go on)."""
    return all(job["job"] in ended for job in jobs) or any(
        now >= deadlines.get(job["job"], 0.0) for job in jobs if job["job"] not in ended
    )


async def ended_jobs(gateway: Gateway, jobs: list[dict[str, Any]]) -> set[str]:
    """The ids of ``jobs`` that have ended, each looked at once through its model's batch protocol."""

    async def ended(job: dict[str, Any]) -> bool:
        model = job.get("model", "")
        cfg = gateway.models.get(model)
        kind = gateway.profile(model, cfg).batch_protocol if cfg is not None else None
        if cfg is None or kind is None:
            return True  # nothing to look with: the run's own look decides
        # The endpoint and key the run's requests used: what the gateway sends for this model now.
        protocol = kind(cfg, gateway.request(CallSpec(model=model, messages=[{"role": "user", "content": "-"}]), cfg))
        try:
            return (await protocol.look(job["job"])).finished
        except Exception as exc:  # the provider does not know it: nothing will come; else look again later
            log.warning("%s: looking at batch %s failed: %s", model, job["job"], exc)
            return protocol.unknown_job(exc)

    looked = await asyncio.gather(*(ended(job) for job in jobs))
    return {job["job"] for job, done in zip(jobs, looked) if done}


def run_is_due(cfg: RunConfig, run_id: str, now: float | None = None) -> bool:
    """Whether run ``run_id`` of config ``cfg`` may go on: every batch job it waits for ended, or past its wait."""
    gateway = gateway_for(cfg)
    jobs = waiting_for(gateway.cache, run_id)
    if not jobs:
        return True  # it recorded no job: its own look decides
    ended = asyncio.run(ended_jobs(gateway, jobs))
    now = time.time() if now is None else now
    return is_due(jobs, ended, {job["job"]: deadline(job, cfg) for job in jobs}, now)


def wait_left(cfg: RunConfig, jobs: list[dict[str, Any]], now: float | None = None) -> float:
    """Seconds until the last of ``jobs`` is past its wait (0 if all are)."""
    now = time.time() if now is None else now
    return max([0.0, *(deadline(job, cfg) - now for job in jobs)])
