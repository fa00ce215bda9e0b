"""The RefusalBench pages: the home page (leaderboards), the item table and the comparison of two runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from refusalbench.tasks.refusalbench.report.leaderboard import format_interval, format_value, model_ranks
from refusalbench.tasks.viewer import paper_pages
from refusalbench.tasks.viewer.compare import COMPARED, Comparison
from refusalbench.tasks.viewer.data import VERDICTS, ItemPage, ItemQuery, RefusalBenchRun
from refusalbench.tasks.viewer.layout import (
    VERDICT_MARK,
    badge,
    esc,
    options,
    pager,
    segment,
    short_decision,
    table,
    td,
    url,
)

# The leaderboard's columns: (metrics.json name, label).
LEADERBOARD = (*COMPARED, ("coverage", "Coverage"))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def leaderboard(run: RefusalBenchRun) -> str:
    """The run's models ranked by CRS, each metric with its interval; sortable by any column."""
    if not run.metrics or not run.metrics.get("models"):
        return '<p class="muted">No metrics.json in this run folder: nothing scored yet.</p>'
    metrics, intervals = run.metrics["models"], run.metrics.get("intervals") or {}
    paper = paper_pages.leaderboard_column(run, [metric for metric, _ in LEADERBOARD])
    rows = []
    for model, rank in model_ranks(metrics):
        values = metrics[model]
        cells = [
            td(esc("—" if rank is None else rank), "num", rank if rank is not None else ""),
            td(f'<a href="{esc(url(_items_path(run), {"model": model}))}">{esc(model)}</a>', value=model),
        ]
        for metric, _ in LEADERBOARD:
            value = _number(values.get(metric))
            interval = intervals.get(model, {}).get(metric)
            text = esc(format_value(value, metric))
            ci = format_interval(tuple(interval) if interval else None, metric)
            cells.append(
                td(
                    text + (f' <span class="ci">{esc(ci)}</span>' if ci else ""),
                    "num",
                    "" if math.isnan(value) else round(value, 6),
                )
            )
        n = _number(values.get("n"))
        count = 0 if math.isnan(n) else int(n)
        cells.append(td(esc(count), "num", count))
        if paper:
            cells.append(paper.get(model, td("", value="")))
        rows.append(cells)
    headers: list[str | tuple[str, str]] = [
        ("#", "num"),
        "Model",
        *((label, "num") for _, label in LEADERBOARD),
        ("n", "num"),
        *([paper_pages.COLUMN] if paper else []),
    ]
    return table(headers, rows, sortable=True, css="leaderboard") + paper_pages.reference_link()


def _items_path(run: RefusalBenchRun) -> str:
    return f"/runs/{segment(run.name)}/items"


def item_link(run_name: str, item_id: str, text: str) -> str:
    return f'<a class="item-link" href="{esc(f"/runs/{segment(run_name)}/items/{segment(item_id)}")}">{esc(text)}</a>'


def _chip(run: RefusalBenchRun, query: ItemQuery, field: str, value: Any) -> str:
    """An item's class, intensity, lever or domain: a link that filters the table to it."""
    if value in (None, ""):
        return ""
    params = query.params(page=1, **{field: str(value)})
    return f'<a class="chip" data-filter="{esc(field)}" href="{esc(url(_items_path(run), params))}">{esc(value)}</a>'


