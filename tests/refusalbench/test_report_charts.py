"""The report's charts: Vega-Lite specs with their data in the page, the JavaScript inlined once, drawn
offline by a browser; a chart with one category to compare is one line instead."""

from __future__ import annotations

import pandas as pd
import pytest

from refusalbench.tasks.core.charts import specs_in
from refusalbench.tasks.refusalbench.report import ReportInputs, build_report
from refusalbench.tasks.refusalbench.scoring import score_frame
from tests.browser import Browser
from tests.refusalbench.test_report import EVIL, judged
from tests.refusalbench.test_report_figures import REGISTRY, analysis

CHART = 'class="vl-chart"'
BUNDLE = "window.vegaEmbed="  # the bundle's last statement: its count is the bundles inlined


@pytest.fixture(scope="module")
def rich_page() -> tuple[str, dict]:
    """A report with every kind of chart: three targets (one named like a script), confidences, the
    generation analysis, a round trend and the registry's model facts."""
    result = score_frame(judged(["alpha", EVIL, "beta & co"]), n_resamples=50, seed=0)
    trend = pd.DataFrame(
        {
            "round": ["round-20260101T000000Z-s1", "round-20260102T000000Z-s2"] * 2,
            "model": ["alpha", "alpha", EVIL, EVIL],
            "calibrated_refusal_score": [0.3, 0.4, 0.5, 0.45],
        }
    )
    inputs = ReportInputs.from_score(
        result, gv_analysis=analysis(), round_trend=trend, model_info={m: REGISTRY.get(m, {}) for m in result.metrics}
    )
    return build_report(inputs), result.metrics


def test_the_page_holds_specs_and_one_bundle_and_no_image(rich_page):
    page, _ = rich_page
    assert "data:image/png" not in page
    assert (
        "<img" not in page.split("</script></head>", 1)[1]
    )  # the body's figures are charts (vega-embed's code has "<img")
    assert page.count(BUNDLE) == 1 and page.index(BUNDLE) < page.index("</script></head>")
    specs = specs_in(page)
    assert len(specs) == page.count(CHART) >= 20
    # the model named like a script is data in the spec, never markup: no "<" of it reaches the page
    assert EVIL not in page and "\\u003cscript>alert(1)\\u003c/script>" in page


def test_each_chart_holds_the_numbers_it_shows(rich_page):
    page, metrics = rich_page
    specs = specs_in(page)
    by_title = {str((s.get("title") or {}).get("text")): s for s in specs}
    scatter = by_title["Answer vs refusal accuracy"]["layer"]
    points = {row["model"]: row for row in by_title["Answer vs refusal accuracy"]["data"]["values"]}
    for model, values in metrics.items():
        assert points[model]["x"] == round(values["answer_accuracy"], 4)
        assert points[model]["y"] == round(values["refusal_accuracy"], 4)
        assert points[model]["n"] == values["n"]
    assert any("tooltip" in layer.get("encoding", {}) or "tooltip" in layer.get("mark", {}) for layer in scatter) or (
        "tooltip" in by_title["Answer vs refusal accuracy"]["encoding"]
    )
    errors = {(r["model"], r["rate"][:5]): r["value"] for r in by_title["False vs missed refusals"]["data"]["values"]}
    assert errors[("alpha", "false")] == round(metrics["alpha"]["false_refusal_rate"], 4)
    assert errors[("alpha", "misse")] == round(metrics["alpha"]["missed_refusal_rate"], 4)
    # one colour per model, the same on every chart that colours by model
    scales = [
        layer["encoding"]["color"]["scale"]
        for s in specs
        for layer in [s, *s.get("layer", [])]
        if layer.get("encoding", {}).get("color", {}).get("field") == "model"
    ]
    assert len(scales) >= 2 and all(scale == scales[0] for scale in scales)
    # every value is a plain JSON number or null: NaN never reaches the page
    assert "NaN" not in page.split("</script></head>", 1)[1]


def test_a_chart_of_one_model_is_a_line_saying_so():
    result = score_frame(judged(["solo"]), n_resamples=0)
    page = build_report(ReportInputs.from_score(result))
    for title in ("Answer vs refusal accuracy", "False vs missed refusals", "Response distribution"):
        assert f'<p class="note">{title}: left out: only one model.</p>' in page
    titles = [str((s.get("title") or {}).get("text")) for s in specs_in(page)]
    assert "Answer vs refusal accuracy" not in titles and "Response distribution" not in titles


def test_a_page_without_charts_carries_no_javascript():
    page = build_report(ReportInputs(metrics={}))
    assert CHART not in page and "<script" not in page


def test_the_charts_draw_offline_in_a_browser(rich_page, tmp_path):
    page, _ = rich_page
    report = tmp_path / "report.html"
    report.write_text(page)
    script = """(() => {
      const charts = Array.from(document.querySelectorAll('div.vl-chart'));
      return {charts: charts.length,
              drawn: charts.filter(c => c.querySelector('svg, canvas')).length,
              empty: charts.filter(c => !c.querySelector('svg, canvas')).map(c => c.getAttribute('aria-label'))};
    })()"""
    ready = "Array.from(document.querySelectorAll('div.vl-chart')).every(c => c.querySelector('svg, canvas'))"
    with Browser() as browser:
        try:
            facts = browser.look(f"file://{report}", script=script, wait_for=ready, timeout_s=60, settle_s=0.2)
        except TimeoutError:  # some chart never drew: look once more to name it
            facts = browser.look(f"file://{report}", script=script, settle_s=5)
    assert facts["charts"] == page.count(CHART) and facts["drawn"] == facts["charts"], facts["empty"]
