"""The HTML report and the leaderboard forms."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from refusalbench.tasks.core.charts import specs_in
from refusalbench.tasks.refusalbench.report import (
    ReportInputs,
    build_report,
    leaderboard_markdown,
    leaderboard_rows,
    ranked_models,
)
from refusalbench.tasks.refusalbench.scoring import load_score_outputs, render_score_outputs, score_frame
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, expected_behaviour

EVIL = "<script>alert(1)</script>"
CHART = 'class="vl-chart"'
# The paper's cross-model figures a report drawn from scores alone has: dashboards, refusal-accuracy
# ranking, class difficulty, model x domain, confusion across models (benchmark domains and confusion
# by intensity need the run folder's benchmark and judged rows).
PAPER = 5


def judged(models, with_confidence=True, n_items=72, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for index, model in enumerate(models):
        for i in range(n_items):
            cls = PERTURBATION_CLASSES[i % 6]
            intensity = INTENSITIES[(i // 6) % 3]
            expected = expected_behaviour(cls, intensity)
            draw = rng.random()
            if draw < 0.4 + 0.1 * index:
                decision = "ANSWER"
            elif draw < 0.8 and expected != "ANSWER_CORRECTLY":
                decision = expected
            else:
                decision = "REFUSE_INFO_MISSING"
            record = {
                "model": model,
                "item_id": f"i{i}",
                "expected": expected,
                "decision": decision,
                "answer_correct": bool(rng.random() < 0.6),
                "perturbation_class": cls,
                "intensity": intensity,
                "domain": ["law", "health"][i % 2],
                "lever_id": f"lever-{i % 12}",
                "generator": "g1",
            }
            if with_confidence:
                record["confidence"] = rng.choice(["VERY_CONFIDENT", "CONFIDENT", "UNCERTAIN"])
            records.append(record)
    return pd.DataFrame(records)


@pytest.fixture(scope="module")
def scored():
    return score_frame(judged(["alpha", EVIL, "beta & co"]), n_resamples=100, seed=0)


def test_report_embeds_every_plot_and_every_model(scored):
    page = build_report(ReportInputs.from_score(scored))
    # 2 scatters + FRR/MRR bars + class x intensity + intensity curves + confusion matrices + reliability
    # + Fig. 7 (ECE answers vs refusals)
    # + response distribution, domain difficulty, and the cross-model figures (PAPER): dashboards,
    # refusal-accuracy ranking, class difficulty, model x domain, confusion across models
    assert page.count(CHART) == 2 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + PAPER
    leaderboard = page.split("<h2>Leaderboard</h2>")[1].split("</table>")[0]
    for model in ("alpha", "&lt;script&gt;alert(1)&lt;/script&gt;", "beta &amp; co"):
        assert f"<td class='name'>{model}</td>" in leaderboard
    # self-contained: no external fetches; the scripts are the inlined bundle and one call per chart
    assert not re.search(r"""(src|href)=["']?https?:""", page)
    assert "<script src" not in page.lower()
    assert page.lower().count("<script") == 1 + page.count(CHART)
    assert "data:image/png" not in page


def test_untrusted_text_is_escaped_everywhere(scored):
    inputs = ReportInputs.from_score(
        scored,
        manifest={"run_id": EVIL, "config": {"note": EVIL}},
        gv_analysis={"pass_rate": {EVIL: {"v1": 0.5}}, "kappa": [{"a": EVIL, "b": 0.1}]},
        round_trend=pd.DataFrame({"round": [1, 2], "model": [EVIL, EVIL], "calibrated_refusal_score": [0.3, 0.4]}),
        title=EVIL,
    )
    page = build_report(inputs)
    assert EVIL not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count(CHART) == 10 + PAPER + 1  # plus the round-trend chart
    assert "Run metadata" in page and "Generator × verifier analysis" in page


def test_report_without_confidences_says_so():
    result = score_frame(judged(["alpha", "beta"], with_confidence=False), n_resamples=20)
    page = build_report(ReportInputs.from_score(result))
    assert "No confidences were elicited" in page
    assert page.count(CHART) == 2 + 1 + 1 + 1 + 1 + 1 + 1 + PAPER  # no reliability diagram, no Fig. 7


def test_report_from_files_and_from_metrics_only(scored):
    files = render_score_outputs(scored)
    page = build_report(ReportInputs.from_score(load_score_outputs(files)))
    assert page.count(CHART) == 10 + PAPER
    bare = build_report(ReportInputs(metrics=scored.metrics))
    # the two scatters, the error bars, the dashboards and the refusal-accuracy ranking need only metrics
    assert bare.count(CHART) == 3 + 2
    assert "alpha" in bare


def test_leaderboard_rows_and_markdown_rank_by_crs():
    metrics = {
        "low": {"calibrated_refusal_score": 0.2, "answer_accuracy": 0.1, "n": 5},
        "undefined": {"calibrated_refusal_score": math.nan, "n": 3},
        "high|pipe": {"calibrated_refusal_score": 0.7, "refusal_accuracy": 0.9, "n": 5},
    }
    intervals = {"high|pipe": {"calibrated_refusal_score": (0.6, 0.8)}}
    assert ranked_models(metrics) == ["high|pipe", "low", "undefined"]
    rows = leaderboard_rows(metrics, intervals)
    assert [r["model"] for r in rows] == ["high|pipe", "low", "undefined"]
    assert rows[0]["crs_ci_low"] == 0.6 and rows[0]["rank"] == 1
    assert rows[2]["calibrated_refusal_score"] is None  # NaN -> None for JSON
    markdown = leaderboard_markdown(metrics, intervals)
    lines = markdown.strip().splitlines()
    assert len(lines) == 2 + 3
    assert "high\\|pipe" in lines[2] and "70.0% [60.0, 80.0]" in lines[2]
    assert lines[4].count("—") >= 1
    assert leaderboard_markdown({EVIL: {"calibrated_refusal_score": 0.5, "n": 1}}).count("<script>") == 0


def test_per_model_figures_are_one_chart_of_small_multiples():
    models = [f"m{i}" for i in range(5)]
    page = build_report(ReportInputs.from_score(score_frame(judged(models), n_resamples=0)))
    # one chart each for the class x intensity heatmaps and the confusion matrices, whatever the model count
    specs = {spec["facet"]["field"]: spec for spec in specs_in(page) if "facet" in spec}
    heatmaps = [s for s in specs_in(page) if s.get("title", {}).get("text", "").startswith("Correct responses")]
    assert len(heatmaps) == 1 and heatmaps[0]["facet"]["sort"] == models
    assert {row["model"] for row in heatmaps[0]["data"]["values"]} == set(models)
    assert "model" in specs
    assert page.count(CHART) == 2 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + PAPER
