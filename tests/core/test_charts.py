"""core.charts: a Vega-Lite spec and its data as a page's HTML, read back; the JavaScript built once and cached."""

from __future__ import annotations

import math
from importlib.metadata import version

import numpy as np
import pandas as pd

from refusalbench.tasks.core import charts

EVIL = "</script><script>alert(1)</script><!--"


def test_data_is_compact_json_without_nan():
    values = [math.nan, math.inf, 0.123456, 2.0, np.float32(0.5), np.int64(7), pd.NA, None, "x", True]
    assert charts.compact(values) == [None, None, 0.1235, 2, 0.5, 7, None, None, "x", True]
    assert charts.compact({"a": (1.00001, {"b": np.nan})}) == {"a": [1, {"b": None}]}


def test_a_chart_is_a_div_and_a_call_whose_spec_reads_back():
    html = charts.chart({"mark": "bar"}, [{"model": EVIL, "value": 1 / 3, "n": 12}], "bars")
    assert html.startswith('<div class="vl-chart" role="img" aria-label="bars"></div><script>vegaEmbed(')
    assert html.endswith(",{actions:false})</script>")
    (spec,) = charts.specs_in("<p>before</p>" + html + html.replace("bars", "more"))[:1]
    assert spec["mark"] == "bar" and spec["$schema"] == charts.SCHEMA
    assert spec["data"]["values"] == [{"model": EVIL, "value": 0.3333, "n": 12}]
    # the name is data: nothing in it ends the script or opens a comment
    assert "</script><script>" not in html and "<!--" not in html and html.count("<script>") == 1


def test_too_few_categories_give_a_note():
    assert charts.too_few(["a", "b", "a"], "model", "Bars") is None
    assert charts.too_few(["a", "a"], "model", "Bars") == '<p class="note">Bars: left out: only one model.</p>'
    assert charts.too_few([], "class", "Heat") == '<p class="note">Heat: left out: no class.</p>'
    assert charts.or_note(None, "x < y") == '<p class="note">Not enough data for: x &lt; y.</p>'


def test_model_colours_depend_on_the_page_models_only():
    first = charts.model_colours(["b", "a", "c"])
    assert first == charts.model_colours(["c", "b", "a", "b"])
    assert first["domain"] == ["a", "b", "c"] and len(set(first["range"])) == 3


def test_the_bundle_is_built_once_and_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REFUSALBENCH_HOME", str(tmp_path))
    charts.javascript_bundle.cache_clear()
    try:
        bundle = charts.javascript_bundle()
        cached = tmp_path / "cache" / f"vega-bundle-{version('vl-convert-python')}.js"
        assert cached.read_text() == bundle and "window.vegaEmbed=" in bundle
        assert [p.name for p in cached.parent.iterdir()] == [cached.name]  # no half-written file left
        cached.write_text("/* from the cache */")
        charts.javascript_bundle.cache_clear()
        assert charts.head_script(charts.chart({"mark": "bar"}, [], "x")) == "<script>/* from the cache */</script>"
        assert charts.head_script("<p>no chart here</p>") == ""
    finally:
        charts.javascript_bundle.cache_clear()  # other tests read the session's own cache
