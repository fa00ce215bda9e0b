"""Sharded stage tasks: how a model-calling stage fans out over models x shards and back.

Flow side (:class:`Fanout`): the stage's rows are written to input shards in the run
folder, each with a content digest of what its task reads but Prefect's cache key cannot
see; one task runs per (model, shard); the tasks' output shards are read back into
records. Task side: a task reads its input shard, runs its pure function through the
gateway with a progress display, and writes one output shard named after the model and
the input shard's index (names from ``runfolder``).

Stage tasks are module-level ``@task`` functions (``grep -rn "@task" tasks``) with the
signature ``(config, run_root, model, shard, content_hash, api_bases) -> output shard name``;
the fan-out gives them this run's result storage, so their results persist in the run
folder however the flow was started (CLI, deployment, serve).

What a person sees in the Prefect UI: each task run is named for its stage, model and
shard (``respond | answerer | shard 3/8``), and at its end it logs what the gateway did
for it (``64 calls (10 cached), 2 retried, 0 failed``) to the flow run's Logs tab.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pydantic import BaseModel

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.ui import Progress, stage_of_task, story, task_run_name

if TYPE_CHECKING:
    from refusalbench.tasks.pipeline.budget import Budget


def content_digest(*parts: Any) -> str:
    """Hash of what a task reads but Prefect's cache key cannot see (file contents, templates)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def chunks(rows: list, size: int) -> list[list]:
    """Shards of ``size`` rows; one empty shard for no rows, so every stage still runs once."""
    return [rows[i : i + size] for i in range(0, len(rows), size)] or [[]]


def one_model_at_a_time(cfg: RunConfig, names: Iterable[str]) -> bool:
    """True when several of ``names`` share our local llama.cpp server.

    That server keeps one model in memory and reloads weights whenever consecutive
    requests name different models (seconds each), so a stage then finishes one model's
    tasks before starting the next instead of interleaving them.
    """
    return sum(1 for n in set(names) if cfg.models[n].local is not None and not cfg.models[n].api_base) > 1


def shard_run_name(task_name: str, model: str, index: int, count: int) -> str:
    """What the Prefect UI calls one shard task: ``respond | answerer | shard 3/8`` (1-based).

    ASCII separators: the UI's run graph draws names in a font without ``·``.
    """
    return f"{task_name.removesuffix('-shard')} | {model} | shard {index + 1}/{count}"


# ---------------------------------------------------------------- flow side: the fan-out

@dataclass(frozen=True)
class Shard:
    """One task input: a shard's name in the run folder (or the upstream future that will
    return it) and the digest of the content the task will read."""

    name: Any
    digest: str
    rows: int | None = None  # how many rows it holds, where known before it is written (the budget's estimate)


