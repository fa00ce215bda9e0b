"""The paper's figures in the report: beside a matched model in the leaderboard, on the benchmark the
run's variant names, and all of them in their own section; an unmatched model gets none."""

from __future__ import annotations

import re

import numpy as np

from refusalbench.tasks.refusalbench.report import ReportInputs, build_report
from refusalbench.tasks.refusalbench.scoring import render_score_outputs, score_frame
from tests.refusalbench.test_report import judged

MATCHED = "anthropic/claude-sonnet-4-20250514"
UNMATCHED = "my-local-model"


def _leaderboard(page: str) -> str:
    start = page.index("<section id='leaderboard'>")
    return page[start : page.index("</section>", start)]


def _rows(table: str) -> list[str]:
    return re.findall(r"<tr[^>]*>.*?</tr>", table, flags=re.S)


def _row_after(rows: list[str], model: str) -> str | None:
    index = next(i for i, row in enumerate(rows) if f">{model}<" in row or f">{model} <" in row)
    following = rows[index + 1] if index + 1 < len(rows) else ""
    return following if "paper-reference" in following else None


def test_a_matched_model_shows_the_papers_nq_figures_beside_its_own():
    result = score_frame(judged([MATCHED, UNMATCHED]), n_resamples=50, seed=0)
    page = build_report(ReportInputs.from_score(result))
    rows = _rows(_leaderboard(page))
    paper = _row_after(rows, MATCHED)
    assert paper is not None, rows
    assert "paper: Claude-4-Sonnet" in paper and "RefusalBench-NQ" in paper
    # CRS, answer and refusal accuracy as the paper prints them, each with its source.
    for figure in ("65.3%", "57.7%", "73.0%", "0.286"):
        assert figure in paper, figure
    assert "paper, §4.2 RQ2 (Fig. 5)" in paper
    assert _row_after(rows, UNMATCHED) is None
    assert not any("paper:" in row for row in rows if "paper-reference" not in row)
    # The section with every figure, saying what they are.
    assert "As reported in the paper</h2>" in page
    assert "not a target" in page
    assert "r = -0.78" in page and "93.1%" in page and "13.0%" in page


def test_a_multi_document_run_shows_the_garage_figures():
    frame = judged([MATCHED], n_items=36)
    frame["variant"] = "multi"
    frame["raf"] = np.where(frame["answer_correct"], 1.0, 0.0)
    frame["eligibility"] = 1.0
    frame["factuality"] = frame["raf"]
    result = score_frame(frame, n_resamples=50, seed=0)
    paper = _row_after(_rows(_leaderboard(build_report(ReportInputs.from_score(result)))), MATCHED)
    assert paper is not None
    assert "RefusalBench-GaRAGe" in paper and "36.1%" in paper and "51.7%" in paper
    assert "73.0%" not in paper


def test_metrics_json_holds_no_paper_figure():
    result = score_frame(judged([MATCHED]), n_resamples=50, seed=0)
    metrics = render_score_outputs(result)["metrics.json"].decode()
    assert "as reported in the paper" not in metrics and "Claude-4-Sonnet" not in metrics
