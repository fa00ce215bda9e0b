"""Tables for the terminal: fitted to a width, with the id column never cut.

A cell is a value and, optionally, its detail (an interval) in forms from the fullest to the
shortest (``[50.0, 75.0]``, ``50.0–75.0``, ``50–75``). :func:`fit_table` takes the first layout
that fits the width: the detail beside the value, then under it (each row two lines) in ever
shorter forms, then each row's id on a line of its own above its values. The id is never
shortened: when nothing else fits, it is the other columns that give way, and an id longer than
the whole width is folded over lines rather than cut. Headers wrap at spaces.
:func:`plain_lines` renders the result as text (for a pipe, a file, a CI log); a terminal may
draw the same :class:`FittedTable` with its own styling.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence

GAP = 2  # spaces between columns


@dataclasses.dataclass(frozen=True)
class Cell:
    """A value and its detail forms (fullest first; none: no detail)."""

    text: str
    details: tuple[str, ...] = ()

    def detail(self, form: int) -> str:
        if not self.details:
            return ""
        return self.details[min(form, len(self.details) - 1)]


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    align: str = "right"  # "left" or "right"


@dataclasses.dataclass(frozen=True)
class FittedTable:
    """A table laid out for a width: per column its width and header lines, per row its lines.

    ``rows[i]`` is a list of lines, each a list of one string per column. ``stacked``: each row's
    id (``key_lines[i]``) comes on its own line(s) above its values, and the id column is empty.
    """

    columns: tuple[Column, ...]
    widths: tuple[int, ...]
    headers: tuple[tuple[str, ...], ...]  # per column, its header's lines
    rows: tuple[tuple[tuple[str, ...], ...], ...]
    stacked: bool = False
    key_lines: tuple[tuple[str, ...], ...] = ()
    width: int = 0  # the widest line

    def header_height(self) -> int:
        return max((len(lines) for lines in self.headers), default=0)


def _header_lines(header: str, width: int) -> tuple[str, ...]:
    return tuple(textwrap.wrap(header, width=width, break_long_words=False)) or ("",)


def _layout(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], key: int, *, inline: bool, form: int, stacked: bool
) -> tuple[list[int], list[list[list[str]]]]:
    """Column widths and row lines of one layout (before any check against the width)."""
    laid: list[list[list[str]]] = []
    for row in rows:
        first, second = [], []
        for index, cell in enumerate(row):
            if stacked and index == key:
                first.append("")
                second.append("")
                continue
            detail = cell.detail(form)
            if inline:
                first.append(f"{cell.text} {detail}".strip())
                second.append("")
            else:
                first.append(cell.text)
                second.append(detail)
        laid.append([first, second] if any(second) else [first])
    widths = []
    for index, column in enumerate(columns):
        cells = [len(line[index]) for row in laid for line in row]
        words = [len(word) for word in column.header.split()] or [0]
        widths.append(max([*cells, max(words)]))
    return widths, laid


def _total(widths: Sequence[int]) -> int:
    shown = [w for w in widths if w]
    return sum(shown) + GAP * (len(shown) - 1)


def fit_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, key: int = 0) -> FittedTable:
    """The first layout of ``rows`` under ``columns`` that fits ``width`` characters (see the module).

    ``key``: the index of the id column, which is never cut.
    """
    forms = max((len(cell.details) for row in rows for cell in row), default=0)
    attempts = [(True, 0, False)] + [(False, form, False) for form in range(max(forms, 1))]
    attempts += [(False, form, True) for form in range(max(forms, 1))]
    for inline, form, stacked in attempts:
        widths, laid = _layout(columns, rows, key, inline=inline, form=form, stacked=stacked)
        if stacked:
            widths[key] = 0  # the id has lines of its own: its column is left out
        if _total(widths) <= width or (inline, form, stacked) == attempts[-1]:
            break
    keys = tuple(
        tuple(textwrap.wrap(row[key].text, width=max(width, 1), break_long_words=True, break_on_hyphens=False))
        for row in rows
    )
    return FittedTable(
        columns=tuple(columns),
        widths=tuple(widths),
        headers=tuple(_header_lines(c.header, w) if w else ("",) for c, w in zip(columns, widths)),
        rows=tuple(tuple(tuple(line) for line in row) for row in laid),
        stacked=stacked,
        key_lines=keys if stacked else (),
        width=_total(widths),
    )


def _line(table: FittedTable, cells: Sequence[str]) -> str:
    parts = [
        cell.ljust(width) if column.align == "left" else cell.rjust(width)
        for cell, width, column in zip(cells, table.widths, table.columns)
        if width  # a stacked table's id column has width 0: left out
    ]
    return (" " * GAP).join(parts).rstrip()


def plain_lines(table: FittedTable) -> list[str]:
    """The table as plain text lines: headers (bottom-aligned), a rule, then the rows."""
    height = table.header_height()
    padded = [("",) * (height - len(lines)) + lines for lines in table.headers]
    out = [_line(table, [lines[i] for lines in padded]) for i in range(height)]
    out.append(_line(table, ["-" * width for width in table.widths]))
    for index, row in enumerate(table.rows):
        if table.stacked:
            out.extend(table.key_lines[index])
        out.extend(_line(table, line) for line in row)
    return out