@dataclass
class Fanout:
    """Fans a stage's tasks out over models x shards in one run folder and gathers them back."""

    cfg: RunConfig
    out: str
    api_bases: dict[str, str] = field(default_factory=dict)
    budget: "Budget | None" = None  # checked before each shard is sent (tasks/pipeline/budget.py)

    @cached_property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.out)

    @cached_property
    def _result_storage(self) -> Any:
        from refusalbench.tasks.pipeline.runtime import result_storage

        return result_storage(self.out)

    def write_shards(self, kind: str, rows: list, record_type: type[BaseModel], size: int,
                     digest: Callable[[list], str]) -> list[Shard]:
        """Write ``rows`` as ``_work/<kind>-NNNN.parquet`` shards; ``digest(chunk)`` per shard."""
        shards = []
        for index, chunk in enumerate(chunks(rows, size)):
            name = runfolder.input_shard(kind, index)
            self.store.write_records(name, chunk, record_type)
            shards.append(Shard(name, digest(chunk), len(chunk)))
        return shards

    def submit(self, task: Any, models: list[str], shards: list[Shard] | Callable[[str], list[Shard]], *,
               sharing: Iterable[str] | None = None) -> dict[str, list[Any]]:
        """One ``task`` per (model, shard) -> {model: futures}, in shard order.

        ``shards`` may depend on the model (e.g. a downstream stage's inputs are the
        upstream futures of that model). When the models in ``sharing`` (default:
        ``models``) share one local server, each model's tasks finish before the next starts.
        """
        stage = stage_of_task(task.name)
        task = task.with_options(result_storage=self._result_storage)
        inputs = {model: shards(model) if callable(shards) else shards for model in models}
        futures: dict[str, list[Any]] = {model: [] for model in models}

        def submit_one(model: str, index: int) -> Any:
            # Named per submission: the shard count is the fan-out's, not a task parameter.
            # The name is no part of the cache key (task inputs + source), so caching holds.
            name = shard_run_name(task.name, model, index, len(inputs[model]))
            named = task.with_options(task_run_name=name.replace("{", "{{").replace("}", "}}"))
            shard = inputs[model][index]
            if self.budget is None:
                return named.submit(self.task_config, self.out, model, shard.name, shard.digest, self.api_bases)
            rows = shard.rows if shard.rows is not None else self._shard_size
            estimate = self.budget.admit(stage, model, index, len(inputs[model]), rows, models)
            future = named.submit(self.task_config, self.out, model, shard.name, shard.digest, self.api_bases)
            self.budget.track(future, estimate)
            return future

        counts = sorted({len(v) for v in inputs.values()})
        story("%s: %d task(s), %d model(s) × %s shard(s)", task.name.removesuffix("-shard"),
              sum(map(len, inputs.values())), len(models), "/".join(map(str, counts)) or "0")
        if one_model_at_a_time(self.cfg, list(sharing) if sharing is not None else models):
            for model in models:
                futures[model] = [submit_one(model, index) for index in range(len(inputs[model]))]
                for future in futures[model]:
                    future.wait()
            return futures
        # Round robin over models: the runner's slots then hold every model's first shard
        # before anyone's second, so each model keeps its own concurrency busy instead of
        # the slots filling with one model's shards queued on that one model's limit.
        for index in range(max((len(v) for v in inputs.values()), default=0)):
            for model in models:
                if index < len(inputs[model]):
                    futures[model].append(submit_one(model, index))
        return futures

    @cached_property
    def task_config(self) -> RunConfig:
        """The config the tasks get: without ``budget_usd``, the flow's business, so a re-run with
        another budget finds the tasks it already ran in Prefect's task cache (whose key holds the inputs)."""
        return self.cfg if self.cfg.budget_usd is None else self.cfg.model_copy(update={"budget_usd": None})

    @property
    def _shard_size(self) -> int:
        """Rows of a shard not written yet (an upstream task's output): at most the configured shard size."""
        sections = (self.cfg.generation, self.cfg.evaluation, self.cfg.knowornot)
        return max((section.shard_size for section in sections if section is not None), default=1)

    def gather(self, futures: dict[str, list[Any]], record_type: type[BaseModel]) -> list:
        """The records of every output shard, model by model, in shard order."""
        return [row for model_futures in futures.values() for future in model_futures
                for row in self.store.read_records(future.result(), record_type)]


# ---------------------------------------------------------------- task side

class ShardCalls:
    """What the gateway did for one shard task: calls, cache hits, calls retried, calls failed.

    A call the gateway deduplicated shares its twin's outcome, so it counts as retried or
    failed with it (the manifest's ``calls`` counts HTTP attempts instead).
    """

    def __init__(self) -> None:
        self.calls = self.cached = self.retried = self.failed = 0
        self._lock = threading.Lock()

    def add(self, result: Any) -> None:
        with self._lock:
            self.calls += 1
            self.cached += bool(getattr(result, "cached", False))
            self.retried += getattr(result, "attempts", 0) > 1
            self.failed += getattr(result, "error", None) is not None

    def summary(self) -> str:
        cached = f" ({self.cached} cached)" if self.cached else ""
        return f"{self.calls} calls{cached}, {self.retried} retried, {self.failed} failed"


# The calls of each running shard task, by task run attempt, from its first progress
# callback to its output shard: a task's body needs no bookkeeping of its own.
_shard_calls: dict[Any, ShardCalls] = {}
_shard_calls_lock = threading.Lock()


def _attempt() -> Any:
    """This task run attempt (a retry starts afresh); outside a task run, this thread."""
    try:
        from prefect.context import TaskRunContext

        context = TaskRunContext.get()
    except Exception:
        context = None
    if context is None:
        return ("thread", threading.get_ident())
    return (context.task_run.id, context.task_run.run_count)


def write_output_shard(run_root: str, kind: str, model: str, input_name: str, rows: list[BaseModel],
                       record_type: type[BaseModel]) -> str:
    """Write a task's output shard; the shard's calls go to the run's Logs tab."""
    name = runfolder.output_shard(kind, model, runfolder.shard_index(input_name))
    ArtifactStore(run_root).write_records(name, rows, record_type)
    with _shard_calls_lock:
        calls = _shard_calls.pop(_attempt(), None) or ShardCalls()
    story("%s: %d rows, %s", task_run_name() or f"{kind} {model} {input_name}", len(rows), calls.summary(),
          level=logging.WARNING if calls.failed else logging.INFO)
    return name


def progress_callback(title: str, total: int) -> Callable[[Any], None]:
    """The gateway's per-call callback: the stage's progress display, and the shard's call tally."""
    progress = Progress(title, total)
    with _shard_calls_lock:
        calls = _shard_calls.setdefault(_attempt(), ShardCalls())

    def on_result(result: Any) -> None:
        calls.add(result)
        progress.advance()

    return on_result
