"""How every listing command prints its rows: ``--format table|csv|json``, one renderer for all.

``table`` fits the terminal: the width of a terminal, ``COLUMNS`` when set, else 80 columns (a
pipe or a file behaves as an 80-column terminal, so what a script sees does not depend on who
ran it). The layout is the one table fitter's (``core.text_table``), as the leaderboard's: key
columns (an id, a model name) are never cut or wrapped; when the row does not fit, the least
important columns are left out first and the table says which, and the others wrap.
Cells never show Python literals: nothing is ``-``, a flag is yes/no, a list is comma-joined.
``csv`` and ``json`` carry every column and value as they are, for programs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from refusalbench.tasks.core.text_table import GAP, Cell, FittedTable, fit_table, plain_lines
from refusalbench.tasks.core.text_table import Column as TableColumn

NARROW = 80  # the width of a pipe, a file or an unknown terminal
EMPTY = "—"  # as the leaderboard shows an undefined value


class ListFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


FORMAT_HELP = "table (fits the terminal, 80 columns when piped), csv or json (every column)"


@dataclass(frozen=True)
class Column:
    """One column of a listing.

    ``key``: the row's key; ``header``: its title (default: the key); ``keep``: never cut or
    wrapped (ids, names): shown whole or left out; ``drop``: order of leaving out when the
    table is too wide (0: always shown; the highest goes first).
    """

    key: str
    header: str | None = None
    keep: bool = False
    drop: int = 0

    @property
    def title(self) -> str:
        return self.header or self.key


def cell(value: Any) -> str:
    """A value as a person reads it in a table cell."""
    if value is None or value == "" or (isinstance(value, float) and not math.isfinite(value)):
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items()) or EMPTY
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(cell(v) for v in value) or EMPTY
    return str(value)


def output_width() -> int:
    """Columns to fill: ``COLUMNS`` when set, the terminal's width on a terminal, else 80."""
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((NARROW, 24)).columns
    return NARROW


def key_index(columns: Sequence[Column]) -> int:
    """The id column: the first column kept whole (else the first)."""
    return next((i for i, c in enumerate(columns) if c.keep), 0)


def fitted(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]], width: int) -> FittedTable:
    """The rows laid out ``width`` wide by the one table fitter (``core.text_table``): key columns
    whole, the others wrapping, the highest ``drop`` left out first."""
    fit = [TableColumn(c.title, align="left", drop=c.drop, wrap=not c.keep) for c in columns]
    cells = [[Cell(cell(row.get(c.key))) for c in columns] for row in rows]
    return fit_table(fit, cells, width, key=key_index(columns))


def rich_table(table: FittedTable) -> Table:
    """A fitted table drawn by rich for a terminal: the same columns and widths, a bold header."""
    drawn = Table(box=None, padding=(0, GAP // 2), pad_edge=False, header_style="bold")
    shown = [i for i, width in enumerate(table.widths) if width]
    for i in shown:
        column = table.columns[i]
        drawn.add_column(
            "\n".join(table.headers[i]),
            justify="left" if column.align == "left" else "right",
            width=table.widths[i],
            no_wrap=True,
            vertical="bottom",
        )
    for row in table.rows:
        drawn.add_row(*("\n".join(line[i] for line in row) for i in shown))
    return drawn


def print_fitted(out: Console, table: FittedTable, note: Sequence[str] = ()) -> None:
    """A fitted table on ``out``: drawn by rich on a terminal, as plain lines elsewhere (a stacked
    table, each id on a line of its own, has no rich form: it prints as text there too)."""
    if out.is_terminal and not table.stacked:
        out.print(rich_table(table))
    else:
        for line in plain_lines(table):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in note:
        out.print(line, markup=False, highlight=False, style="dim" if out.is_terminal else None)


def table_text(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], *, title: str | None, width: int, color: bool = False
) -> str:
    """The rows as a table at most ``width`` columns wide (when the key columns fit)."""
    table = fitted(columns, rows, width)
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, force_terminal=color, no_color=not color, highlight=False, emoji=False, markup=False
    )
    if title:
        console.print(Text(title, style="bold" if color else ""))
    note = []
    if table.left_out:
        note.append(
            f"({', '.join(table.left_out)} left out at {width} columns; --format csv or json shows every column)"
        )
    print_fitted(console, table, note)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def csv_text(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """Every key as a CSV column; lists and mappings as JSON, nothing as an empty cell."""

    def value(v: Any) -> Any:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return ""
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple, dict)):
            return json.dumps(v, default=str, ensure_ascii=False)
        return v

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(keys)
    for row in rows:
        writer.writerow([value(row.get(k)) for k in keys])
    return buffer.getvalue()


def all_keys(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> list[str]:
    """The table's columns first, then every other key the rows carry, in first-seen order."""
    keys = dict.fromkeys(c.key for c in columns)
    for row in rows:
        keys.update(dict.fromkeys(row))
    return list(keys)


def _plain(value: Any) -> Any:
    """JSON has no NaN: an undefined number is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def render(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    fmt: ListFormat,
    *,
    title: str | None = None,
    width: int | None = None,
    color: bool = False,
) -> str:
    """The listing in ``fmt``: a table for people, CSV or JSON (every key of the rows) for programs."""
    if fmt == ListFormat.json:
        return json.dumps([_plain(dict(r)) for r in rows], indent=2, default=str, ensure_ascii=False) + "\n"
    if fmt == ListFormat.csv:
        return csv_text(rows, all_keys(rows, columns))
    return table_text(rows, columns, title=title, width=width or output_width(), color=color)


def print_listing(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], fmt: ListFormat, *, title: str | None = None
) -> None:
    """``render`` to standard output (a table in colour only on a terminal)."""
    sys.stdout.write(render(rows, columns, fmt, title=title, color=fmt == ListFormat.table and sys.stdout.isatty()))