def item_rows(run: RefusalBenchRun, page: ItemPage, query: ItemQuery) -> str:
    """The item table of one page: the item's columns, then one decision cell per model."""
    rows = []
    for row in page.rows:
        cells = [
            td(item_link(run.name, row["item_id"], row["question"] or row["item_id"]), "question"),
            td(_chip(run, query, "perturbation_class", row["perturbation_class"]), "class"),
            td(_chip(run, query, "intensity", row["intensity"]), "intensity"),
            td(_chip(run, query, "lever", row["lever_id"]), "lever"),
            td(f'<span title="{esc(row["expected"])}">{esc(short_decision(row["expected"]))}</span>', "expected"),
            td(_chip(run, query, "domain", row["domain"]), "domain"),
        ]
        for model in page.models:
            cell = row["models"][model]
            if cell["decision"] is None and cell["verdict"] is None:
                cells.append(td('<span class="muted">·</span>', "cell"))
                continue
            verdict = cell["verdict"]
            tip = f"{model}: {cell['decision'] or 'no decision'} ({verdict or 'not judged'}"
            tip += f", decided by {cell['source']})" if cell["source"] else ")"
            mark = VERDICT_MARK.get(verdict or "", "")
            cells.append(
                td(badge(f"{mark} {short_decision(cell['decision'])}".strip(), verdict, tip), "cell", verdict or "")
            )
        rows.append(cells)
    headers: list[str | tuple[str, str]] = [
        "Question",
        "Class",
        "Intensity",
        "Lever",
        "Expected",
        "Domain",
        *((m, "model") for m in page.models),
    ]
    return table(headers, rows, css="items")


def filter_form(run: RefusalBenchRun, query: ItemQuery) -> str:
    choices = run.options()
    parts = [
        options("model", "Model", choices["model"], query.model, "every model"),
        options("class", "Class", choices["class"], query.perturbation_class),
        options("intensity", "Intensity", choices["intensity"], query.intensity),
        options("lever", "Lever", choices["lever"], query.lever),
        options("outcome", "Outcome", list(VERDICTS), query.outcome),
        options("domain", "Domain", choices["domain"], query.domain),
    ]
    if choices["source"]:
        parts.append(options("source", "Decided by", choices["source"], query.decision_source))
    parts.append(
        f'<label class="check"><input type="checkbox" name="disagree" value="1"'
        f"{' checked' if query.disagree else ''}> models disagree</label>"
    )
    parts.append(
        f'<label>Search question, context, replies<input type="search" name="q" value="{esc(query.q)}"'
        ' placeholder="words to find"></label>'
    )
    parts.append('<button type="submit" id="apply">Apply</button>')
    parts.append(f'<a href="{esc(_items_path(run))}">clear</a>')
    return f'<form class="filters" method="get" action="{esc(_items_path(run))}">{"".join(parts)}</form>'


def items_section(run: RefusalBenchRun, query: ItemQuery, *, with_form: bool = True) -> str:
    page = run.query(query)
    params = query.params()
    params.pop("page", None)
    body = filter_form(run, query) if with_form else ""
    body += pager(_items_path(run), params, page.page, page.pages, page.total, "items")
    body += (
        '<p class="legend">Each model\'s decision: answer, or ⊘ and its refusal code; ✓ correct, ✗ wrong, '
        "– not scored. Click a class, intensity, lever or domain to filter by it, a question to open it.</p>"
    )
    body += item_rows(run, page, query)
    if page.pages > 1:
        body += pager(_items_path(run), params, page.page, page.pages, page.total, "items")
    return body


def _run_heading(run: RefusalBenchRun) -> str:
    manifest = run.manifest or {}
    facts = [f"{len(run.items)} items", f"{len(run.models)} models"]
    if manifest.get("kind"):
        facts.append(f"{manifest['kind']} run, {manifest.get('status', '')}".strip(", "))
    if manifest.get("finished_at"):
        facts.append(f"finished {str(manifest['finished_at'])[:19]}")
    return f'<p class="muted">{esc(run.uri)} · {esc(" · ".join(facts))}</p>'


def home_section(run: RefusalBenchRun) -> str:
    """One run on the home page: its leaderboard and the first page of its items."""
    first = ItemQuery(page_size=20)
    return (
        f'<section class="run" data-run="{esc(run.name)}"><h1>{esc(run.name)}</h1>{_run_heading(run)}'
        f"<h2>Leaderboard</h2>{leaderboard(run)}"
        f'<h2>Items <a class="muted" href="{esc(_items_path(run))}">(all, with filters)</a></h2>'
        f"{items_section(run, first, with_form=False)}</section>"
    )


