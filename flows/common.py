"""What every flow does before and around its stages: config, availability, endpoints."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from typing import Any, Iterator

from refusalbench.tasks.config import RunConfig
from refusalbench.tasks.errors import ModelUnavailable

log = logging.getLogger("refusalbench")


def content_digest(*parts: Any) -> str:
    """Hash of what a task reads but Prefect's cache key cannot see (file contents, templates)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def chunks(rows: list, size: int) -> list[list]:
    """Shards of ``size`` rows; one empty shard for no rows, so every stage still runs once."""
    return [rows[i : i + size] for i in range(0, len(rows), size)] or [[]]


def usable_models(cfg: RunConfig, names: list[str], *, probe: bool = True) -> list[str]:
    """Models of ``names`` that can run now. Fails fast (exit 2) unless skip_unavailable."""
    from refusalbench.tasks.local_models import check_available

    reasons = check_available(names, cfg.models, probe=probe, allow_pull=True)
    missing = {name: why for name, why in reasons.items() if why}
    if not missing:
        return list(names)
    detail = "; ".join(f"{name}: {why}" for name, why in missing.items())
    if not cfg.skip_unavailable:
        raise ModelUnavailable(f"{cfg.source or 'config'}: models: cannot run {detail} (set skip_unavailable: true to skip them)")
    log.warning("skipping unavailable models: %s", detail)
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
    local = [n for n in dict.fromkeys(names) if cfg.models[n].local is not None and not cfg.models[n].api_base]
    reused = {n: _ACTIVE_ENDPOINTS[n] for n in local if n in _ACTIVE_ENDPOINTS}
    missing = [n for n in local if n not in reused]
    if not missing:
        yield reused
        return
    from refusalbench.tasks.local_models import is_pulled, pull_model, start_server

    for name in missing:
        if not is_pulled(name, cfg.models[name].local):
            log.warning("pulling local model %s (first run only)", name)
            pull_model(name, cfg.models[name].local)
    server = start_server(cfg.models, missing)
    started = dict(server.api_bases)
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


def one_model_at_a_time(cfg: RunConfig, names: list[str]) -> bool:
    """True when several of ``names`` share our local llama.cpp server.

    That server keeps one model in memory and reloads weights whenever consecutive
    requests name different models (seconds each), so the flows then finish one model's
    tasks before starting the next instead of interleaving them.
    """
    return sum(1 for n in set(names) if cfg.models[n].local is not None and not cfg.models[n].api_base) > 1


def submit_per_model(task_fn, models: list[str], args_for, *, sequential: bool) -> dict[str, list]:
    """Submit ``task_fn`` for every model's argument tuples; optionally one model at a time."""
    futures: dict[str, list] = {}
    for model in models:
        futures[model] = [task_fn.submit(*args) for args in args_for(model)]
        if sequential:
            for future in futures[model]:
                future.wait()
    return futures


def configured(flow_fn, cfg: RunConfig, out: str):
    """The flow with the config's task runner and task results persisted in the run folder."""
    from refusalbench.tasks.prefect_runtime import result_storage, task_runner

    return flow_fn.with_options(task_runner=task_runner(cfg.runner), result_storage=result_storage(out))


__all__ = ["content_digest", "chunks", "usable_models", "model_endpoints", "check_or_raise", "configured", "one_model_at_a_time", "submit_per_model", "ModelUnavailable"]
