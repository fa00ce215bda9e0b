"""What a run shows in the Prefect UI: its story in the Logs tab, and table, markdown, link
and progress artifacts.

Outside a flow or task run the artifact helpers do nothing and ``story`` falls back to the
module logger; a failure to publish never breaks the work. Pure code narrates through
``tasks.core.narration``, which this module points here when the pipeline is imported.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from uuid import UUID

from refusalbench.tasks.core import narration
from refusalbench.tasks.llm import accounting

log = logging.getLogger("refusalbench")

# The run's story for the Logs tab: its own logger, sent to Prefect's API only. Prefect's
# run loggers (get_run_logger) take PREFECT_LOGGING_LEVEL, which the CLI keeps at WARNING
# for a quiet terminal, and pass their records on to the terminal's handler: through them
# these lines would be dropped, or printed. This logger keeps the run's context (flow or
# task run id and name) and reaches the UI whatever the terminal shows.
STORY = logging.getLogger("refusalbench.story")
STORY.propagate = False
STORY.setLevel(logging.INFO)
_story_lock = threading.Lock()


def in_run() -> bool:
    """True inside a Prefect flow or task run."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None
    except Exception:
        return False


def _story_logger() -> logging.LoggerAdapter[logging.Logger]:
    from prefect import get_run_logger
    from prefect.logging.handlers import APILogHandler

    with _story_lock:
        if not any(isinstance(h, APILogHandler) for h in STORY.handlers):
            STORY.addHandler(APILogHandler())
    # get_run_logger is typed Logger | LoggerAdapter; in a run it is Prefect's adapter, its extra the run's ids.
    return logging.LoggerAdapter(STORY, dict(get_run_logger().extra))  # type: ignore[union-attr, arg-type]


def story(message: str, *args: Any, level: int = logging.INFO, terminal: bool = False) -> None:
    """One line of the run's story (a stage's start and end, counts, skipped models, the report).

    In a flow or task run it goes to that run's Logs tab in the Prefect UI; outside a run,
    to the module logger. ``terminal=True``: a line the terminal showed before goes there
    too, as before (the module logger), in a run or not.
    """
    inside = in_run()
    if terminal or not inside:
        log.log(level, message, *args)
    if inside:
        try:
            _story_logger().log(level, message, *args)
        except Exception:  # the story must never break the work
            log.debug("could not send to the run's log: " + message, *args)


def task_run_name() -> str | None:
    """The current task run's name (what the UI shows), or None outside a task run."""
    try:
        from prefect.context import TaskRunContext

        context = TaskRunContext.get()
        return context.task_run.name if context is not None else None
    except Exception:
        return None


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    cleaned = "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in text.lower())
    while "--" in cleaned:
        cleaned = cleaned.replace("--", "-")
    return cleaned.strip("-")[:100] or "artifact"


def publish_table(key: str, rows: list[dict[str, Any]], description: str = "") -> None:
    if not in_run() or not rows:
        return
    from prefect.artifacts import create_table_artifact

    clean = [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()} for row in rows]
    create_table_artifact(key=artifact_key(key), table=clean, description=description)


def publish_markdown(key: str, markdown: str, description: str = "") -> None:
    if not in_run():
        return
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(key=artifact_key(key), markdown=markdown, description=description)


def publish_link(key: str, link: str, text: str, description: str = "") -> None:
    if not in_run():
        return
    from prefect.artifacts import create_link_artifact

    create_link_artifact(key=artifact_key(key), link=link, link_text=text, description=description)


def publish_run_costs(costs: dict[str, Any]) -> None:
    """The ``run-costs`` table: spend per stage and model, unpriced calls, cached-prefix and batch savings
    (the manifest's ``costs``, as the report's cost section shows them)."""
    from refusalbench.tasks.refusalbench.report.cost_section import cost_rows, cost_summary_line

    try:
        rows = cost_rows(costs)
        if rows:
            publish_table("run-costs", rows, description=cost_summary_line(costs))
    except Exception:  # the display must never break the run; the manifest has the costs
        log.debug("could not publish the run-costs table", exc_info=True)


class PrefectSink:
    """The narration of pure code (``core.narration``) in the Prefect UI: the functions above."""

    story = staticmethod(story)
    publish_table = staticmethod(publish_table)
    publish_markdown = staticmethod(publish_markdown)
    publish_link = staticmethod(publish_link)


narration.install(PrefectSink())

# The stage a task's calls count for, where it is not its name less ``-shard`` (accounting per stage).
STAGE_OF_TASK = {"calibration-judge-shard": "calibrate"}


def stage_of_task(name: str) -> str:
    """The stage a task's calls count for: ``respond-shard`` -> ``respond``."""
    return STAGE_OF_TASK.get(name, name.removesuffix("-shard"))


