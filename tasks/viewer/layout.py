"""The viewer's page shell and the small HTML pieces every page uses.

Every page is one self-contained document: its CSS and JavaScript are inlined (no CDN, no
network: the viewer works offline). Every data string goes through :func:`esc` or
:func:`url`; nothing from a run folder reaches the page unescaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from refusalbench.tasks.viewer.data import CORRECT, NOT_SCORED, WRONG


@cache
def _asset(name: str) -> str:
    return resources.files("refusalbench.tasks.viewer").joinpath(name).read_text(encoding="utf-8")


def esc(value: Any) -> str:
    """Any value as escaped HTML text; None and NaN as an empty string."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return html.escape(str(value), quote=True)


def url(path: str, params: Mapping[str, str] | None = None) -> str:
    """A same-origin URL, its path segments and query escaped (for an ``href``, escaped again by the caller)."""
    query = urlencode(params or {})
    return path + (f"?{query}" if query else "")


def segment(value: Any) -> str:
    """One path segment (a run name, an item id), percent-encoded."""
    return quote(str(value), safe="")


def page(title: str, body: str, runs: Sequence[tuple[str, str]] = (), compare: bool = False) -> str:
    """A whole document: the top bar (home, each run's items, compare) and ``body``.

    ``runs``: (name, method) of every run served, for the top bar.
    """
    links = "".join(f'<a href="{esc(url("/runs/" + segment(name) + "/items"))}">{esc(name)}</a>' for name, _ in runs)
    compare_link = '<a href="/compare">compare runs</a>' if compare else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · refusalbench view</title><style>{_asset('viewer.css')}</style></head><body>"
        f'<header class="top"><a class="brand" href="/">refusalbench view</a>{links}{compare_link}</header>'
        f"<main>{body}</main><script>{_asset('viewer.js')}</script></body></html>"
    )


VERDICT_CLASS = {CORRECT: "v-correct", WRONG: "v-wrong", NOT_SCORED: "v-not-scored"}
VERDICT_MARK = {CORRECT: "✓", WRONG: "✗", NOT_SCORED: "–"}


def badge(text: Any, verdict: str | None = None, title: str | None = None) -> str:
    css = VERDICT_CLASS.get(verdict or "", "")
    tip = f' title="{esc(title)}"' if title else ""
    return f'<span class="badge {css}"{tip}>{esc(text)}</span>'


def short_decision(decision: str | None) -> str:
    """A decision (or expected behaviour) short enough for a table cell: ``answer``, or ⊘ and the refusal
    code's first word (``⊘ missing``)."""
    if not decision:
        return ""
    if decision == "ANSWER":
        return "answer"
    if decision == "ANSWER_CORRECTLY":
        return "answer"
    words = decision.removeprefix("REFUSE_").lower().split("_")
    return "⊘ " + ("missing" if words[0] == "info" else words[0])


def table(
    headers: Sequence[str | tuple[str, str]], rows: Iterable[Sequence[str]], *, sortable: bool = False, css: str = ""
) -> str:
    """An HTML table of ready-made cells (each ``<td>...</td>``); a header is its text or (text, th class)."""
    heads = []
    for header in headers:
        text, cls = header if isinstance(header, tuple) else (header, "")
        cls = " ".join(c for c in (cls, "sortable" if sortable else "") if c)
        heads.append(f'<th class="{cls}">{esc(text)}</th>' if cls else f"<th>{esc(text)}</th>")
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    classes = " ".join(c for c in ("sortable" if sortable else "", css) if c)
    return (
        f'<div class="scroll"><table class="{classes}"><thead><tr>{"".join(heads)}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def td(content: str, cls: str = "", value: Any = None) -> str:
    """A cell of ready HTML; ``value``: what sorting compares (data-v)."""
    attrs = f' class="{cls}"' if cls else ""
    if value is not None:
        attrs += f' data-v="{esc(value)}"'
    return f"<td{attrs}>{content}</td>"


def facts(pairs: Iterable[tuple[str, Any]], *, inline: bool = False) -> str:
    """A definition list of the pairs whose value (ready HTML) is present; ``inline``: side by side, wrapping."""
    shown = [(k, v) for k, v in pairs if v not in (None, "")]
    if not shown:
        return ""
    if inline:
        items = "".join(f"<div><dt>{esc(k)}</dt><dd>{v}</dd></div>" for k, v in shown)
        return f'<dl class="facts inline">{items}</dl>'
    return f'<dl class="facts">{"".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in shown)}</dl>'


def text_block(text: Any) -> str:
    """Long text (a reply, a context) as a wrapped block."""
    return f'<div class="text">{esc(text)}</div>'


def options(name: str, label: str, values: Sequence[str], chosen: str, any_label: str = "any") -> str:
    """A filter's ``<select>`` (its first option: no filter)."""
    opts = [f'<option value="">{esc(any_label)}</option>']
    opts += [f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(v)}</option>' for v in values]
    return f'<label>{esc(label)}<select name="{esc(name)}">{"".join(opts)}</select></label>'


def pager(path: str, params: Mapping[str, str], page_number: int, pages: int, total: int, noun: str) -> str:
    """Previous / next links around "page N of M (T items)"."""

    def link(to: int, text: str) -> str:
        return f'<a href="{esc(url(path, {**params, "page": str(to)}))}" rel="{text}">{esc(text)}</a>'

    previous = link(page_number - 1, "previous") if page_number > 1 else '<span class="muted">previous</span>'
    following = link(page_number + 1, "next") if page_number < pages else '<span class="muted">next</span>'
    return (
        f'<div class="pager">{previous}<span>page {page_number} of {pages} '
        f'(<span class="total">{total}</span> {esc(noun)})</span>{following}</div>'
    )
