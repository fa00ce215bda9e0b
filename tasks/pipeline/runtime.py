"""How the project runs on Prefect: environment, task runner, caching, results, call accounting.

- Embedded mode: Prefect's background server (with its UI) on SQLite in the user's
  PREFECT_HOME (``prefect_server``), telemetry off, a generous server start-up timeout
  (2-core machines are slow to boot it).
- A bounded task runner (threads by default; Dask for task-level distribution).
- The cache policy: task inputs + task source. TASK_SOURCE only sees the task's own code,
  so the content hashes it misses (prompt templates, lever catalogue, input files) are
  passed to tasks as explicit inputs.
- Task results persist beside the run's artifacts (``<run>/_prefect``).
- Call accounting of a flow run (its own calls only, though the process ran others before),
  across processes when tasks ran on Dask workers.
- Plugins in every process that runs a task (``with_plugins``).
(What a run shows in the Prefect UI lives in ``tasks/pipeline/ui.py``.)
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from refusalbench.tasks.core.config import RunConfig

log = logging.getLogger("refusalbench")
T = TypeVar("T")

PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # A quiet terminal. Prefect's run loggers take this level too (INFO lines of
    # get_run_logger never leave the process), so the run's story for the UI's Logs tab
    # has its own logger straight to the API (ui.story), at INFO whatever this is.
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def configure_prefect_env(home: str | Path | None = None) -> None:
    """Set the embedded-mode environment. Call before Prefect is imported.

    Values already in the environment win, so a user pointing PREFECT_API_URL at a
    server (server mode) or choosing another PREFECT_HOME keeps that choice.
    """
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if home is not None:
        os.environ.setdefault("PREFECT_HOME", str(Path(home).resolve()))
    elif "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ:
        # One per user, not per working folder: every folder's commands share one server.
        from refusalbench.tasks.pipeline.server_state import embedded_home

        os.environ["PREFECT_HOME"] = str(embedded_home())


class CleanErrorFilter(logging.Filter):
    """Keeps off the terminal Prefect's record of a flow run that ended on an error the CLI says in one
    line (bad input, a run incomplete or stopped by its budget): its traceback would come before that
    line. The Prefect UI still gets the record, traceback included, through Prefect's API handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        from refusalbench.tasks.core.errors import InputError, ModelUnavailable, RunIncomplete

        error = record.exc_info[1] if record.exc_info else None
        return not (
            record.name.startswith("prefect") and isinstance(error, InputError | ModelUnavailable | RunIncomplete)
        )


def quiet_clean_errors() -> None:
    """Put :class:`CleanErrorFilter` on the terminal's Prefect handlers (once; Prefect set them up on import)."""
    for handler in logging.getLogger().handlers:
        if type(handler).__name__ == "PrefectConsoleHandler" and not any(
            isinstance(f, CleanErrorFilter) for f in handler.filters
        ):
            handler.addFilter(CleanErrorFilter())


def cache_policy() -> Any:
    from prefect.cache_policies import INPUTS, TASK_SOURCE

    return INPUTS + TASK_SOURCE