def task_stage() -> str | None:
    """The stage of the running task, or None outside a task run: the gateway tags each call with
    it, so overlapping stages (respond and judge) are each charged their own calls."""
    from prefect.context import TaskRunContext

    context = TaskRunContext.get()
    return stage_of_task(context.task.name) if context is not None else None


accounting.install_stage_resolver(task_stage)


# Where progress lines go besides Prefect (the CLI points this at the terminal).
PROGRESS_ECHO: Any = None


class UpdateBudget:
    """How often the progress displays of one process may update their artifacts, between them.

    Each update is a request to Prefect's API, whose server shares the machine: 30 targets' tasks
    updating every 2 s each kept it busy through the respond stage, taking CPU from the calls. A
    display's last update is always sent (its artifact ends at 100%, created then if not before); the
    ones before it are sent while the process has sent none for ``every_s`` (one display alone updates
    as often as before; many take turns)."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self._last = float("-inf")
        self._lock = threading.Lock()

    def take(self, now: float) -> bool:
        with self._lock:
            if now - self._last < self.every_s:
                return False
            self._last = now
            return True


PROGRESS_UPDATES = UpdateBudget()


class Progress:
    """Progress of a long stage: a Prefect progress artifact (UI) plus a debug log line.

    The artifact's key is the title's (``judge answerer`` -> ``judge-answerer-progress``):
    one key per stage and model, so the Artifacts page lists it; its description names the
    task run (``judge | answerer | shard 3/8``). The Logs tab gets a shard's summary at its
    end instead of a line every few seconds (``tasks/pipeline/fanout.py``). Updates are throttled
    (every ``every_s`` seconds, and, across the process's displays, as :data:`PROGRESS_UPDATES`
    allows) so thousands of completions do not turn into thousands of API calls. Thread-safe:
    gateway callbacks may come from anywhere.
    """

    def __init__(self, title: str, total: int, every_s: float = 2.0, echo: Any = None):
        self.title = title
        self.total = max(total, 0)
        self.done = 0
        self.every_s = every_s
        self.echo = echo or PROGRESS_ECHO
        self._last = 0.0
        self._lock = threading.Lock()
        self._shown = in_run() and self.total > 0
        self._artifact_lock = threading.Lock()  # one request at a time: the artifact is created once
        self._artifact_id: UUID | None = None
        self._description = task_run_name() or title
        # The artifact is created at the first update, after the throttle (or at the end), not here:
        # a stage's tasks all start together, and a synchronous request to the Prefect API each (with
        # its event) held back every model's first calls; a task done within the throttle shows 100%.
        self._artifact_last = time.monotonic()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last < self.every_s and self.done < self.total:
                return
            self._last = now
            done, total = self.done, self.total
            update = self._shown and (
                done >= total or (now - self._artifact_last >= self.every_s and PROGRESS_UPDATES.take(now))
            )
            if update:
                self._artifact_last = now
        percent = 100.0 * done / total if total else 100.0
        if self.echo is not None:
            self.echo(self.title, done, total)
        if update:
            self._show(percent)
        log.debug("%s: %d/%d (%.0f%%)", self.title, done, total, percent)

    def _show(self, percent: float) -> None:
        """Create the progress artifact at ``percent``, or move the one created to it."""
        with self._artifact_lock:
            try:
                from prefect.artifacts import create_progress_artifact, update_progress_artifact

                if self._artifact_id is None:
                    # Prefect types its sync-or-async result as UUID | Coroutine; called from sync code it is the UUID.
                    self._artifact_id = create_progress_artifact(
                        progress=percent,
                        key=artifact_key(f"{self.title} progress"),  # type: ignore[assignment]
                        description=self._description,
                    )
                else:
                    update_progress_artifact(artifact_id=self._artifact_id, progress=percent)
            except Exception:  # progress display must never break the work
                pass


class SpendDisplay:
    """Spend against the run's budget in the Prefect UI: one progress artifact (``budget-spend``, the
    share of the budget spent), its description the dollars and the stage, updated before each shard."""

    def __init__(self) -> None:
        self._artifact_id: UUID | None = None

    def show(self, spent: float, budget: float, stage: str) -> None:
        if not in_run():
            return
        percent = min(100.0, 100.0 * spent / budget)
        description = f"spent ${spent:,.4f} of the ${budget:,.2f} budget (stage {stage})"
        try:
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            if self._artifact_id is None:
                # Prefect types its sync-or-async result as UUID | Coroutine; called from sync code it is the UUID.
                self._artifact_id = create_progress_artifact(
                    progress=percent,
                    key="budget-spend",  # type: ignore[assignment]
                    description=description,
                )
            else:
                update_progress_artifact(artifact_id=self._artifact_id, progress=percent, description=description)
        except Exception:  # the display must never break the work
            log.debug("could not show the spend: %s", description)
