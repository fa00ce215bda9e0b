"""Crash recovery on a Prefect server: ``python -m refusalbench.deployments.automations``.

Registers (or updates, by name) two automations with the API in ``PREFECT_API_URL``:

- **crash runs without heartbeats** - Prefect's documented zombie detection: a flow run that
  sent a heartbeat (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, set for the deployments in
  prefect.yaml) and then neither another heartbeat nor a final state within ``--within``
  seconds is set Crashed (a run suspended while its batch jobs run is not: it left on purpose, and
  its subflow runs are set Paused as its process exits, tasks/pipeline/batch_suspension.py).
  This is what ends a run whose worker and flow process vanished
  together (a lost container); it also releases the deployment concurrency slot that run held,
  which otherwise stays taken until the 300 s lease the engine renews runs out.
- **retry crashed runs** - a Crashed run of a RefusalBench deployment is set back to Scheduled
  (AwaitingRetry) so a worker starts the same flow run again, at most ``--retries`` times
  (matched on the run count of the Crashed event). The refresh flow then resumes its round
  (tasks/pipeline/refusalbench/refresh_rounds.py) and the call cache answers every call the crashed
  attempt finished. Subflow runs (no deployment) and other teams' flows are not retried.

``deployments/register.sh`` runs this after registering the deployments.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

CRASH_AUTOMATION = "refusalbench: crash runs without heartbeats"
RETRY_AUTOMATION = "refusalbench: retry crashed runs"
DEFAULT_WITHIN_S = 90  # three missed heartbeats at the 30 s minimum frequency, as Prefect documents
DEFAULT_RETRIES = 2
DEPLOYMENT_TAG = "refusalbench"  # every deployment of prefect.yaml and serve.py carries it
FINAL_EVENTS = (
    "prefect.flow-run.Completed",
    "prefect.flow-run.Failed",
    "prefect.flow-run.Cancelled",
    "prefect.flow-run.Crashed",
)
# A run suspended while its batch jobs run (tasks/pipeline/batch_suspension.py) has left its process on
# purpose: its heartbeats stop without it having crashed.
LEFT_ON_PURPOSE = ("prefect.flow-run.Suspended", "prefect.flow-run.Paused")


def crash_automation(within_s: float = DEFAULT_WITHIN_S) -> Any:
    """Prefect's zombie-run automation: Crashed when heartbeats stop before a final state."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=CRASH_AUTOMATION,
        description="Marks a flow run Crashed when its heartbeats stop (worker or container lost).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *FINAL_EVENTS, *LEFT_ON_PURPOSE},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED, message=f"Flow run marked as crashed: no heartbeat for {within_s:g} s."
            )
        ],
    )


def retry_automation(retries: int = DEFAULT_RETRIES) -> Any:
    """Crashed deployment runs tagged ``refusalbench`` go back to Scheduled, ``retries`` times at most."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=RETRY_AUTOMATION,
        description=f"Starts a crashed RefusalBench deployment run again (at most {retries} times); "
        "the run resumes from its run folder and the call cache.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            # The run count on the event bounds the retries: a run that keeps crashing stops.
            match=ResourceSpecification(
                {
                    "prefect.resource.id": ["prefect.flow-run.*"],
                    "prefect.run-count": [str(n) for n in range(1, retries + 1)],
                }
            ),
            match_related=[
                ResourceSpecification({"prefect.resource.role": "deployment"}),
                ResourceSpecification(
                    {"prefect.resource.id": f"prefect.tag.{DEPLOYMENT_TAG}", "prefect.resource.role": "tag"}
                ),
            ],
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                name="AwaitingRetry",
                force=True,
                message="Retrying the crashed run (automation); it resumes where it stopped.",
            )
        ],
    )


def register(automations: list[Any]) -> list[str]:
    """Create each automation, or update the one of the same name; returns their ids."""
    from prefect.automations import Automation

    ids = []
    for automation in automations:
        try:
            # Prefect types read() by its async form; called from sync code it returns the Automation itself.
            existing: Automation = Automation.read(name=automation.name)  # type: ignore[assignment]
        except ValueError:
            ids.append(str(automation.create().id))
            continue
        automation.id = existing.id
        automation.update()
        ids.append(str(existing.id))
    return ids


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--within",
        type=float,
        default=DEFAULT_WITHIN_S,
        help="seconds without a heartbeat before a run is marked Crashed (default %(default)s)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        help="times a crashed deployment run is started again (default %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ids = register([crash_automation(args.within), retry_automation(args.retries)])
    print(f"automations registered: {CRASH_AUTOMATION} ({ids[0]}), {RETRY_AUTOMATION} ({ids[1]})")


if __name__ == "__main__":
    main()
