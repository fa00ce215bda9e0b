"""Tables for the terminal, fitted to a width: the one fitter of every table the CLI prints.

A cell is a value and, optionally, its detail (an interval) in forms from the fullest to the
shortest (``[50.0, 75.0]``, ``50.0–75.0``, ``50–75``). :func:`fit_table` takes the first layout
that fits the width, giving way in this order:

1. the detail beside the value, then under it (each row two lines) in ever shorter forms;
2. the columns that may go (``Column.drop``: the highest rank first, the rightmost among equals),
   until the table fits with its free-text columns at their narrowest; the table names them;
3. free text (``Column.wrap``) wrapped over lines, the room shared out narrowest need first;
4. each row's id on a line of its own above its values.

The id (and any column that neither wraps nor drops) is never shortened: when nothing else fits,
it is the other columns that give way, and an id longer than the whole width is folded over lines
rather than cut. Headers wrap at spaces. :func:`plain_lines` renders the result as text (for a
pipe, a file, a CI log); a terminal may draw the same :class:`FittedTable` with its own styling.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence

GAP = 2  # spaces between columns
WRAP_MIN = 20  # narrowest a wrapping column gets before columns are left out instead


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
    """A column: ``drop`` its rank in leaving out (0: always shown; the highest goes first);
    ``wrap``: free text that may wrap over lines (else shown whole)."""

    header: str
    align: str = "right"  # "left" or "right"
    drop: int = 0
    wrap: bool = False


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
    left_out: tuple[str, ...] = ()  # headers of the columns left out (width 0) for lack of room

    def header_height(self) -> int:
        return max((len(lines) for lines in self.headers), default=0)


def _header_lines(header: str, width: int) -> tuple[str, ...]:
    return tuple(textwrap.wrap(header, width=width, break_long_words=False)) or ("",)


@dataclasses.dataclass(frozen=True)
class _Try:
    """One layout to try: detail inline or under the value and its form, the columns left out,
    the widths wrapping columns get (none: their natural width), the id stacked or not."""

    inline: bool
    form: int
    hidden: frozenset[int] = frozenset()
    wraps: tuple[tuple[int, int], ...] = ()
    stacked: bool = False


def _value_lines(text: str, width: int | None) -> list[str]:
    lines = text.splitlines() or [""]
    if width is None:
        return lines
    return [part for line in lines for part in (textwrap.wrap(line, width=max(width, 1)) or [""])]


def _layout(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], key: int, attempt: _Try
) -> tuple[list[int], list[list[list[str]]]]:
    """Column widths and row lines of one layout (before any check against the width)."""
    wraps = dict(attempt.wraps)
    laid: list[list[list[str]]] = []
    for row in rows:
        cells: list[list[str]] = []
        for index, cell in enumerate(row):
            if index in attempt.hidden or (attempt.stacked and index == key):
                cells.append([""])
                continue
            detail = cell.detail(attempt.form)
            if attempt.inline:
                cells.append(_value_lines(f"{cell.text} {detail}".strip(), wraps.get(index)))
            else:
                cells.append(_value_lines(cell.text, wraps.get(index)) + ([detail] if detail else []))
        height = max((len(lines) for lines in cells), default=1)
        laid.append([[lines[i] if i < len(lines) else "" for lines in cells] for i in range(height)])
    widths = []
    for index, column in enumerate(columns):
        if index in attempt.hidden or (attempt.stacked and index == key):
            widths.append(0)
            continue
        cells_w = [len(line[index]) for row in laid for line in row]
        words = [len(word) for word in column.header.split()] or [0]
        widths.append(max([*cells_w, max(words)]))
    return widths, laid


def _total(widths: Sequence[int]) -> int:
    shown = [w for w in widths if w]
    return sum(shown) + GAP * (len(shown) - 1)


def _narrowest(columns: Sequence[Column], natural: Sequence[int], hidden: frozenset[int]) -> int:
    """The table's width with its wrapping columns at their narrowest."""
    least = [
        0 if i in hidden else (min(w, WRAP_MIN) if c.wrap else w) for i, (c, w) in enumerate(zip(columns, natural))
    ]
    return _total(least)


def _wrapped(
    columns: Sequence[Column], natural: Sequence[int], hidden: frozenset[int], width: int
) -> tuple[tuple[int, int], ...]:
    """Widths of the wrapping columns sharing the room the others leave, the narrowest need first."""
    folding = sorted((i for i, c in enumerate(columns) if c.wrap and i not in hidden), key=lambda i: natural[i])
    fixed = [0 if i in hidden or i in folding else w for i, w in enumerate(natural)]
    shown = sum(1 for i in range(len(columns)) if i not in hidden)
    room = width - sum(fixed) - GAP * (shown - 1)
    wraps = []
    for n, i in enumerate(folding):
        share = max(min(natural[i], WRAP_MIN), room // (len(folding) - n))
        wraps.append((i, min(natural[i], share)))
        room -= wraps[-1][1]
    return tuple(wraps)


def _attempts(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], key: int, width: int) -> list[_Try]:
    """The layouts in the order the module gives, each tried only when the ones before do not fit."""
    forms = max((len(cell.details) for row in rows for cell in row), default=0)
    tries = [_Try(True, 0)] + [_Try(False, form) for form in range(max(forms, 1))]
    last = tries[-1]
    natural, _ = _layout(columns, rows, key, last)
    hidden: frozenset[int] = frozenset()
    droppable = [i for i, c in enumerate(columns) if c.drop > 0]
    while _narrowest(columns, natural, hidden) > width and droppable:
        # The highest rank first; among equals the rightmost.
        victim = max(reversed(droppable), key=lambda i: columns[i].drop)
        droppable.remove(victim)
        hidden |= {victim}
        tries.append(dataclasses.replace(last, hidden=hidden))
    wraps = _wrapped(columns, natural, hidden, width)
    if wraps:
        tries.append(dataclasses.replace(last, hidden=hidden, wraps=wraps))
    # Stacked, the detail forms again from the fullest: with the id out of the row, more may fit.
    final = tries[-1]
    return tries + [dataclasses.replace(final, inline=False, form=form, stacked=True) for form in range(max(forms, 1))]


def fit_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, key: int = 0) -> FittedTable:
    """The first layout of ``rows`` under ``columns`` that fits ``width`` characters (see the module).

    ``key``: the index of the id column, which is never cut.
    """
    tries = _attempts(columns, rows, key, width)
    for attempt in tries:
        widths, laid = _layout(columns, rows, key, attempt)
        if _total(widths) <= width or attempt == tries[-1]:
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
        stacked=attempt.stacked,
        key_lines=keys if attempt.stacked else (),
        width=_total(widths),
        left_out=tuple(columns[i].header for i in sorted(attempt.hidden)),
    )


def _line(table: FittedTable, cells: Sequence[str]) -> str:
    parts = [
        cell.ljust(width) if column.align == "left" else cell.rjust(width)
        for cell, width, column in zip(cells, table.widths, table.columns)
        if width  # a stacked table's id column and the columns left out have width 0
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
