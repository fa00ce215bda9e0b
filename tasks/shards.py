"""The plumbing every model-calling stage task shares.

A stage task reads one input shard from the run folder, runs its pure function through
the gateway with a progress display, and writes one output shard named after the model
and the input shard's index. ``model_task`` builds the Prefect task with the project's
cache policy (inputs + task source, ignoring the run-time endpoints) and one retry.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import BaseModel


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def shard_name(kind: str, model: str, index: int) -> str:
    return f"_work/{kind}/{_safe(model)}-{index:04d}.parquet"


def shard_index(name: str) -> int:
    """'_work/items-0007.parquet' -> 7."""
    return int(name.rsplit("-", 1)[-1].split(".")[0])


def write_output_shard(run_root: str, kind: str, model: str, input_name: str, rows: list[BaseModel],
                       record_type: type[BaseModel]) -> str:
    from refusalbench.tasks.store import ArtifactStore

    name = shard_name(kind, model, shard_index(input_name))
    ArtifactStore(run_root).write_records(name, rows, record_type)
    return name


def progress_callback(title: str, total: int) -> Callable[[Any], None]:
    from refusalbench.tasks.ui_artifacts import Progress

    progress = Progress(title, total)
    return lambda _result: progress.advance()


def model_task(fn: Callable[..., str], name: str, run_name: str, run_root: str | None = None) -> Any:
    """The Prefect task for a stage function (built lazily: importing a stage needs no Prefect).

    Failed model calls come back as recorded errors, not exceptions, so the one task retry
    only repeats work after an infrastructure fault, and finished calls come from the cache.
    With ``run_root`` the task's results persist in that run folder however the flow was
    started (CLI, deployment, serve).
    """
    from prefect import task

    from refusalbench.tasks.prefect_runtime import cache_policy, result_storage

    options: dict[str, Any] = {}
    if run_root is not None:
        options["result_storage"] = result_storage(run_root)
    return task(fn, name=name, task_run_name=run_name, cache_policy=cache_policy() - "api_bases", retries=1,
                retry_delay_seconds=2, **options)
