"""The report kit's table of contents, readable headings and small-sample guardrail."""

from __future__ import annotations

import math
import re

from refusalbench.tasks.core.html_page import (
    anchor,
    insufficient_data,
    readable_heading,
    section,
    table_of_contents,
)
from refusalbench.tasks.core.stats import MIN_CLUSTERS, enough_clusters


def test_contents_link_each_section_and_number_repeated_titles():
    sections = [
        section("Leaderboard", "a"),
        "<p>not a section</p>",
        section("Costs & <tricks>", "b"),
        section("Leaderboard", "c"),
    ]
    nav, out = table_of_contents(sections)
    links = re.findall(r"href='#([^']+)'", nav)
    ids = re.findall(r"<section id='([^']+)'>", "".join(out))
    assert links == ids == ["leaderboard", "costs-tricks", "leaderboard-2"]
    assert "Costs &amp; &lt;tricks&gt;" in nav and "<tricks>" not in nav
    assert out[1] == "<p>not a section</p>" and out[3].endswith("<h2>Leaderboard</h2>c</section>")
    assert table_of_contents(["<p>x</p>"])[0] == ""
    assert anchor("×") == "section"


def test_keys_become_words_and_other_text_is_kept():
    assert readable_heading("judged_counts") == "Judged counts"
    assert readable_heading("pass_rate_matrix", {"pass_rate_matrix": "Pass rate per pair"}) == "Pass rate per pair"
    assert readable_heading("Already Words") == "Already Words"


def test_the_guardrail_counts_units_not_values():
    assert MIN_CLUSTERS == 10
    assert enough_clusters(MIN_CLUSTERS) and not enough_clusters(MIN_CLUSTERS - 1)
    assert not enough_clusters(None) and not enough_clusters(math.nan)
    assert insufficient_data(3) == "<span class='insufficient'>insufficient data (n = 3)</span>"
