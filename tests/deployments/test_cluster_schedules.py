"""Schedules that fire: Prefect's scheduler creates runs with the pinned SQLAlchemy/aiosqlite (fast,
on the test API's SQLite database) and, on the local cluster (PostgreSQL + asyncpg), a short interval
schedule on the refresh deployment makes rounds that run on the workers, complete, and form a trend.

SQLAlchemy 2.1 broke Prefect 3.8's scheduler ("Can't evaluate bulk DML statement"): no scheduled run
was ever created, and no test noticed because Prefect's test server runs no scheduler.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFRESH = "refusalbench-refresh/refresh"
INTERVAL_S = 20


def test_scheduler_creates_runs_on_sqlite(prefect_harness):
    """The server's scheduler pass, in this process, on the test API's SQLite database."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.server.services.scheduler import schedule_deployments

    async def scheduled_runs() -> list:
        async with get_client() as client:
            flow_id = await client.create_flow_from_name("schedule-probe")
            deployment_id = await client.create_deployment(
                flow_id,
                name="every-10s",
                schedules=[
                    DeploymentScheduleCreate(schedule=IntervalSchedule(interval=dt.timedelta(seconds=10)), active=True)
                ],
            )
            try:
                await schedule_deployments()  # one pass of the service `prefect server` runs every loop
                return await client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
                )
            finally:
                await client.delete_deployment(deployment_id)

    runs = asyncio.run(scheduled_runs())
    # At least the scheduler's minimum of upcoming runs (3), each made by it, 10 s apart.
    assert len(runs) >= 3
    assert all(run.auto_scheduled and run.state.is_scheduled() for run in runs)
    starts = sorted(run.expected_start_time for run in runs)
    assert {(b - a).total_seconds() for a, b in zip(starts, starts[1:])} == {10.0}


def tiny_refresh_config(path: Path) -> Path:
    """A refresh round in seconds on the scripted models: rule-made items, one target, one judge."""
    models = "\n".join(
        f'  {name}: {{model: openai/{name}, api_base: "${{REFUSALBENCH_MODELS_URL}}", max_attempts: 2}}'
        for name in ("verifier", "target", "judge")
    )
    path.write_text(f"""name: schedule-test
models:
{models}
  rules: {{model: rules/v1}}
cache: {{backend: redis, url: "${{REFUSALBENCH_REDIS_URL}}"}}
runner: thread
generation:
  base_set: {ROOT / "data" / "sample_single.jsonl"}
  base_sample: 8
  generators: [rules]
  verifiers: [verifier]
  filter: none
  strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM, P-MissingInfo/HIGH]
evaluation:
  targets: [target]
  judge: judge
  bootstrap: 50
""")
    return path


def schedule_runs(cluster, out_root: str) -> list[dict]:
    """The refresh runs of this test (its out_root), oldest first."""
    return [run for run in cluster.flow_runs(REFRESH) if run["parameters"].get("out_root") == out_root]


FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def wait_for_runs(cluster, out_root: str, count: int, until, what: str, timeout_s: float = 480) -> list[dict]:
    """Poll this test's runs until ``count`` of them satisfy ``until``; fail at once on a failed round."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = schedule_runs(cluster, out_root)
        failed = [r for r in runs if r["state_type"] in ("FAILED", "CRASHED")]
        assert not failed, (failed[0]["state"], cluster.run_logs(failed[0]["id"])[-20:])
        if len(chosen := [r for r in runs if until(r)]) >= count:
            return chosen
        assert time.monotonic() < deadline, (
            f"{len(chosen)} of {count} scheduled rounds {what} in {timeout_s:.0f} s\n" + cluster.logs_tail()
        )
        time.sleep(1)


def pause(cluster, deployment_id: str, schedule_id: str, out_root: str, keep: set[str]) -> None:
    """Pause the schedule and delete its runs not yet started but those in ``keep`` (Prefect's pause
    keeps the runs waiting for the deployment's concurrency slot)."""
    cluster.api("PATCH", f"/deployments/{deployment_id}/schedules/{schedule_id}", json={"active": False})
    for run in schedule_runs(cluster, out_root):
        if run["state_type"] == "SCHEDULED" and run["id"] not in keep:
            cluster.api("DELETE", f"/flow_runs/{run['id']}")


@pytest.mark.cluster
@pytest.mark.slow
def test_interval_schedule_makes_rounds_on_the_workers(local_cluster, tmp_path, monkeypatch):
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

    cluster = local_cluster
    out_root = f"s3://{cluster.bucket}/schedule-test"
    config = tiny_refresh_config(tmp_path / "refresh.yaml")
    deployment = cluster.deployment(REFRESH)
    anchor = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
    (schedule,) = cluster.api(
        "POST",
        f"/deployments/{deployment['id']}/schedules",
        json=[
            {
                "schedule": {"interval": INTERVAL_S, "anchor_date": anchor.isoformat(), "timezone": "UTC"},
                "active": True,
                "max_scheduled_runs": 2,
                "parameters": {"config_path": str(config), "out_root": out_root},
            }
        ],
    )
    started: list[dict] = []
    try:
        # The scheduler makes the rounds; once two are running or done (one at a time: the
        # deployment's concurrency limit), the schedule is paused, so no third round takes the workers.
        started = wait_for_runs(cluster, out_root, 2, lambda r: r["state_type"] in ("RUNNING", "COMPLETED"), "started")
    finally:
        pause(cluster, deployment["id"], schedule["id"], out_root, keep={r["id"] for r in started[:2]})
    done = wait_for_runs(cluster, out_root, 2, lambda r: r["state_type"] == "COMPLETED", "completed")
    assert {r["id"] for r in done} == {r["id"] for r in started[:2]}
    first, second = done[:2]
    assert first["auto_scheduled"] and second["auto_scheduled"]
    assert first["expected_start_time"] < second["expected_start_time"]
    for run in (first, second):
        logs = "\n".join(cluster.run_logs(run["id"]))
        assert any(f"Worker '{w.name}' submitting flow run" in logs for w in cluster.workers), logs[-2000:]
    # Nothing of the paused schedule is left to run.
    assert [r["state_type"] for r in schedule_runs(cluster, out_root)] == ["COMPLETED", "COMPLETED"]

    # The trend written by the second round (under out_root on S3) covers both rounds.
    for name, value in cluster.flow_env().items():
        if name.startswith("REFUSALBENCH_S3_"):
            monkeypatch.setenv(name, value)
    root = ArtifactStore(out_root)
    rounds = sorted(name for name in root.folders() if name.startswith("round-"))
    assert len(rounds) >= 2
    trend = root.child(rounds[-1]).read_frame(rb_files.ROUND_TREND.name)
    assert set(rounds[-2:]) <= set(trend["round"]), trend
