"""The report's frame: summary card, table of contents, readable headings, folded metadata, the
reply sample, and the small-sample guardrail on intervals, standard errors and significance."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.stats import MIN_CLUSTERS
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.report import ReportInputs, build_report
from refusalbench.tasks.refusalbench.report.run_outputs import judged_frame, write_report, write_scores
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Response
from refusalbench.tasks.refusalbench.scoring import score_frame
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, expected_behaviour
from tests.refusalbench.test_report import judged

TARGETS = ("strong", "middle", "weak")
LONG_REPLY = "x" * 3000  # one unbroken word: only overflow-wrap keeps it on the page
# (class, intensity) of the three items: one answerable, two unanswerable
STRATA = (("P-Ambiguity", "LOW"), ("P-Ambiguity", "HIGH"), ("P-Contradiction", "MEDIUM"))


def _items() -> list[BenchmarkItem]:
    return [
        BenchmarkItem(
            item_id=f"hash{i:04x}",
            base_id=f"base-{i}",
            variant="single",
            perturbation_class=cls,
            intensity=intensity,
            lever_id=f"lever-{i}",
            generator="gen",
            question=f"Question number {i} about the context?",
            context="Some context.",
            original_question="q",
            answers=[f"gold answer {i}"],
            expected=expected_behaviour(cls, intensity),
        )
        for i, (cls, intensity) in enumerate(STRATA)
    ]


def _decision(model: str, item: BenchmarkItem) -> tuple[str, bool | None]:
    """strong: right everywhere; weak: wrong everywhere; middle: answers everything correctly."""
    answerable = item.expected == ANSWER_CORRECTLY
    if model == "strong" or (model == "middle" and answerable):
        return ("ANSWER", True) if answerable else (item.expected, None)
    if model == "middle":
        return "ANSWER", None
    return ("REFUSE_INFO_MISSING", None) if answerable else ("ANSWER", None)


def _manifest() -> runfolder.RunManifest:
    registry = {name: {"model": f"openai/{name}"} for name in (*TARGETS, "judge")}
    registry["never-used"] = {
        "model": "local/big",
        "local": {"files": [f"big-{i:05d}-of-00042.gguf" for i in range(42)]},
    }
    return runfolder.RunManifest(
        schema_version=runfolder.SCHEMA_VERSION,
        run_id="run-3-items",
        kind="evaluate",
        package_version="0",
        config_hash="cafe1234",
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        status="completed",
        config={
            "name": "tiny-demo",
            "models": registry,
            "evaluation": {"targets": list(TARGETS), "judge": "judge"},
        },
        calls={"strong": {"http_calls": 3}, "judge": {"http_calls": 9}},
        costs={"total": {"http_calls": 12, "priced_cost_usd": 0.0125, "cost_usd": 0.0125}},
    )


@pytest.fixture(scope="module")
def three_item_run(tmp_path_factory) -> tuple[Path, dict[str, bytes], dict[str, bytes], str]:
    """A run folder of 3 targets x 3 items (3 base items), scored and reported; the files' bytes
    before and after the report, and the page."""
    folder = tmp_path_factory.mktemp("run")
    store = ArtifactStore(str(folder))
    items = _items()
    store.save(runfolder.MANIFEST, _manifest())
    store.save(rb_files.BENCHMARK, items)
    judgments, responses = [], []
    for model in TARGETS:
        for item in items:
            decision, correct = _decision(model, item)
            judgments.append(
                Judgment(
                    item_id=item.item_id,
                    model=model,
                    expected=item.expected,
                    decision=decision,
                    answer_correct=correct,
                    outcome="ok",
                    perturbation_class=item.perturbation_class,
                    intensity=item.intensity,
                    lever_id=item.lever_id,
                    generator=item.generator,
                    domain="science",
                )
            )
            reply = LONG_REPLY if model == "weak" else f"reply of {model}"
            responses.append(Response(item_id=item.item_id, model=model, raw=reply, decision=decision, outcome="ok"))
    store.save(rb_files.RESPONSES, responses)
    frame, _ = judged_frame(judgments, items)
    store.save(rb_files.JUDGED, frame)
    result = write_scores(store, frame, bootstrap=200, seed=0)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".json", ".parquet")}
    write_report(store, result)
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".json", ".parquet")}
    return folder, before, after, (folder / "report.html").read_text()


def _section(page: str, title: str) -> str:
    return page.split(f"<h2>{title}</h2>")[1].split("</section>")[0]


def test_rendering_leaves_metrics_and_every_table_byte_identical(three_item_run):
    _, before, after, _ = three_item_run
    assert "metrics.json" in before and "judged.parquet" in before
    assert before == after


def test_a_three_item_run_shows_insufficient_data_instead_of_intervals_and_stars(three_item_run):
    folder, _, _, page = three_item_run
    metrics = json.loads((folder / "metrics.json").read_text())
    # The file keeps what the page holds back: the intervals, and differences it calls significant.
    assert metrics["intervals"]["strong"]["calibrated_refusal_score"][0] is not None
    assert any(m["significant"] for c in metrics["pairwise"]["comparisons"] for m in c["metrics"].values())
    board = _section(page, "Leaderboard").split("</table>")[0]
    assert board.count("insufficient data (n = ") >= 3 * 3  # every target's CRS, answer and refusal accuracy
    assert "[" not in board.split("<table>")[1]  # no interval printed in the table
    assert "<td>3</td>" in board  # each target's 3 base items, in their own column
    pairwise = _section(page, "Pairwise comparisons")
    assert "<b>*</b>" not in pairwise and "p = " not in pairwise and "insufficient data (n = " in pairwise
    assert "+100.0" in pairwise  # the difference itself stays on the page
    errors = _section(page, "Standard errors")
    assert " pp" not in errors.split("<table>")[1] and "insufficient data (n = " in errors
    breakdown = _section(page, "Breakdowns")
    assert "insufficient data (n = 1)" in breakdown and "[" not in breakdown.split("<table>")[1]


def test_the_summary_card_comes_first_and_is_read_from_the_run(three_item_run):
    _, _, _, page = three_item_run
    body = page.rsplit("<body>", 1)[1]  # the last: the inlined chart bundle mentions <body> too
    assert body.index("<h2>Summary</h2>") < body.index("<h2>Leaderboard</h2>")
    card = _section(page, "Summary")
    assert "tiny-demo" in card and "cafe1234" in card
    assert "strong, middle, weak" in card and "<th class='name'>Judge</th><td class='name'>judge</td>" in card
    assert "<th class='name'>Items</th><td class='name'>3</td>" in card
    assert "<th class='name'>Base items</th><td class='name'>3</td>" in card
    assert "$0.0125" in card
    assert "unknown: this run folder holds no generation record" in card
    assert f"Only 3 base item(s) evaluated: below {MIN_CLUSTERS}" in card


def test_every_contents_link_has_a_target(three_item_run):
    _, _, _, page = three_item_run
    nav = page.split("<nav class='toc'")[1].split("</nav>")[0]
    links = re.findall(r"href='#([^']+)'", nav)
    ids = re.findall(r"id='([^']+)'", page)
    assert len(links) >= 10 and set(links) <= set(ids)
    assert len(ids) == len(set(ids))
    assert len(links) == page.count("<section id=")  # every section listed


def test_headings_are_words_not_keys(three_item_run):
    _, _, _, page = three_item_run
    headings = re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", page)
    assert headings
    keys = [h for h in headings if re.search(r"\b[a-z0-9]+_[a-z0-9_]+\b", re.sub(r"<code>.*?</code>", "", h))]
    assert keys == []
    assert "<h3>Tokens and cost</h3>" in page and "<h3>Model calls</h3>" in page


def test_run_metadata_is_folded_and_lists_only_the_models_used(three_item_run):
    _, _, _, page = three_item_run
    metadata = _section(page, "Run metadata")
    assert metadata.startswith("<details>") and "never-used" not in metadata and "gguf" not in metadata
    assert "strong" in metadata and "judge" in metadata
    assert "1 registry entries not used by this run" in metadata
    assert "never-used" in (three_item_run[0] / "manifest.json").read_text()  # the file keeps it


def test_the_reply_sample_shows_the_question_expectation_and_outcome(three_item_run):
    _, _, _, page = three_item_run
    sample = page.split("<h3>Sample replies</h3>")[1].split("</table>")[0]
    assert "Question number 0 about the context?" in sample and ">hash0000<" not in sample
    assert "answer: gold answer 0" in sample and "refusal: <code>" in sample
    assert "correct answer" in sample and "false refusal" in sample and "missed refusal" in sample
    assert "<pre class='wrap'>" + "x" * 100 in sample
    assert "pre.wrap,td.wrap{white-space:pre-wrap;overflow-wrap:anywhere}" in page


def _with_bases(frame: pd.DataFrame, n_bases: int) -> pd.DataFrame:
    return frame.assign(base_id=frame["item_id"].str[1:].astype(int) % n_bases).astype({"base_id": str})


def test_intervals_need_base_items_not_rows():
    """72 rows per model: over 12 base items the intervals show; over 4, they do not."""
    rows = judged(["alpha", "beta"], n_items=72)
    for bases, shown in ((12, True), (4, False)):
        frame = _with_bases(rows, bases)
        result = score_frame(frame, n_resamples=50, seed=0)
        inputs = ReportInputs(
            metrics=result.metrics,
            intervals=result.intervals,
            pairwise=result.pairwise,
            standard_errors=result.standard_errors,
            judged=frame,
        )
        board = build_report(inputs).split("<h2>Leaderboard</h2>")[1].split("<table>")[1].split("</table>")[0]
        assert ("insufficient data" not in board) is shown
        assert ("<span class='ci'>[" in board) is shown
        assert (f"insufficient data (n = {bases})" in board) is not shown


def test_trend_points_below_the_minimum_are_not_joined_and_lose_their_interval():
    from refusalbench.tasks.refusalbench.report.support import guarded_trend, line_points

    readable = [
        {"round": "r1", "model": "m", "n": 3, "CRS": "0.500 [0.100, 0.900]"},
        {"round": "r2", "model": "m", "n": 40, "CRS": "0.600 [0.500, 0.700]"},
    ]
    shown = guarded_trend(readable, ["CRS"])
    assert shown[0]["CRS"] == "0.500 (insufficient data (n = 3))" and shown[0]["line"] == "point only"
    assert shown[1]["CRS"] == "0.600 [0.500, 0.700]" and shown[1]["line"] == "joined"
    points = line_points(pd.DataFrame({"model": ["m", "m"], "n": [1, 12]}))
    assert points["joined"].tolist() == [False, True]
