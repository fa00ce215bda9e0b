"""What a run shows in the Prefect UI: table, markdown, link and progress artifacts.

Outside a flow or task run every helper does nothing, so pure stage code can call them
freely; a failure to publish never breaks the work.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("refusalbench")

def _in_run() -> bool:
    try:
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None
    except Exception:
        return False


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in text.lower())
    while "--" in cleaned:
        cleaned = cleaned.replace("--", "-")
    return cleaned.strip("-")[:100] or "artifact"


def publish_table(key: str, rows: list[dict[str, Any]], description: str = "") -> None:
    if not _in_run() or not rows:
        return
    from prefect.artifacts import create_table_artifact

    clean = [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()} for row in rows]
    create_table_artifact(key=artifact_key(key), table=clean, description=description)


def publish_markdown(key: str, markdown: str, description: str = "") -> None:
    if not _in_run():
        return
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(key=artifact_key(key), markdown=markdown, description=description)


def publish_link(key: str, link: str, text: str, description: str = "") -> None:
    if not _in_run():
        return
    from prefect.artifacts import create_link_artifact

    create_link_artifact(key=artifact_key(key), link=link, link_text=text, description=description)


# Where progress lines go besides Prefect (the CLI points this at the terminal).
PROGRESS_ECHO: Any = None


class Progress:
    """Progress of a long stage: a Prefect progress artifact (UI) plus a log line.

    Updates are throttled (every ``every_s`` seconds) so thousands of completions do not
    turn into thousands of API calls. Thread-safe: gateway callbacks may come from anywhere.
    """

    def __init__(self, title: str, total: int, every_s: float = 2.0, echo: Any = None):
        self.title = title
        self.total = max(total, 0)
        self.done = 0
        self.every_s = every_s
        self.echo = echo or PROGRESS_ECHO
        self._last = 0.0
        self._lock = threading.Lock()
        self._artifact_id = None
        if _in_run() and self.total:
            try:
                from prefect.artifacts import create_progress_artifact

                self._artifact_id = create_progress_artifact(progress=0.0, description=title)
            except Exception:  # progress display must never break the work
                self._artifact_id = None

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last < self.every_s and self.done < self.total:
                return
            self._last = now
            done, total = self.done, self.total
        percent = 100.0 * done / total if total else 100.0
        if self.echo is not None:
            self.echo(self.title, done, total)
        if self._artifact_id is not None:
            try:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(artifact_id=self._artifact_id, progress=percent)
            except Exception:
                pass
        try:
            from prefect import get_run_logger

            get_run_logger().info("%s: %d/%d (%.0f%%)", self.title, done, total, percent)
        except Exception:
            log.debug("%s: %d/%d", self.title, done, total)
