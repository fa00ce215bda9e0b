"""HTML building blocks of both methods' report pages: style sheet, escaping, tables,
sections, the table of contents and readable headings (charts: ``core.charts``).

Every piece of text that comes from data — model names, group values, manifest entries —
goes through :func:`escape` (``html.escape``) before it reaches the page. Each section carries
an id made from its title (:func:`anchor`), which :func:`table_of_contents` links to; a key
of a data file becomes a heading through :func:`readable_heading`, never as it is written.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
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
pre.wrap,td.wrap{white-space:pre-wrap;overflow-wrap:anywhere} td.wrap{max-width:40rem}
nav.toc{background:#f8f8f8;border:1px solid #ddd;padding:.4rem 1rem;margin:1rem 0}
nav.toc ol{columns:2;margin:.3rem 0} .card{border:1px solid #ccc;border-radius:6px;padding:.4rem 1rem;margin:1rem 0}
.card th{width:12rem} .warn{color:#a33} .insufficient{color:#777;font-style:italic}
details>summary{cursor:pointer;font-weight:600}
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


def anchor(title: str) -> str:
    """The id of a section titled ``title``: lower-case words joined by hyphens ("section" if none)."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower())) or "section"


def section(title: str, body: str) -> str:
    """A titled section of the page, with the id :func:`anchor` gives its title (the table of
    contents links to it); ``body`` is HTML already escaped."""
    return f"<section id='{anchor(title)}'><h2>{escape(title)}</h2>{body}</section>"


_SECTION_HEAD = re.compile(r"<section id='([^']*)'><h2>(.*?)</h2>", re.S)


def table_of_contents(sections: Sequence[str]) -> tuple[str, list[str]]:
    """A ``<nav>`` listing every section made by :func:`section`, each a link to its id, and the
    sections themselves, a repeated id numbered (``-2``, ``-3``) so that every link has one target."""
    seen: dict[str, int] = {}
    entries, out = [], []
    for html_text in sections:
        match = _SECTION_HEAD.match(html_text)
        if not match:
            out.append(html_text)
            continue
        base, title = match.groups()
        seen[base] = seen.get(base, 0) + 1
        ident = base if seen[base] == 1 else f"{base}-{seen[base]}"
        out.append(f"<section id='{ident}'>" + html_text[len(f"<section id='{base}'>") :])
        entries.append(f"<li><a href='#{ident}'>{title}</a></li>")
    if not entries:
        return "", out
    return f"<nav class='toc' aria-label='Contents'><b>Contents</b><ol>{''.join(entries)}</ol></nav>", out


def readable_heading(key: str, titles: Mapping[str, str] | None = None) -> str:
    """A data key as a reader's heading: its entry in ``titles``, else its words ("judged_counts"
    -> "Judged counts"); text that is not a key (spaces, capitals) is kept as it is."""
    if titles and key in titles:
        return titles[key]
    if not re.fullmatch(r"[a-z0-9_./-]+", key):
        return key
    words = key.replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def insufficient_data(n_units: int) -> str:
    """What a cell shows in place of an interval, standard error or mark that too few units support."""
    return f"<span class='insufficient'>insufficient data (n = {int(n_units)})</span>"


def summary_card(rows: Sequence[tuple[str, str]], warnings: Sequence[str] = ()) -> str:
    """The box at the top of a page: (label, HTML value) rows, then the warnings (plain text), each
    marked; "none" when there are none."""
    body = "".join(
        f"<tr><th class='name'>{escape(label)}</th><td class='name'>{value}</td></tr>" for label, value in rows
    )
    items = "".join(f"<li class='warn'>{escape(w)}</li>" for w in warnings)
    listed = f"<ul>{items}</ul>" if items else "<p>None.</p>"
    return section("Summary", f"<div class='card'><table>{body}</table><b>Warnings</b>{listed}</div>")


def folded(summary: str, body: str, open_: bool = False) -> str:
    """``body`` behind a ``<details>`` element whose ``summary`` (plain text) opens it."""
    return f"<details{' open' if open_ else ''}><summary>{escape(summary)}</summary>{body}</details>"


def mapping_html(data: Mapping[str, Any], heading: Callable[[str], str] = readable_heading) -> str:
    """A dict as tables: dict-of-dicts -> matrix, dict of scalars -> two columns, else JSON; each
    nested entry under ``heading(key)``."""
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
        parts.append(f"<h3>{escape(heading(str(key)))}</h3>")
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            frame = pd.DataFrame.from_dict(value, orient="index")
            frame.insert(0, "", frame.index.astype(str))
            parts.append(frame_table(frame))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            parts.append(frame_table(pd.DataFrame.from_records(value)))
        else:
            parts.append(f"<pre>{escape(json.dumps(value, indent=2, default=str))}</pre>")
    return "".join(parts)


def run_kind_and_status(manifest: Mapping[str, Any]) -> str:
    """A summary card's run kind, with the status only where the run did not end well ("evaluate",
    "evaluate, failed"): a report written by the run itself sees it still running."""
    kind, status = str(manifest.get("kind", "?")), manifest.get("status")
    return kind if status in (None, "completed", "running") else f"{kind}, {status}"
