"""HTML building blocks of both methods' report pages: style sheet, escaping, tables,
sections (charts: ``core.charts``).

Every piece of text that comes from data — model names, group values, manifest entries —
goes through :func:`escape` (``html.escape``) before it reaches the page.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;
     padding:0 1rem;color:#222;line-height:1.45}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.3rem .55rem;text-align:right}
th{background:#f4f4f4} td.name,th.name{text-align:left}
tr:nth-child(even) td{background:#fafafa}
.ci{color:#777;font-size:.8em} .note{color:#555;font-style:italic}
.figs{display:flex;flex-wrap:wrap;gap:1rem} img{max-width:100%;height:auto}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:.85rem}
"""


def is_nan(value: Any) -> bool:
    """True for None and float NaN: an undefined value (a page shows it as —)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def escape(value: Any) -> str:
    """Any value as HTML-safe text (quotes escaped too, so it may sit in an attribute)."""
    return html.escape(str(value), quote=True)


def _cell(value: Any) -> str:
    if is_nan(value):
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return escape(json.dumps(value, default=str))
    return escape(value)


def frame_table(frame: pd.DataFrame, max_rows: int = 200) -> str:
    """A DataFrame as an HTML table, cut at ``max_rows`` with a note."""
    head = "".join(f"<th>{escape(c)}</th>" for c in frame.columns)
    body = []
    for record in frame.head(max_rows).itertuples(index=False):
        body.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in record) + "</tr>")
    extra = f'<p class="note">{len(frame) - max_rows} more rows not shown.</p>' if len(frame) > max_rows else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{extra}"


def section(title: str, body: str) -> str:
    """A titled section of the page; ``body`` is HTML already escaped."""
    return f"<section><h2>{escape(title)}</h2>{body}</section>"


def mapping_html(data: Mapping[str, Any]) -> str:
    """A dict as tables: dict-of-dicts -> matrix, dict of scalars -> two columns, else JSON."""
    parts = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    if scalars:
        parts.append(
            "<table>"
            + "".join(
                f"<tr><th class='name'>{escape(k)}</th><td class='name'>{_cell(v)}</td></tr>"
                for k, v in scalars.items()
            )
            + "</table>"
        )
    for key, value in data.items():
        if key in scalars:
            continue
        parts.append(f"<h3>{escape(key)}</h3>")
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            frame = pd.DataFrame.from_dict(value, orient="index")
            frame.insert(0, "", frame.index.astype(str))
            parts.append(frame_table(frame))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            parts.append(frame_table(pd.DataFrame.from_records(value)))
        else:
            parts.append(f"<pre>{escape(json.dumps(value, indent=2, default=str))}</pre>")
    return "".join(parts)
