"""How every listing command prints its rows: ``--format table|csv|json``, one renderer for all.

``table`` fits the terminal: the width of a terminal, ``COLUMNS`` when set, else 80 columns (a
pipe or a file behaves as an 80-column terminal, so what a script sees does not depend on who
ran it). Key columns (an id, a model name) are never cut or wrapped; when the row does not fit,
the least important columns are left out first and the table says which, and the others wrap.
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

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

NARROW = 80  # the width of a pipe, a file or an unknown terminal
EMPTY = "—"  # as the leaderboard shows an undefined value
FOLD_MIN = 20  # narrowest a wrapping column gets before it is left out instead


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


def _overhead(n: int) -> int:
    # box.SIMPLE_HEAD without edges: one padding space each side of a column, one divider between.
    return max(0, 3 * n - 3)


def fit_columns(
    columns: Sequence[Column], rows: Sequence[Mapping[str, Any]], width: int
) -> tuple[list[tuple[Column, int]], list[Column]]:
    """The columns shown with their widths, and the ones left out, for a table ``width`` wide."""
    natural = {
        c.key: max([len(c.title), *(max(len(line) for line in cell(r.get(c.key)).splitlines() or [""]) for r in rows)])
        for c in columns
    }
    least = {c.key: natural[c.key] if c.keep else min(natural[c.key], FOLD_MIN) for c in columns}
    shown = list(columns)
    left_out: list[Column] = []
    while sum(least[c.key] for c in shown) + _overhead(len(shown)) > width:
        droppable = [c for c in shown if c.drop > 0]
        if not droppable:
            break
        # The highest drop rank first; among equals the rightmost.
        victim = max(reversed(droppable), key=lambda c: c.drop)
        shown.remove(victim)
        left_out.append(victim)
    # Whatever room is left goes to the wrapping columns, the narrowest need served first.
    room = width - _overhead(len(shown)) - sum(natural[c.key] for c in shown if c.keep)
    widths = {c.key: natural[c.key] for c in shown if c.keep}
    folding = sorted((c for c in shown if not c.keep), key=lambda c: natural[c.key])
    for i, c in enumerate(folding):
        share = max(least[c.key], room // (len(folding) - i))
        widths[c.key] = min(natural[c.key], share)
        room -= widths[c.key]
    return [(c, widths[c.key]) for c in shown], [c for c in columns if c in left_out]


def table_text(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], *, title: str | None, width: int, color: bool = False
) -> str:
    """The rows as a table at most ``width`` columns wide (when the key columns fit)."""
    shown, left_out = fit_columns(columns, rows, width)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")
    for column, w in shown:
        table.add_column(column.title, width=w, no_wrap=column.keep, overflow="fold")
    for row in rows:
        table.add_row(*[Text(cell(row.get(column.key))) for column, _ in shown])
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, force_terminal=color, no_color=not color, highlight=False, emoji=False, markup=False
    )
    console.print(table)
    if left_out:
        names = ", ".join(c.title for c in left_out)
        console.print(Text(f"({names} left out at {width} columns; --format csv or json shows every column)"))
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
