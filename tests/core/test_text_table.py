"""The one table fitter: details shortened, then columns left out by rank, then free text wrapped,
then the id stacked; the id is never cut and the table never exceeds its width when the id fits."""

from __future__ import annotations

from refusalbench.tasks.core.text_table import WRAP_MIN, Cell, Column, fit_table, plain_lines

COLUMNS = [
    Column("id", align="left"),
    Column("kind", align="left", drop=1),
    Column("where", align="left", drop=2),
    Column("note", align="left", wrap=True),
]
ROWS = [
    [Cell("model-with-a-long-id"), Cell("api"), Cell("https://example.invalid/v1"), Cell("word " * 20)],
    [Cell("short"), Cell("local"), Cell("—"), Cell("fine")],
]


def test_a_wide_table_shows_everything_on_one_line_per_row():
    table = fit_table(COLUMNS, ROWS, 400)
    assert table.left_out == () and not table.stacked
    assert len(plain_lines(table)) == 2 + len(ROWS)


def test_columns_go_by_rank_before_free_text_wraps():
    table = fit_table(COLUMNS, ROWS, 70)
    lines = plain_lines(table)
    assert table.left_out == ("where",)  # drop 2 first: then it fits with the note wrapped
    assert max(len(line) for line in lines) <= 70
    assert "model-with-a-long-id" in lines[2]  # the id whole, on its row's first line
    assert sum("word" in line for line in lines) > 1  # the note wrapped over lines


def test_when_nothing_else_gives_way_the_id_gets_lines_of_its_own():
    narrow = WRAP_MIN + 3
    table = fit_table(COLUMNS, ROWS, narrow)
    assert table.left_out == ("kind", "where") and table.stacked
    lines = plain_lines(table)
    assert "model-with-a-long-id" in lines and max(len(line) for line in lines) <= narrow
