"""``refusalbench contamination``: a static benchmark against a fresh round of its strata (``flows/contamination.py``).

It prints, per model and metric, the static and fresh scores, the gap with its 95% interval, the
adjusted p-value and the flag, then where to look: contamination.json, contamination.html and the
``refusalbench view`` command that opens both run folders with the comparison.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from refusalbench.tasks.core.text_table import Cell, Column, fit_table, plain_lines
from refusalbench.tasks.core.where_to_look import report_link, view_command


def contamination_lines(document: Mapping[str, Any], width: int = 100) -> list[str]:
    """The terminal's table of a ``contamination.json``, and one line per flagged model."""
    from refusalbench.tasks.refusalbench.rounds.contamination import TERMINAL_HEADER, terminal_rows

    columns = [Column(h, "left" if i < 2 else "right") for i, h in enumerate(TERMINAL_HEADER)]
    table = fit_table(columns, [[Cell(c) for c in row] for row in terminal_rows(document)], width)
    flagged = sorted(m for m, e in document.get("models", {}).items() if e.get("flagged"))
    verdict = (
        f"flagged (significantly lower on fresh items, FDR {document.get('fdr')}): {', '.join(flagged)}"
        if flagged
        else f"no model flagged (FDR {document.get('fdr')})"
    )
    return [*plain_lines(table), verdict]


def contamination(
    static: str = typer.Option(
        ..., "--static", help="static benchmark: a released file or an earlier benchmark.parquet"
    ),
    config: Path | None = typer.Option(None, "--config", help="run config: its targets, judge and generation"),
    out_dir: str = typer.Option(..., "--out", help="folder for static/, fresh/, contamination.json and .html"),
    seed: int | None = typer.Option(None, "--seed", help="override generation.seed for the fresh round"),
) -> None:
    """Static set vs a fresh round of its strata: which models score lower on items they cannot have seen."""
    import json

    from refusalbench.flows.cli_registry import config_path
    from refusalbench.flows.launch import run_contamination
    from refusalbench.tasks.core.store import split_uri

    result = run_contamination(str(config_path(config)), static, out_dir, seed)
    store, name = split_uri(result.document)
    width = shutil.get_terminal_size((100, 24)).columns
    for line in contamination_lines(json.loads(store.read_text(name)), width):
        typer.echo(line)
    typer.echo(f"contamination: {result.document}")
    typer.echo(f"report:        {report_link(result.report)}")
    typer.echo(f"explore:       {view_command(out_dir)}")
