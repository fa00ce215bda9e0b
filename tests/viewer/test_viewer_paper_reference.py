"""The viewer beside the paper: a run folder whose target is named like one of the paper's models
shows the paper's figures in its leaderboard, labelled and sourced; a target the paper never ran
shows none; ``/paper`` lists every reference figure. One real viewer process, read over HTTP."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.reference.paper_reference import load_reference
from refusalbench.tasks.refusalbench.report.run_outputs import write_scores
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from tests.refusalbench.test_report import judged
from tests.viewer.test_viewer import _url_of, _viewer

pytestmark = pytest.mark.slow

MATCHED = "anthropic/claude-sonnet-4-20250514"
UNMATCHED = "my-local-model"


def _run(folder: Path, models: list[str]) -> str:
    store = ArtifactStore(str(folder))
    frame = judged(models)
    store.write_frame(rb_files.JUDGED.name, frame)
    write_scores(store, frame, bootstrap=50, seed=0)
    return str(folder)


@pytest.fixture(scope="module")
def viewer(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("paper-view")
    process = _viewer(_run(root / "with-paper", [MATCHED, UNMATCHED]), _run(root / "without", [UNMATCHED]))
    try:
        yield _url_of(process)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def _leaderboard(page: str, run: str) -> str:
    start = page.index(f'data-run="{run}"')
    return page[start : page.index("</table>", start)]


def _row(table: str, model: str) -> str:
    return next(row for row in re.findall(r"<tr>.*?</tr>", table, flags=re.S) if f">{model}</a>" in row)


def test_the_leaderboard_shows_the_papers_figures_for_a_matched_model(viewer):
    page = httpx.get(viewer + "/").text
    board = _leaderboard(page, "with-paper")
    assert '<th class="sortable">As reported in the paper</th>' in board
    matched = _row(board, MATCHED)
    assert "Claude-4-Sonnet" in matched and "RefusalBench-NQ" in matched
    assert "Refusal acc. 73.0%" in matched and "§4.2 RQ2 (Fig. 5)" in matched
    assert "CRS 65.3%" in matched and "Answer acc. 57.7%" in matched
    unmatched = _row(board, UNMATCHED)
    assert "Claude-4-Sonnet" not in unmatched and "%" not in unmatched.split("</td>")[-2]
    # A run none of whose models the paper ran has no such column, only the link to the figures.
    alone = _leaderboard(page, "without")
    assert "As reported in the paper" not in alone
    assert 'href="/paper"' in page


def test_the_paper_page_lists_every_figure_with_its_source(viewer):
    page = httpx.get(viewer + "/paper").text
    assert page.count("<tr>") - page.count("<thead><tr>") == len(load_reference().figures)
    assert "RefusalBench-GaRAGe" in page and "47.4%" in page and "App. C.2 (Table 2)" in page
    assert "not a target" in page
    rows = httpx.get(viewer + "/api/paper").json()
    assert len(rows) == len(load_reference().figures)
    assert all(row["source"] for row in rows)
    assert {"model": "Claude-4-Sonnet", "metric": "refusal_accuracy", "dataset": "nq", "text": "73.0%"}.items() <= next(
        row for row in rows if row["model"] == "Claude-4-Sonnet" and row["metric"] == "refusal_accuracy"
    ).items()
