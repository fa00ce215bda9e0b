"""Refresh round identity and resume: ``<out_root>/<round_id>/round.json``.

A refresh run writes ``round.json`` when its round starts (``status: running``) and sets
``complete`` or ``failed`` at the end. A run whose process died leaves ``running`` behind; the
round is then resumed, with the same seed and folder, so the call cache answers every call
the dead attempt finished:

- by the same flow run started again (the retry automation of deployments/automations.py), or
- by the next refresh run (a scheduled one: no seed given, or the same seed given) when the
  round's flow run is over (Crashed, Cancelled, gone) and the round had fewer than
  :data:`MAX_ATTEMPTS` attempts. A round its ``budget_usd`` stopped (``status: stopped``) is
  resumed the same way.

A dead round that is not resumed (too many attempts, or a later round took over) is set
``failed`` with the reason, and the trend lists it as incomplete (tasks/refusalbench/rounds/trend.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from refusalbench.tasks.core.errors import BudgetExceeded
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.ui import story
from refusalbench.tasks.refusalbench.rounds.trend import COMPLETE, ROUND_PREFIX, ROUND_RECORD, round_name

RUNNING, FAILED = "running", "failed"
# A round its ``budget_usd`` stopped: resumed by the next refresh run like a dead running round (a larger
# budget then finishes it, the call cache answering what was done).
STOPPED = "stopped"
RESUMABLE = frozenset({RUNNING, STOPPED})
MAX_ATTEMPTS = 3  # a round whose process died this often is not started again: it may be what kills it
# Flow-run states whose process may still work on (or come back to) its round.
LIVE_STATE_TYPES = frozenset({"SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"})


@dataclasses.dataclass
class RoundRecord:
    """The content of ``round.json``: which round, its seed, who works on it and how it ended."""

    round_id: str
    seed: int
    flow_run_id: str | None
    started_at: str
    status: str = RUNNING
    finished_at: str | None = None
    attempts: int = 1
    flow_runs: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in fields})


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def write_record(root: ArtifactStore, record: RoundRecord) -> None:
    root.child(record.round_id).write_text(ROUND_RECORD, json.dumps(dataclasses.asdict(record), indent=2))


def read_records(root: ArtifactStore) -> list[RoundRecord]:
    """The round records under ``root`` in round order (folders without a readable one are skipped)."""
    records = []
    for name in root.folders():
        store = root.child(name)
        if not name.startswith(ROUND_PREFIX) or not store.exists(ROUND_RECORD):
            continue
        try:
            records.append(RoundRecord.from_json(json.loads(store.read_text(ROUND_RECORD))))
        except (ValueError, TypeError):
            continue
    return records


@dataclasses.dataclass
class RoundChoice:
    """What a refresh run works on: ``resume`` (a record) or a new round, and the dead rounds to close."""

    resume: RoundRecord | None
    abandon: list[tuple[RoundRecord, str]]


def choose_round(
    records: list[RoundRecord], flow_run_id: str | None, seed: int | None, owner_alive: Callable[[str], bool]
) -> RoundChoice:
    """Which round a refresh run works on (pure: ``owner_alive(flow_run_id)`` answers for the server).

    Its own round first (the same flow run started again). Otherwise the latest running
    round whose flow run is over, when the seeds agree and it has attempts left; every other
    dead running round is abandoned.
    """
    # The same flow run started again works on its round whatever that says: a run marked Crashed
    # while it was still working (missed heartbeats) may have completed it before the retry began.
    own = [r for r in records if flow_run_id is not None and r.flow_run_id == flow_run_id]
    if own:
        return RoundChoice(own[-1], [])
    running = [r for r in records if r.status in RESUMABLE]
    dead = [r for r in running if not (r.flow_run_id and owner_alive(r.flow_run_id))]
    # Only a round after every ended one is resumed: an older one would come back behind the trend.
    ended = [index for index, r in enumerate(records) if r.status not in RESUMABLE]
    last_ended = records[ended[-1]].round_id if ended else ""
    resume = None
    abandon: list[tuple[RoundRecord, str]] = []
    for record in reversed(dead):  # the latest first
        if record.round_id < last_ended:
            abandon.append((record, f"not resumed: a later round ({last_ended}) ended first"))
        elif resume is None and (seed is None or record.seed == seed) and record.attempts < MAX_ATTEMPTS:
            resume = record
        elif resume is None and record.attempts >= MAX_ATTEMPTS:
            abandon.append((record, f"not resumed: its process died in {record.attempts} attempts"))
        else:
            abandon.append((record, "not resumed: a later round was resumed or started instead"))
    return RoundChoice(resume, abandon)


def flow_run_alive(flow_run_id: str) -> bool:
    """Whether the flow run may still work on its round (live state); unknown runs are over."""
    from uuid import UUID

    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(flow_run_id)).state
    except Exception:  # noqa: BLE001 - a run the server does not know (deleted, other server) is over
        return False
    return state is not None and state.type.value in LIVE_STATE_TYPES


def start_round(
    out_root: str, seed: int | None, flow_run_id: str | None = None, owner_alive: Callable[[str], bool] = flow_run_alive
) -> RoundRecord:
    """The round this refresh run works on, resumed or new, with ``round.json`` saying running."""
    if flow_run_id is None:
        from prefect.runtime import flow_run

        flow_run_id = flow_run.id
    root = ArtifactStore(out_root)
    choice = choose_round(read_records(root), flow_run_id, seed, owner_alive)
    for record, reason in choice.abandon:
        write_record(root, dataclasses.replace(record, status=FAILED, finished_at=_now(), reason=reason))
    if choice.resume is not None:
        record = dataclasses.replace(
            choice.resume,
            attempts=choice.resume.attempts + 1,
            flow_run_id=flow_run_id,
            status=RUNNING,
            finished_at=None,
            reason=None,
        )
    else:
        seed = secrets.randbelow(2**31) if seed is None else seed  # a fresh round: new sample, new levers
        started = dt.datetime.now(dt.UTC)
        record = RoundRecord(round_name(started, seed), seed, flow_run_id, started.isoformat(timespec="seconds"))
    if flow_run_id and flow_run_id not in record.flow_runs:
        record.flow_runs = [*record.flow_runs, flow_run_id]
    write_record(root, record)
    if record.attempts > 1:
        story(
            "resuming refresh round %s (seed %d, attempt %d): finished calls come from the cache",
            record.round_id,
            record.seed,
            record.attempts,
        )
    for abandoned, reason in choice.abandon:
        story("refresh round %s is incomplete: %s", abandoned.round_id, reason)
    return record


def finish_round(out_root: str, record: RoundRecord, status: str = COMPLETE, reason: str | None = None) -> None:
    """``round.json`` says how the round ended: complete, or failed (with why)."""
    write_record(ArtifactStore(out_root), dataclasses.replace(record, status=status, finished_at=_now(), reason=reason))


@contextmanager
def stopped_by_budget(out_root: str, record: RoundRecord) -> Iterator[None]:
    """The round's main job; when its budget stops it, ``round.json`` says stopped (resumable), not failed."""
    try:
        yield
    except BudgetExceeded as exc:
        finish_round(out_root, record, STOPPED, str(exc))
        raise


def fail_round_of(out_root: str, flow_run_id: str, reason: str) -> RoundRecord | None:
    """Set ``failed`` on the running round of ``flow_run_id`` (a refresh run that ended in an error)."""
    root = ArtifactStore(out_root)
    for record in read_records(root):
        if record.status == RUNNING and record.flow_run_id == flow_run_id:
            finish_round(out_root, record, FAILED, reason)
            return record
    return None


def record_round_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """The refresh flow's ``on_failure`` hook: its round ended in an error, so ``round.json`` says failed.

    A crash (the process killed) runs no hook: the round stays running and is resumed.
    """
    out_root = (flow_run.parameters or {}).get("out_root")
    if out_root:
        fail_round_of(out_root, str(flow_run.id), state.message or "the refresh run failed")


__all__ = [
    "RoundRecord",
    "RoundChoice",
    "choose_round",
    "start_round",
    "finish_round",
    "fail_round_of",
    "record_round_failed",
    "stopped_by_budget",
    "read_records",
    "MAX_ATTEMPTS",
]
