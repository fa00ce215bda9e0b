"""The paper's own figures in the viewer: a leaderboard column for the run's models that name one of
the paper's models, and the page ``/paper`` listing every figure the paper reports.

The figures come from ``refusalbench.reference`` (shipped with the package); for each matched model
the benchmark is the one its items were (single-document: RefusalBench-NQ, multi-document:
RefusalBench-GaRAGe), read from the run's metrics.json. They are the paper's runs, not this one's:
every cell and the page say "as reported in the paper" and name the source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from refusalbench.tasks.refusalbench.reference.paper_reference import (
    DATASET_NAMES,
    LABEL,
    PaperFigure,
    load_reference,
    matched_figures,
)
from refusalbench.tasks.refusalbench.report.reference_section import CONTEXT_NOTE
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS
from refusalbench.tasks.viewer.data import RefusalBenchRun
from refusalbench.tasks.viewer.layout import esc, table, td

PATH = "/paper"
COLUMN = "As reported in the paper"


def _label(metric: str) -> str:
    return METRIC_SPECS[metric].label if metric in METRIC_SPECS else metric


def _figure(metric: str, figure: PaperFigure) -> str:
    return f'<div>{esc(_label(metric))} {esc(figure.text())} <span class="ci">{esc(figure.source)}</span></div>'


def leaderboard_column(run: RefusalBenchRun, metrics: Sequence[str]) -> dict[str, str]:
    """{model: cell HTML}: the paper's figures for ``metrics`` of every model of the run that names
    one of the paper's models; empty when none does."""
    document: dict[str, Any] = run.metrics or {}
    found = matched_figures(document.get("models") or {}, document.get("multi_document"), metrics)
    cells = {}
    for model, (paper, dataset, figures) in found.items():
        head = f'<div class="paper-ref">{esc(paper)} <span class="ci">{esc(DATASET_NAMES[dataset])}</span></div>'
        body = "".join(_figure(m, figures[m]) for m in metrics if m in figures)
        cells[model] = td(head + body, "paper", paper)
    return cells


def reference_link() -> str:
    """The line under a leaderboard pointing to every figure of the paper."""
    return f'<p class="muted">Reference figures {LABEL}: <a href="{PATH}">all of them, with their sources</a>.</p>'


def reference_rows() -> list[dict[str, Any]]:
    """Every figure as a plain record (the JSON twin of the page)."""
    return [figure.model_dump(mode="json") | {"text": figure.text()} for figure in load_reference().figures]


def reference_body() -> str:
    """The page listing every figure of the paper, one table per benchmark."""
    figures = load_reference().figures
    body = f'<h1>{esc(COLUMN)}</h1><p class="muted">{esc(CONTEXT_NOTE)}</p>'
    headers: list[str | tuple[str, str]] = ["Model", "Metric", "Slice", ("Paper", "num"), "Source", "What it is"]
    for dataset, title in DATASET_NAMES.items():
        rows = [
            [
                td(esc(f.model or "—"), value=f.model or ""),
                td(esc(_label(f.metric))),
                td(esc(f.subset or "")),
                td(esc(f.text()), "num", f.number),
                td(esc(f.source)),
                td(esc(f.description)),
            ]
            for f in figures
            if f.dataset == dataset
        ]
        if rows:
            body += f"<h2>{esc(title)}</h2>" + table(headers, rows, sortable=True, css="paper-reference")
    return body
