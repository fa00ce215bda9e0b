"""Batch jobs waited for outside the process: a deployment's run suspends while they run, the watcher resumes it.

A provider's batch job may take up to a day. A flow run of a deployment does not wait for it in its
process: the task whose calls went into the job records the job (the ledger in the call cache, and
the run's ``batch-wait:<run id>`` entry, ``llm/batch_watch.py``), then suspends the deployment's
flow run (Prefect's ``suspend_flow_run``, with a timeout past the jobs' ``batch.max_wait_s``). The
process exits; the worker, and the deployment's concurrency slot (released as the run leaves
Running), are free for other runs meanwhile.

The batch watcher (``flows/batch_watch.py``, a deployment on a short interval served beside the
others) resumes each suspended run whose jobs have ended, or whose wait has run out
(:func:`resume_due_runs`). The resumed run starts again from its first step: every task that
finished comes from Prefect's cache, and the batch path reads the ended jobs' results from the
ledger (or cancels a late one and sends its requests synchronously) instead of sending them again.

A suspended run's subflow runs (a refresh round's main job, generation, evaluation) stay Running
on the server when their process exits with the suspension, and their heartbeats stop: the crash
automation (``deployments/automations.py``) would mark them Crashed after its window. As the process
exits, :func:`pause_subflows` sets them Paused; the resumed run takes each one up again from there.

Outside a deployment (a ``refusalbench run`` in a terminal) nothing changes: the process polls the
job until it ends, as ``batch_calls`` says.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import uuid
from typing import Any, NoReturn

from refusalbench.tasks.core.config import RunConfig, load_config
from refusalbench.tasks.llm.batch_calls import wait_elsewhere
from refusalbench.tasks.llm.batch_watch import record_waiting, run_is_due, wait_left
from refusalbench.tasks.llm.gateway import gateway_for
from refusalbench.tasks.pipeline.ui import story

# Beyond the jobs' wait, how long a suspended run may stay unresumed (the watcher stopped a while)
# before Prefect fails it: the watcher resumes it at the wait's end at the latest.
SUSPEND_MARGIN_S = 6 * 3600
# The state name of a suspended flow run (its type is PAUSED).
SUSPENDED = "Suspended"
# The tag of every RefusalBench deployment's runs: the watcher resumes only those.
DEPLOYMENT_TAG = "refusalbench"


@functools.cache
def deployment_run() -> str | None:
    """The id of the deployment flow run this process was started for (by a worker or a serve
    runner, which set ``PREFECT__FLOW_RUN_ID``), else None: the run is not a deployment's."""
    run_id = os.environ.get("PREFECT__FLOW_RUN_ID")
    if not run_id:
        return None
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(uuid.UUID(run_id))
    except Exception as exc:  # noqa: BLE001 - unknown to the API: wait here, as outside a deployment
        logging.getLogger(__name__).warning(
            "flow run %s could not be read (%s): batches are waited for here", run_id, exc
        )
        return None
    return run_id if run.deployment_id is not None else None


def wait_outside() -> None:
    """Before a task body: in a deployment's run, batch jobs still running are left to the provider
    (``batch_calls.BatchWaiting``) instead of being polled in this process."""
    if deployment_run() is not None:
        wait_elsewhere(True)


def suspend_for(config: RunConfig, jobs: list[dict[str, Any]]) -> NoReturn:
    """Record ``jobs`` as what this deployment run waits for, suspend it, and end this task with ``Pause``."""
    from prefect.exceptions import Pause
    from prefect.flow_runs import suspend_flow_run

    run_id = deployment_run()
    if run_id is None:  # not raised outside a deployment's run (wait_outside): nothing to suspend
        raise RuntimeError("batch jobs left running outside a deployment run")
    everything = record_waiting(gateway_for(config).cache, run_id, jobs)
    timeout = int(wait_left(config, everything)) + SUSPEND_MARGIN_S
    story(
        "waiting for batch job(s) %s: the run is suspended and resumes when they end (at most %d s)",
        ", ".join(str(job["job"]) for job in everything),
        timeout,
    )
    # A fresh key each time: a resumed run that waits again (a later stage's jobs) suspends again.
    # The run's flows, in this process, stop at their next step (Prefect raises Pause there); this task
    # ends now with Pause, as Prefect's own signal, so it is neither failed nor retried.
    suspend_flow_run(flow_run_id=uuid.UUID(run_id), timeout=timeout, key=f"batch-{uuid.uuid4().hex}")
    # At exit, not now: the subflows' engines send heartbeats until they have unwound, and a heartbeat
    # after their Paused state would start the automation's window again.
    if not _pausing_at_exit:
        _pausing_at_exit.append(run_id)
        atexit.register(pause_subflows, run_id)
    raise Pause("suspended while its batch jobs run")


_pausing_at_exit: list[str] = []


def pause_subflows(run_id: str) -> list[str]:
    """Set the still-Running subflow runs of the suspended run ``run_id`` (at any depth) Paused; their ids.

    Runs when the suspended run's process exits, its flows unwound: their heartbeats have stopped.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Paused

    paused: list[str] = []
    try:
        with get_client(sync_client=True) as client:
            parents = [uuid.UUID(run_id)]
            while parents:
                below = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=parents))
                children = client.read_flow_runs(flow_run_filter=below)
                for child in children:
                    if child.state is not None and child.state.is_running():
                        client.set_flow_run_state(
                            child.id, Paused(message="its root run is suspended for batch jobs"), force=True
                        )
                        paused.append(str(child.id))
                parents = [child.id for child in children]
    except Exception as exc:  # noqa: BLE001 - at exit: a subflow left Running is marked Crashed, no worse
        logging.getLogger(__name__).warning("subflow runs of %s could not be paused: %s", run_id, exc)
    return paused


def suspended_runs() -> list[Any]:
    """The suspended flow runs of RefusalBench deployments."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateName,
        FlowRunFilterTags,
    )

    suspended = FlowRunFilter(
        state=FlowRunFilterState(name=FlowRunFilterStateName(any_=[SUSPENDED])),
        tags=FlowRunFilterTags(all_=[DEPLOYMENT_TAG]),
    )
    with get_client(sync_client=True) as client:
        return list(client.read_flow_runs(flow_run_filter=suspended))


def resume_due_runs() -> list[str]:
    """Resume each suspended run whose batch jobs have ended or are past their wait; their ids."""
    from prefect.flow_runs import resume_flow_run

    resumed = []
    for run in suspended_runs():
        config_path = (run.parameters or {}).get("config_path")
        if not config_path:
            continue  # not a run of ours that waits for batches
        try:
            due = run_is_due(load_config(str(config_path)), str(run.id))
        except Exception as exc:  # noqa: BLE001 - one run's config or cache must not stop the others
            story("run %s: its batch jobs could not be looked at: %s: %s", run.name, type(exc).__name__, exc)
            continue
        if due:
            resume_flow_run(run.id)
            story("run %s resumed: its batch jobs have ended", run.name)
            resumed.append(str(run.id))
    return resumed
