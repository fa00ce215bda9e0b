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

Batch mode (a model's ``mode: batch`` for the stage): the model's shards of the stage go to one
task (``respond | answerer | batch of 8 shards``), which reads them all, so the gateway sends
them as one batch job instead of one per shard. In a deployment's run, a job still running
suspends the run instead (``pipeline/batch_suspension.py``). Elsewhere that task holds one
task-runner thread while the gateway polls on its own event loop: no model concurrency or rate-limit slot (the gateway frees
them while it waits) and no Prefect global-concurrency slot (no task here takes one); a thread
costs no core, and ``flows/common.runner_slots`` gives every model four, more than the tasks one
model has in batch mode at once (respond, judge, calibrate and its judge).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from prefect.utilities.annotations import quote
from pydantic import BaseModel

from refusalbench.tasks.core import clocks, runfolder
from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.registry import Registry
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.plan_prices import sends_batches
from refusalbench.tasks.pipeline.ui import Progress, stage_of_task, story, task_run_name

if TYPE_CHECKING:
    from refusalbench.tasks.llm.gateway import Gateway
    from refusalbench.tasks.pipeline.budget import Budget


def task_parameter(cfg: RunConfig) -> Any:
    """The config as a task's parameter: ``quote``d, so Prefect does not walk it looking for futures (it holds
    none), which it did twice per task, field by field, as the task started: at 30 targets a third of the
    process's time before a stage's first calls. The task still gets the config itself, and its cache key,
    computed after Prefect unwraps it, is the same. Not under Dask: ``prefect_dask`` walks the parameters
    itself to swap futures and hands a ``quote`` on as a plain tuple."""
    return cfg if cfg.runner == "dask" else quote(cfg)


def content_digest(*parts: Any) -> str:
    """Hash of what a task reads but Prefect's cache key cannot see (file contents, templates)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


T = TypeVar("T")


def chunks(rows: list[T], size: int) -> list[list[T]]:
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


# The models whose calls one task makes, by task name, given the config and the model the task is
# fanned out for (the judge's tasks are fanned out over targets); registered beside the tasks.
BATCH_CALLERS: Registry[Callable[[RunConfig, str], list[str]]] = Registry("shard task's calling models")


def batch_task(cfg: RunConfig, task_name: str, model: str) -> bool:
    """Whether a task of ``task_name`` for ``model`` sends its stage's calls through the batch API."""
    callers = BATCH_CALLERS.get(task_name)
    stage = stage_of_task(task_name)
    return callers is not None and any(
        sends_batches(cfg.models[m], stage) for m in callers(cfg, model) if m in cfg.models
    )


# ---------------------------------------------------------------- flow side: the fan-out

# A stage's default shards (no ``shard_size`` in the config): at most this many tasks per model ...
TASKS_PER_MODEL = 4
# ... each at least this many rounds of its model's max_concurrency long.
ROUNDS_PER_SHARD = 8


@dataclass(frozen=True)
class Shard:
    """One task input: a shard's name in the run folder (or the upstream future that will
    return it) and the digest of the content the task will read."""

    name: Any  # a list of them: a batch-mode model's shards of a stage, read by one task (``whole``)
    digest: str
    rows: int | None = None  # how many rows it holds, where known before it is written (the budget's estimate)


def whole(shards: list[Shard]) -> list[Shard]:
    """A stage's shards as one task input (a batch-mode model's): the task reads them all, in order."""
    if len(shards) <= 1:
        return shards  # one shard: the same task input (and cache key) as in synchronous mode
    rows = None if any(s.rows is None for s in shards) else sum(s.rows for s in shards if s.rows is not None)
    return [Shard([s.name for s in shards], content_digest([s.digest for s in shards]), rows)]


@dataclass
class Fanout:
    """Fans a stage's tasks out over models x shards in one run folder and gathers them back."""

    cfg: RunConfig
    out: str
    api_bases: dict[str, str] = field(default_factory=dict)
    budget: Budget | None = None  # checked before each shard is sent (tasks/pipeline/budget.py)
    _given: dict[tuple[str, str], list[Shard]] = field(default_factory=dict)  # (task, model) -> its task inputs
    _sizes: list[int] = field(default_factory=list)  # the shard sizes :meth:`shard_size` chose

    @cached_property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.out)

    @cached_property
    def _result_storage(self) -> Any:
        from refusalbench.tasks.pipeline.runtime import result_storage

        return result_storage(self.out)

    def write_shards(
        self, kind: str, rows: list[Any], record_type: type[BaseModel], size: int, digest: Callable[[list[Any]], str]
    ) -> list[Shard]:
        """Write ``rows`` as ``_work/<kind>-NNNN.parquet`` shards; ``digest(chunk)`` per shard."""
        shards = []
        for index, chunk in enumerate(chunks(rows, size)):
            name = runfolder.input_shard(kind, index)
            self.store.write_records(name, chunk, record_type)
            shards.append(Shard(name, digest(chunk), len(chunk)))
        return shards

    def submit(
        self,
        task: Any,
        models: list[str],
        shards: list[Shard] | Callable[[str], list[Shard]],
        *,
        sharing: Iterable[str] | None = None,
    ) -> dict[str, list[Any]]:
        """One ``task`` per (model, shard) -> {model: futures}, in shard order.

        ``shards`` may depend on the model (e.g. a downstream stage's inputs are the
        upstream futures of that model). When the models in ``sharing`` (default:
        ``models``) share one local server, each model's tasks finish before the next starts.
        """
        stage = stage_of_task(task.name)
        task = task.with_options(result_storage=self._result_storage)
        inputs = {model: shards(model) if callable(shards) else shards for model in models}
        # A batch-mode model's shards go to one task: one batch job carries the stage's calls.
        inputs = {
            model: whole(given) if batch_task(self.cfg, task.name, model) else given for model, given in inputs.items()
        }
        self._given.update({(task.name, model): given for model, given in inputs.items()})
        futures: dict[str, list[Any]] = {model: [] for model in models}
        config = task_parameter(self.task_config)

        def submit_one(model: str, index: int) -> Any:
            # Named per submission: the shard count is the fan-out's, not a task parameter.
            # The name is no part of the cache key (task inputs + source), so caching holds.
            shard = inputs[model][index]
            name = shard_run_name(task.name, model, index, len(inputs[model]))
            if isinstance(shard.name, list):
                name = f"{name.rsplit(' | ', 1)[0]} | batch of {len(shard.name)} shards"
            named = task.with_options(task_run_name=name.replace("{", "{{").replace("}", "}}"))
            if self.budget is None:
                return named.submit(config, self.out, model, shard.name, shard.digest, self.api_bases)
            parts = len(shard.name) if isinstance(shard.name, list) else 1
            rows = shard.rows if shard.rows is not None else self._shard_size * parts
            estimate = self.budget.admit(stage, model, index, len(inputs[model]), rows, models)
            future = named.submit(config, self.out, model, shard.name, shard.digest, self.api_bases)
            self.budget.track(future, estimate)
            return future

        counts = sorted({len(v) for v in inputs.values()})
        story(
            "%s: %d task(s), %d model(s) × %s shard(s)",
            task.name.removesuffix("-shard"),
            sum(map(len, inputs.values())),
            len(models),
            "/".join(map(str, counts)) or "0",
        )
        # The task runner copies this context into each task's thread: the tasks' clocks
        # (their Parquet reads and writes, their bodies) count under the stage's name.
        with clocks.clock_scope(stage), clocks.timed("submit"):
            return self._submit_all(models, inputs, futures, spanned(f"{stage}/task_span", submit_one), sharing)

    def _submit_all(
        self,
        models: list[str],
        inputs: dict[str, list[Shard]],
        futures: dict[str, list[Any]],
        submit_one: Callable[[str, int], Any],
        sharing: Iterable[str] | None,
    ) -> dict[str, list[Any]]:
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

    def first_calls(self, models: Sequence[str]) -> FirstCalls | None:
        """A :class:`FirstCalls` of ``models`` on the gateway the tasks use, where they run in this process
        (the thread runner); None where they run elsewhere (Dask workers: their calls are counted there)."""
        if self.cfg.runner != "thread":
            return None
        from refusalbench.tasks.llm.gateway import gateway_for  # here: importing the fan-out loads no gateway

        return FirstCalls(gateway_for(self.task_config, self.api_bases), models)

    def inputs_of(self, task: Any, model: str) -> list[Shard]:
        """The inputs ``model``'s tasks of ``task`` were given, one per future :meth:`submit` returned
        (one, when the model is in batch mode for the stage): a downstream stage pairs its shards with them."""
        return self._given[(task.name, model)]

    @cached_property
    def task_config(self) -> RunConfig:
        """The config the tasks get: without ``budget_usd``, the flow's business, so a re-run with
        another budget finds the tasks it already ran in Prefect's task cache (whose key holds the inputs)."""
        return self.cfg if self.cfg.budget_usd is None else self.cfg.model_copy(update={"budget_usd": None})

    @property
    def _shard_size(self) -> int:
        """Rows of a shard not written yet (an upstream task's output): at most the largest shard size
        configured or chosen (:meth:`shard_size`) in this run."""
        sections = (self.cfg.generation, self.cfg.evaluation, self.cfg.knowornot)
        return max([*(section.shard_size for section in sections if section is not None), *self._sizes], default=1)

    def shard_size(self, section: Any, rows: int, models: Iterable[str]) -> int:
        """Rows per shard of a stage over ``rows`` rows that ``models`` work on.

        The config's ``shard_size`` where the config sets one. By default, the rows split evenly
        into as many shards as hold ``ROUNDS_PER_SHARD`` rounds of the models' ``max_concurrency``
        each, at most ``TASKS_PER_MODEL`` (the runner's slots per model: ``flows/common.runner_slots``,
        so none waits for a slot), at least one; never fewer rows than the section's default. The
        count rounds down: 180 rows at 16 make one shard of 180, not one of 128 and a remainder of
        52 whose task costs as much to start as a full one. The stage's Prefect tasks then number
        with its models, not with its items: each task costs Prefect's engine (states, cache key,
        result file), a progress display and a shard file each way, all before its first call.
        """
        if "shard_size" in section.model_fields_set:
            configured: int = section.shard_size
            return configured
        concurrency = max((self.cfg.models[m].max_concurrency for m in models if m in self.cfg.models), default=1)
        per_shard = ROUNDS_PER_SHARD * concurrency
        shards = min(TASKS_PER_MODEL, max(1, rows // per_shard))
        size: int = max(section.shard_size, per_shard, -(-rows // shards))
        self._sizes.append(size)
        return size

    def gather(self, futures: dict[str, list[Any]], record_type: type[BaseModel]) -> list[Any]:
        """The records of every output shard, model by model, in shard order."""
        rows: list[Any] = []
        for model_futures in futures.values():
            for future in model_futures:
                with clocks.timed("gather_wait"):  # the flow waits for the task (its calls, its Prefect states)
                    name = future.result()
                rows.extend(self.store.read_records(name, record_type))
        return rows


# How long a downstream stage's submission waits for the upstream tasks' first calls at most, and how
# often it looks: past the wait it goes ahead (a model held by a rate limit, a shared limit or a batch job
# sends nothing for a while, and its downstream tasks would only wait for it anyway).
FIRST_CALLS_WAIT_S = 10.0
FIRST_CALLS_POLL_S = 0.01


class FirstCalls:
    """Whether every one of ``models`` has had a call started in this process's gateway since it was made.

    Made before a stage's tasks are submitted, :meth:`wait` holds the flow until each model's first calls
    are under way, one of the stage's tasks is done (a cached re-run sends nothing), or the wait is over.
    Submitting the next stage's tasks meanwhile would start their Prefect engines on the same interpreter
    while the gateway's loop is still sending every model's first wave: at 30 targets that put the last
    target's first request 0.3 s later, and the whole stage with it (``benchmarks/RESULTS.md``).
    """

    def __init__(self, gateway: Gateway, models: Sequence[str]):
        self.gateway, self.models = gateway, list(dict.fromkeys(models))
        self.before = self._counted()

    def _counted(self) -> dict[str, float]:
        """Everything the gateway has counted of each model so far (calls sent, cache hits, prompts too long...)."""
        counters = self.gateway.stats_snapshot()
        return {model: sum(counters.get(model, {}).values()) for model in self.models}

    def started(self) -> bool:
        now = self._counted()
        return all(now[model] > self.before[model] for model in self.models)

    def wait(self, any_done: Callable[[], bool], timeout_s: float = FIRST_CALLS_WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not any_done() and not self.started() and time.monotonic() < deadline:
            time.sleep(FIRST_CALLS_POLL_S)


def spanned(clock: str, submit: Callable[[str, int], Any]) -> Callable[[str, int], Any]:
    """``submit``, each future's time from submission to done on ``clock``: the task's body, what
    Prefect does around it, and its wait for a runner slot or an upstream task."""

    def submit_one(model: str, index: int) -> Any:
        submitted = time.perf_counter()
        future = submit(model, index)
        future.add_done_callback(lambda _: clocks.add(clock, time.perf_counter() - submitted))
        return future

    return submit_one


# ---------------------------------------------------------------- task side


def timed_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A shard task's body on the ``task_body`` clock (under its stage, from the fan-out's
    scope): the task's own time, apart from what Prefect does around it."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        with clocks.timed("task_body"):
            return fn(*args, **kwargs)

    return body


class ShardCalls:
    """What the gateway did for one shard task: calls, cache hits, calls retried, calls failed.

    A call the gateway deduplicated shares its twin's outcome, so it counts as cached (its
    twin's reply served it), and as retried or failed with it (the manifest's ``calls``
    counts HTTP attempts instead).
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


def read_input(run_root: str, input_name: str | list[str], record_type: type[BaseModel]) -> list[Any]:
    """A task's input rows: its shard's, or (a batch-mode model's task) its shards' in order."""
    store = ArtifactStore(run_root)
    names = [input_name] if isinstance(input_name, str) else input_name
    return [row for name in names for row in store.read_records(name, record_type)]


# Run-folder files every task of a stage reads (the benchmark for each judge task): parsed once per
# process while the file is unchanged, by (path, mtime, size); only the latest version is kept.
_read_once: dict[tuple[str, str], tuple[tuple[int, int], Any]] = {}
_read_once_lock = threading.Lock()


def read_shared(run_root: str, artifact: runfolder.Artifact) -> Any:
    """A declared artifact as ``store.load`` returns it, read once per process while its local file is
    unchanged (a 30-target run has over a hundred judge tasks, each needing the whole benchmark:
    ~30 ms of CPU per parse of 720 items). Callers must not change what it returns."""
    store = ArtifactStore(run_root)
    if not store.is_local:
        return store.load(artifact)
    path = store.path(artifact.name)
    with _read_once_lock:  # one parse, however many tasks start at once
        stat = os.stat(path)
        version = (stat.st_mtime_ns, stat.st_size)
        known = _read_once.get((path, artifact.name))
        if known is None or known[0] != version:
            known = _read_once[(path, artifact.name)] = (version, store.load(artifact))
        return known[1]


def write_output_shard(
    run_root: str,
    kind: str,
    model: str,
    input_name: str | list[str],
    rows: Sequence[BaseModel],
    record_type: type[BaseModel],
) -> str:
    """Write a task's output shard (named after its first input shard); its calls go to the run's Logs tab."""
    first = input_name if isinstance(input_name, str) else input_name[0]
    name = runfolder.output_shard(kind, model, runfolder.shard_index(first))
    # A list of the stage's own record type is not a list[BaseModel] to the type checker: copy the references.
    ArtifactStore(run_root).write_records(name, list(rows), record_type)
    with _shard_calls_lock:
        calls = _shard_calls.pop(_attempt(), None) or ShardCalls()
    story(
        "%s: %d rows, %s",
        task_run_name() or f"{kind} {model} {input_name}",
        len(rows),
        calls.summary(),
        level=logging.WARNING if calls.failed else logging.INFO,
    )
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
