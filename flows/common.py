"""What every flow does before and around its stages: availability, endpoints, runner and storage."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import ModelUnavailable
from refusalbench.tasks.llm.local_models import check_available, is_pulled, pull_model, start_server
from refusalbench.tasks.pipeline import gc_tuning
from refusalbench.tasks.pipeline.prefect_server import wait_until_ready
from refusalbench.tasks.pipeline.runtime import result_storage, task_runner
from refusalbench.tasks.pipeline.ui import story

if TYPE_CHECKING:
    from prefect import Flow

P = ParamSpec("P")
R = TypeVar("R")


def usable_models(cfg: RunConfig, names: list[str], *, probe: bool = True) -> list[str]:
    """Models of ``names`` that can run now. Fails fast (exit 2) unless skip_unavailable."""
    reasons = check_available(names, cfg.models, probe=probe, allow_pull=True)
    missing = {name: why for name, why in reasons.items() if why}
    if not missing:
        return list(names)
    detail = "; ".join(f"{name}: {why}" for name, why in missing.items())
    if not cfg.skip_unavailable:
        raise ModelUnavailable(
            f"{cfg.source or 'config'}: models: cannot run {detail} (set skip_unavailable: true to skip them)"
        )
    story("skipping unavailable models: %s", detail, level=logging.WARNING, terminal=True)
    return [n for n in names if n not in missing]


# Local servers already running in this process (e.g. started by the main job for both
# of its sub-flows): registry name -> api_base.
_ACTIVE_ENDPOINTS: dict[str, str] = {}


@contextlib.contextmanager
def model_endpoints(cfg: RunConfig, names: list[str]) -> Iterator[dict[str, str]]:
    """Start llama.cpp for the local models among ``names`` that have no api_base.

    Yields {registry name: api_base}; models an enclosing call already serves are reused.
    The servers this call started are stopped on exit.
    """
    local = {
        n: spec
        for n in dict.fromkeys(names)
        if (spec := cfg.models[n].local) is not None and not cfg.models[n].api_base
    }
    reused = {n: _ACTIVE_ENDPOINTS[n] for n in local if n in _ACTIVE_ENDPOINTS}
    missing = [n for n in local if n not in reused]
    if not missing:
        yield reused
        return
    for name in missing:
        if not is_pulled(name, local[name]):
            story("pulling local model %s (first run only)", name, level=logging.WARNING, terminal=True)
            pull_model(name, local[name])
            story("pulled local model %s", name)
    server = start_server(cfg.models, missing)
    started = dict(server.api_bases)
    story("llama.cpp serves %s", ", ".join(f"{name} at {base}" for name, base in started.items()))
    _ACTIVE_ENDPOINTS.update(started)
    try:
        yield {**reused, **started}
    finally:
        for name in started:
            _ACTIVE_ENDPOINTS.pop(name, None)
        server.stop()


def check_or_raise(cfg: RunConfig, names: list[str]) -> list[str]:
    usable = usable_models(cfg, names)
    if not usable:
        raise ModelUnavailable(f"{cfg.source or 'config'}: models: none of {', '.join(names)} can run")
    return usable


def runner_slots(cfg: RunConfig) -> int:
    """Task-runner slots for a run: four shard tasks in flight per model the config uses.

    A shard task mostly waits on the gateway's event loop, so a slot costs a thread, not a
    core. With fewer slots than models, the slots fill with a few models' shards while the
    other models sit idle (30 targets on 8 slots kept ~40 calls in flight instead of 30 x 16).
    Two per model are not enough either: a judge task holds its slot while it waits for its
    respond task, and the runner's queue is first come, first served, so with every respond
    task queued first the judge got its first slots only as the respond stage ended (30
    targets: the judge, the run's bottleneck, idled for the first ~25 s of the stage).
    """
    return max(8, min(256, 4 * len(cfg.used_models())))


def configured(flow_fn: Flow[P, R], cfg: RunConfig, out: str) -> Flow[P, R]:
    """The flow with the config's task runner and task results persisted in the run folder
    (saved through the API: it waits here for an API server ``launch`` started to answer)."""
    wait_until_ready()
    gc_tuning.flow_starts()
    return flow_fn.with_options(
        task_runner=task_runner(cfg.runner, max_workers=runner_slots(cfg)), result_storage=result_storage(out)
    )


__all__ = [
    "usable_models",
    "model_endpoints",
    "check_or_raise",
    "configured",
]
