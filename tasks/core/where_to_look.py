"""Where a finished run's results are: the report, the viewer command, the flow run's page.

The terminal prints these under the leaderboard, and the run's summary in the Prefect UI carries
the same: the report as a link a browser opens (``file://`` for a local run folder, the URI
itself on object storage), and ``refusalbench view`` with the run folder, quoted for a shell.
"""

from __future__ import annotations

import shlex
from pathlib import Path


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def report_link(uri: str) -> str:
    """A link to the report: ``file://`` + its absolute path for a local one, else the URI (``s3://...``)."""
    if "://" in uri:
        return uri
    return Path(uri).resolve().as_uri()


def view_command(run_folder: str) -> str:
    """The command that opens ``run_folder`` in the viewer, ready to paste into a shell."""
    folder = run_folder if is_remote(run_folder) else str(Path(run_folder.removeprefix("file://")).resolve())
    return f"refusalbench view {shlex.quote(folder)}"


def where_to_look(report: str, run_folder: str, flow_run_page: str | None, metrics: str | None = None) -> list[str]:
    """The lines the terminal prints after a run's table: metrics, report, viewer, Prefect page."""
    lines = [f"metrics:   {metrics}"] if metrics else []
    lines += [f"report:    {report}", f"explore:   {view_command(run_folder)}"]
    if flow_run_page:
        lines.append(f"Prefect:   {flow_run_page}")
    return lines


def summary_markdown(title: str, table: str, report: str, run_folder: str) -> str:
    """A run's summary for the Prefect UI: its table (markdown), the viewer command and the report's link."""
    return "\n".join(
        [
            f"# {title}",
            "",
            table.rstrip(),
            "",
            "## Explore the items",
            "",
            "```",
            view_command(run_folder),
            "```",
            "",
            "## Report",
            "",
            f"[{Path(report).name}]({report_link(report)})",
            "",
        ]
    )
