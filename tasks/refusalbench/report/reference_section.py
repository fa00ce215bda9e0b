"""The paper's own figures beside a run's: in the report (a row under each matched model in the
leaderboard, and all of them in the section "As reported in the paper") and in the terminal (a
line after the leaderboard per matched model, :func:`terminal_lines`).

A run's model whose name names one of the paper's models (``reference.model_names``) gets a row
under its own in the leaderboard: the paper's figure for each column the paper reports, with its
source, on the benchmark the model was scored on (single-document items: RefusalBench-NQ;
multi-document: RefusalBench-GaRAGe). The figures come from the paper's runs (its items, judge and
sampling), so they are context for the user's numbers, not a target; the page says so.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from refusalbench.tasks.core.html_page import escape, section
from refusalbench.tasks.refusalbench.reference.paper_reference import (
    DATASET_NAMES,
    LABEL,
    PaperFigure,
    load_reference,
    matched_figures,
)
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS

TITLE = "As reported in the paper"
CONTEXT_NOTE = (
    "Figures the RefusalBench paper reports for its own runs: its own items, judge and sampling, so "
    "they are context for this run's numbers, not a target. A model of this run whose name names one "
    "of the paper's models shows the paper's figures in a row under its own in the leaderboard."
)


def figure_cell(figure: PaperFigure) -> str:
    """One paper figure in a table cell: the figure, then its source."""
    return f"{escape(figure.text())}<br><span class='ci'>paper, {escape(figure.source)}</span>"


def leaderboard_beside(
    metrics: Mapping[str, Mapping[str, Any]],
    multi_document: Mapping[str, Mapping[str, Any]] | None,
    columns: Sequence[str],
) -> dict[str, tuple[str, dict[str, str]]]:
    """{model: (name cell, {metric: cell})}: the paper row under each matched model of the
    leaderboard, for the leaderboard's ``columns``."""
    rows = {}
    for model, (paper, dataset, figures) in matched_figures(metrics, multi_document, columns).items():
        name = f"paper: {escape(paper)} <span class='ci'>({LABEL}, {escape(DATASET_NAMES[dataset])})</span>"
        rows[model] = (name, {metric: figure_cell(figure) for metric, figure in figures.items()})
    return rows


def _metric_name(metric: str) -> str:
    spec = METRIC_SPECS.get(metric)
    return (spec.title or spec.label) if spec is not None else metric.replace("_", " ").replace(".", ": ")


def reference_section() -> str:
    """The section listing every figure the paper reports, by benchmark."""
    reference = load_reference()
    body = f"<p class='note'>{escape(CONTEXT_NOTE)}</p>"
    for dataset, title in DATASET_NAMES.items():
        figures = [f for f in reference.figures if f.dataset == dataset]
        if not figures:
            continue
        rows = "".join(
            "<tr>"
            f"<td class='name'>{escape(f.model or '—')}</td><td>{escape(_metric_name(f.metric))}</td>"
            f"<td>{escape(f.subset or '')}</td><td>{escape(f.text())}</td>"
            f"<td>{escape(f.source)}</td><td>{escape(f.description)}</td></tr>"
            for f in figures
        )
        head = "<tr><th>Model</th><th>Metric</th><th>Slice</th><th>Paper</th><th>Source</th><th>What it is</th></tr>"
        body += f"<h3>{escape(title)}</h3><table class='paper-reference'>{head}{rows}</table>"
    return section(TITLE, body)


def terminal_lines(document: Mapping[str, Any], columns: Sequence[str], order: Sequence[str], width: int) -> list[str]:
    """Lines for the terminal, one block per matched model of metrics.json ``document`` in ``order``:
    the paper's figures for ``columns``, each with its source, wrapped to ``width``."""
    found = matched_figures(document.get("models") or {}, document.get("multi_document"), columns)
    lines: list[str] = []
    for model in (m for m in order if m in found):
        paper, dataset, figures = found[model]
        shown = "; ".join(
            f"{METRIC_SPECS[m].label if m in METRIC_SPECS else m} {figures[m].text()} ({figures[m].source})"
            for m in columns
            if m in figures
        )
        text = f"{model}: {LABEL} ({paper}, {DATASET_NAMES[dataset]}): {shown}"
        lines += textwrap.wrap(text, width=max(width, 20), subsequent_indent="  ", break_on_hyphens=False)
    return lines