def task_runner(kind: str = "thread", max_workers: int | None = None) -> Any:
    """Threads by default (stages are I/O bound; LLM concurrency lives in the gateway)."""
    if kind == "dask":
        from prefect_dask.task_runners import DaskTaskRunner

        workers = int(os.environ.get("REFUSALBENCH_DASK_WORKERS", "2"))
        threads = max(2, -(-(max_workers or 0) // workers))  # the run's slots spread over the workers
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": threads, "processes": True})
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=max_workers or 8)


def with_plugins(fn: Callable[..., T]) -> Callable[..., T]:
    """A task body that first loads the plugins of the config it is given (its first argument), in the
    process it runs in: a Dask worker process never read the config file, so a provider profile or a
    retrieval strategy a plugin registers would be unknown there. Idempotent and cheap after the first
    task of a process (``tasks/core/plugins.py``). In a deployment's run, a batch job still running
    suspends the run instead of holding the process (``pipeline/batch_suspension.py``)."""
    from refusalbench.tasks.llm.batch_calls import BatchWaiting
    from refusalbench.tasks.pipeline.batch_suspension import suspend_for, wait_outside

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> T:
        config: RunConfig = args[0] if args else next(kwargs[k] for k in ("config", "cfg") if k in kwargs)
        config.load_plugins()
        wait_outside()
        try:
            return fn(*args, **kwargs)
        except BatchWaiting as waiting:  # raised only when waiting outside: this run is a deployment's
            suspend_for(config, waiting.jobs)

    return body


def result_storage(run_root: str) -> Any:
    """Task results are persisted inside the run folder (local or object storage).

    A local folder is given to Prefect as a path: Prefect keeps an unsaved local file system
    for it and records each result under its absolute path, which any process on the machine
    reads back. Object storage needs a block saved server-side (workers on other machines
    load it by id): one named after the run folder is saved, once per folder and API in a
    process, since a save costs three API round trips and ~0.1 s of block-schema work.
    """
    if "://" not in run_root or run_root.startswith("file://"):
        return Path(run_root.removeprefix("file://")).resolve() / "_prefect"
    import hashlib

    from prefect.filesystems import RemoteFileSystem
    from prefect.settings import PREFECT_API_URL

    from refusalbench.tasks.core.store import storage_options

    basepath = f"{run_root.rstrip('/')}/_prefect"
    key = (basepath, str(PREFECT_API_URL.value()))
    if key not in _SAVED_STORAGE:
        block = RemoteFileSystem(basepath=basepath, settings=storage_options(run_root))
        block.save("refusalbench-results-" + hashlib.sha256(basepath.encode()).hexdigest()[:16], overwrite=True)
        _SAVED_STORAGE[key] = block
    return _SAVED_STORAGE[key]


_SAVED_STORAGE: dict[tuple[str, str], Any] = {}


# ---------------------------------------------------------------- call accounting


def merge_call_stats(snapshots: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Sum per-model gateway counters (http_calls, tokens, cache_hits ...) of several processes."""
    merged: dict[str, dict[str, float]] = {}
    for snapshot in snapshots:
        for model, counters in snapshot.items():
            target = merged.setdefault(model, {})
            for name, amount in counters.items():
                target[name] = target.get(name, 0) + amount
    return merged


def _gateway_stats(config: RunConfig | dict[str, Any]) -> dict[str, dict[str, float]]:
    from refusalbench.tasks.llm.gateway import gateway_for

    return gateway_for(config).stats_snapshot()


def _gateway_stages(config: RunConfig | dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    from refusalbench.tasks.llm.gateway import gateway_for

    return gateway_for(config).stage_snapshot()


def _gateway_roles(config: RunConfig | dict[str, Any]) -> dict[str, dict[str, int]]:
    from refusalbench.tasks.llm.gateway import gateway_for

    return gateway_for(config).scope.role_stats()


def _gateway_fallbacks(config: RunConfig | dict[str, Any]) -> dict[str, str]:
    from refusalbench.tasks.llm.gateway import gateway_for

    return gateway_for(config).structured_output_fallbacks()


def _from_every_process(
    read: Callable[[RunConfig | dict[str, Any]], T], config: RunConfig | dict[str, Any], what: str
) -> list[T]:
    """``read(config)`` in this process and, with the Dask runner, in every worker process:
    gateways are per process, so a flow's calls may have gone through several."""
    found = [read(config)]
    client = _current_dask_client()
    if client is not None:
        try:
            found.extend(client.run(read, config).values())
        except Exception as exc:  # accounting must never fail a finished run
            log.warning("could not collect %s from Dask workers: %s", what, exc)
    return found


def run_structured_fallbacks(config: RunConfig | dict[str, Any]) -> dict[str, str]:
    """{model: mode} for every model whose structured-output mode was lowered in this process or
    (Dask runner) in a worker; the lowest mode wins where processes differ."""
    from refusalbench.tasks.llm.providers import MODES_BY_STRENGTH

    merged: dict[str, str] = {}
    for fallbacks in _from_every_process(_gateway_fallbacks, config, "structured-output fallbacks"):
        for model, mode in fallbacks.items():
            if model not in merged or MODES_BY_STRENGTH.index(mode) > MODES_BY_STRENGTH.index(merged[model]):
                merged[model] = mode
    return merged


def _current_dask_client() -> Any:
    """The Dask client of the running flow's DaskTaskRunner, if it has one."""
    try:
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
    except Exception:
        return None
    runner = getattr(context, "task_runner", None)
    if runner is None or type(runner).__name__ != "DaskTaskRunner":
        return None
    return getattr(runner, "_client", None)


def run_call_stats(config: RunConfig | dict[str, Any]) -> dict[str, dict[str, float]]:
    """Call accounting of a flow run.

    Gateways are per process: with the thread runner every call went through the flow
    process's gateway; with the Dask runner the calls were made in the worker processes,
    so their gateways' counters are collected too (``Client.run`` on every worker).
    """
    return merge_call_stats(_from_every_process(_gateway_stats, config, "call statistics"))


def run_role_stats(config: RunConfig | dict[str, Any]) -> dict[str, dict[str, float]]:
    """Calls per cache role (``tasks/llm/cache_scope.py``: calls, from_earlier_rounds), every process summed."""
    return merge_call_stats(_from_every_process(_gateway_roles, config, "calls by role"))


def run_stage_stats(config: RunConfig | dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Calls, tokens and cost per stage and model (``tasks/llm/accounting.py``), every process summed."""
    merged: dict[str, dict[str, dict[str, float]]] = {}
    for snapshot in _from_every_process(_gateway_stages, config, "costs by stage"):
        for stage, models in snapshot.items():
            merged[stage] = merge_call_stats([merged.get(stage, {}), models])
    return merged


def stage_stats_since(
    start: dict[str, dict[str, dict[str, float]]], now: dict[str, dict[str, dict[str, float]]]
) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`call_stats_since` for each stage; a stage with no change is left out."""
    since = {stage: call_stats_since(start.get(stage, {}), models) for stage, models in now.items()}
    return {stage: models for stage, models in since.items() if models}


def call_stats_since(
    start: dict[str, dict[str, float]], now: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """What the counters of ``now`` counted after the snapshot ``start``; a counter, or a model,
    that did not change in between is left out (as one never counted is)."""
    since: dict[str, dict[str, float]] = {}
    for model, counters in now.items():
        before = start.get(model, {})
        changed = {
            name: amount - before.get(name, 0) for name, amount in counters.items() if amount != before.get(name, 0)
        }
        if changed:
            since[model] = changed
    return since


class CallCounter:
    """The model calls of one flow run: the gateways' counters now less those at its start.

    A gateway's counters last as long as its process, and one process runs several flows
    (``run``: generate, then evaluate; ``refresh``: round after round; a deployment's
    worker): counted from zero, each manifest would also count the calls of the flows
    before it. Create it when the flow starts, before any call.
    """

    def __init__(self, config: RunConfig | dict[str, Any]):
        self.config = config
        self.at_start = run_call_stats(config)
        self.roles_at_start = run_role_stats(config)
        self.stages_at_start = run_stage_stats(config)

    def since_start(self) -> dict[str, dict[str, float]]:
        return call_stats_since(self.at_start, run_call_stats(self.config))

    def stages_since_start(self) -> dict[str, dict[str, dict[str, float]]]:
        """{stage: {model: counters}} of this run's calls: tokens and cost by the stage each call was for."""
        return stage_stats_since(self.stages_at_start, run_stage_stats(self.config))

    def costs(self) -> dict[str, Any]:
        """This run's costs as the manifest records them (``accounting.cost_summary``), with its budget."""
        from refusalbench.tasks.llm.accounting import cost_summary

        budget = getattr(self.config, "budget_usd", None)
        return {**cost_summary(self.stages_since_start()), **({"budget_usd": budget} if budget is not None else {})}

    def spent_usd(self) -> float:
        """What this run's priced calls cost so far (unpriced ones cannot count)."""
        return sum(c.get("cost_usd", 0.0) for models in self.stages_since_start().values() for c in models.values())

    def structured_output_fallbacks(self, stats: dict[str, dict[str, float]] | None = None) -> dict[str, str]:
        """The structured-output fallbacks in force for the models this run called (``stats``: its
        :meth:`since_start`); a fallback is remembered for the process, so one made by an earlier
        flow (``run``: the generation) holds for the models a later one calls."""
        called = set(stats if stats is not None else self.since_start())
        return {model: mode for model, mode in run_structured_fallbacks(self.config).items() if model in called}

    def record(self, recorder: Any) -> None:
        """Write this run's calls, costs and structured-output fallbacks into ``recorder``'s manifest, and
        its costs into the Prefect UI (the ``run-costs`` table)."""
        from refusalbench.tasks.pipeline.ui import publish_run_costs

        stats = self.since_start()
        recorder.calls(stats, self.structured_output_fallbacks(stats))
        costs = self.costs()
        recorder.costs(costs)
        publish_run_costs(costs)  # the run-costs table in the Prefect UI
        by_role = call_stats_since(self.roles_at_start, run_role_stats(self.config))
        if by_role:  # what each cache role asked, and how much of it earlier rounds' entries served
            recorder.count(calls_by_role={role: {name: int(n) for name, n in c.items()} for role, c in by_role.items()})