def items_page_body(run: RefusalBenchRun, query: ItemQuery) -> str:
    return f"<h1>{esc(run.name)}: items</h1>{_run_heading(run)}{items_section(run, query)}"


# ---------------------------------------------------------------- compare


def _signed(value: float, metric: str) -> str:
    if math.isnan(value):
        return "—"
    text = format_value(abs(value), metric)
    if text.strip("0.%") == "":
        return "±" + text
    return ("+" if value > 0 else "−") + text


def compare_form(names: Sequence[str], a: str, b: str) -> str:
    return (
        f'<form class="filters" method="get" action="/compare">{options("a", "Run A", names, a, "choose")}'
        f'{options("b", "Run B", names, b, "choose")}<button type="submit">Compare</button></form>'
    )


def _change_cell(row: dict[str, Any]) -> str:
    """One metric of one model: B − A (coloured by whether it got better), its interval, and both values."""
    metric, moved = row["metric"], row["difference"]
    better_up = metric not in ("false_refusal_rate", "missed_refusal_rate")
    trend = "" if math.isnan(moved) or abs(moved) < 5e-4 else ("delta-up" if (moved > 0) == better_up else "delta-down")
    significant = not math.isnan(row["low"]) and (row["low"] > 0 or row["high"] < 0)
    interval = "" if math.isnan(row["low"]) else f"[{_signed(row['low'], metric)}, {_signed(row['high'], metric)}]"
    values = f"{format_value(row['a'], metric)} → {format_value(row['b'], metric)}"
    return td(
        f'<span class="{trend}">{esc(_signed(moved, metric))}{" *" if significant else ""}</span> '
        f'<span class="ci">{esc(interval)}</span><br><span class="ci">{esc(values)}</span>',
        "num",
        "" if math.isnan(moved) else round(moved, 6),
    )


def compare_body(comparison: Comparison) -> str:
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for row in comparison.metric_rows:
        by_model.setdefault(row["model"], {})[row["metric"]] = row
    rows = [
        [td(esc(model)), *(_change_cell(cells[m]) if m in cells else td("") for m, _ in COMPARED)]
        for model, cells in by_model.items()
    ]
    metrics = (
        table(
            ["Model", *((f"{label} B − A", "num") for _, label in COMPARED)], rows, sortable=True, css="metric-changes"
        )
        + '<p class="muted">B − A with the 95% interval of a difference of two independent estimates (each '
        "run's bootstrap standard error), then run A's and run B's values; * the interval excludes 0. "
        "Green: better, red: worse.</p>"
        if rows
        else '<p class="muted">No model has metrics in both runs.</p>'
    )
    changed = []
    for row in comparison.changed:
        changed.append(
            [
                td(item_link(comparison.b, row["item_b"], row["question"] or row["item_b"]), "question"),
                td(esc(row["class"])),
                td(esc(row["intensity"])),
                td(esc(row["expected"])),
                td(esc(row["model"])),
                td(badge(short_decision(row["decision_a"]) or "none", row["verdict_a"], row["decision_a"])),
                td(badge(short_decision(row["decision_b"]) or "none", row["verdict_b"], row["decision_b"])),
            ]
        )
    shown = (
        f"<p>{comparison.changed_total} decisions changed over {comparison.matched} items matched by "
        f"{esc(comparison.matched_by)}"
        + (
            f" (the first {len(comparison.changed)} shown)"
            if comparison.changed_total > len(comparison.changed)
            else ""
        )
        + ".</p>"
    )
    changes = (
        table(
            ["Question (run B)", "Class", "Intensity", "Expected", "Model", "Run A", "Run B"],
            changed,
            sortable=True,
            css="changed",
        )
        if changed
        else ""
    )
    return (
        f"<h2>Metric changes: {esc(comparison.b)} − {esc(comparison.a)}</h2>{metrics}"
        f"<h2>Items whose decision changed</h2>{shown}{changes}"
    )
