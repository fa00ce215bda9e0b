"""The terminal leaderboard of a run with a target named like one of the paper's models: a line after
the table with the paper's own figures and their sources; a target the paper never ran gets none."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from refusalbench.flows.cli_results import print_leaderboard
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.report.run_outputs import write_scores
from tests.refusalbench.test_report import judged

MATCHED = "anthropic/claude-sonnet-4-20250514"
UNMATCHED = "my-local-model"


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("paper-reference") / "run"
    write_scores(ArtifactStore(str(folder)), judged([MATCHED, UNMATCHED]), bootstrap=50, seed=0)
    return str(folder)


def _printed(run_folder: str, width: int) -> str:
    out, err = io.StringIO(), io.StringIO()
    print_leaderboard(Console(file=out, width=width), Console(file=err, width=width), run_folder, "report.html", [])
    return out.getvalue()


@pytest.mark.parametrize("width", [80, 160])
def test_a_matched_target_gets_the_papers_figures_after_the_table(run_folder, width):
    text = _printed(run_folder, width)
    lines = text.splitlines()
    # The table, its note and the paper's lines fit; the places to look after them are paths and URLs, never cut.
    fitted = lines[: next(i for i, line in enumerate(lines) if line.startswith("metrics:"))]
    assert max(len(line) for line in fitted) <= width
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{MATCHED}: as reported in the paper"))
    block = " ".join(line.strip() for line in lines[start : start + 8])
    assert "(Claude-4-Sonnet, RefusalBench-NQ)" in block
    assert "CRS 65.3% (App. F.7 (Figs. 24-25))" in block
    assert "Refusal acc. 73.0% (§4.2 RQ2 (Fig. 5); App. F.7; App. G)" in block
    assert "Answer acc. 57.7%" in block
    # The table itself comes first, unchanged: the target's own row precedes the paper's line.
    assert text.index(MATCHED) < text.index("as reported in the paper")
    assert f"{UNMATCHED}: as reported" not in text
    assert text.count("as reported in the paper") == 1
