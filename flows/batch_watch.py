"""The batch watcher: resumes the deployment runs suspended while their batch jobs run, once the jobs end.

A deployment's run suspends when its batch jobs are still running (``tasks/pipeline/batch_suspension.py``);
this flow, run on a short interval by its own deployment beside the others (``refusalbench deploy``,
``deployments/serve.py``, ``deployments/prefect.yaml``), looks at each suspended run's jobs once and
resumes the runs whose jobs have ended or are past their ``batch.max_wait_s``. It makes no model call.
"""

from __future__ import annotations

from prefect import flow

from refusalbench.tasks.pipeline.batch_suspension import resume_due_runs
from refusalbench.tasks.pipeline.process_guard import follow_parent


@flow(name="refusalbench-batch-watcher", log_prints=True)
def batch_watch_flow() -> list[str]:
    """Resume the suspended runs whose batch jobs have ended; their flow run ids."""
    follow_parent()  # a flow-run process that a worker started ends with that worker
    return resume_due_runs()
