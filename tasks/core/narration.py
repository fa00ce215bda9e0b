"""The run's narration, told by pure code that does not know who shows it: story lines,
tables, markdown and links.

Without a runtime the story goes to the ``refusalbench`` logger and the tables, markdown and
links go nowhere (they are views of what the run folder already holds). The Prefect runtime
(``tasks/pipeline/ui.py``) installs its sink when the pipeline is imported: then the story
reaches the run's Logs tab and the rest its Artifacts page. Pure modules call the functions
here and never import the runtime.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger("refusalbench")


class NarrationSink(Protocol):
    """Where the narration goes: the four calls below, with the same arguments."""

    def story(self, message: str, *args: Any, level: int = logging.INFO, terminal: bool = False) -> None: ...

    def publish_table(self, key: str, rows: list[dict[str, Any]], description: str = "") -> None: ...

    def publish_markdown(self, key: str, markdown: str, description: str = "") -> None: ...

    def publish_link(self, key: str, link: str, text: str, description: str = "") -> None: ...


class LoggerSink:
    """Narration without a runtime: the story to the module logger, the artifacts nowhere."""

    def story(self, message: str, *args: Any, level: int = logging.INFO, terminal: bool = False) -> None:
        log.log(level, message, *args)

    def publish_table(self, key: str, rows: list[dict[str, Any]], description: str = "") -> None:
        pass

    def publish_markdown(self, key: str, markdown: str, description: str = "") -> None:
        pass

    def publish_link(self, key: str, link: str, text: str, description: str = "") -> None:
        pass


_sink: NarrationSink = LoggerSink()


def install(sink: NarrationSink) -> NarrationSink:
    """Send the narration to ``sink`` from now on; returns the sink it replaces."""
    global _sink
    previous, _sink = _sink, sink
    return previous


def story(message: str, *args: Any, level: int = logging.INFO, terminal: bool = False) -> None:
    """One line of the run's story (a stage's start and end, counts, the report's address).

    ``terminal=True``: a line the terminal shows too, whatever the sink does with it.
    """
    _sink.story(message, *args, level=level, terminal=terminal)


def publish_table(key: str, rows: list[dict[str, Any]], description: str = "") -> None:
    """A table for the run's viewers (the leaderboard, pass rates), under ``key``."""
    _sink.publish_table(key, rows, description)


def publish_markdown(key: str, markdown: str, description: str = "") -> None:
    """A markdown note for the run's viewers, under ``key``."""
    _sink.publish_markdown(key, markdown, description)


def publish_link(key: str, link: str, text: str, description: str = "") -> None:
    """A link for the run's viewers (the report page), under ``key``."""
    _sink.publish_link(key, link, text, description)
