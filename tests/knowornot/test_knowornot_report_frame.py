"""The KnowOrNot report's frame: summary card, table of contents, readable headings and the
small-sample guardrail on its rates' intervals."""

from __future__ import annotations

import re

import pandas as pd

from refusalbench.tasks.core.stats import MIN_CLUSTERS
from refusalbench.tasks.knowornot.report.page import KnowOrNotReportInputs, knowornot_report
from refusalbench.tasks.knowornot.stages.evaluation import BUILT_IN_SPECS


def _metrics(judged: dict[str, int]) -> pd.DataFrame:
    rows = []
    for target, n in judged.items():
        rows.append(
            {
                "target": target,
                "retrieval": "basic_rag",
                "prompt": "basic",
                "n": n,
                "n_abstention_judged": n,
                "abstention_rate": 0.5,
                "abstention_ci_low": 0.25,
                "abstention_ci_high": 0.75,
                "n_answered": n // 2,
                "n_factuality_judged": n // 2,
                "factuality_rate": 0.6,
                "factuality_ci_low": 0.4,
                "factuality_ci_high": 0.8,
            }
        )
    return pd.DataFrame(rows)


def _page(judged: dict[str, int]) -> str:
    manifest = {
        "run_id": "kon-1",
        "kind": "knowornot",
        "status": "completed",
        "config_hash": "beef",
        "config": {"name": "kon-demo", "knowornot": {"targets": list(judged), "evaluator": "grader"}},
        "costs": {"total": {"http_calls": 40, "priced_cost_usd": 0.5}},
    }
    inputs = KnowOrNotReportInputs(
        metrics=_metrics(judged),
        filter_report={"n_input": 30, "n_kept": 25, "method": "both"},
        counts={"qa_pairs": 25},
        specs=BUILT_IN_SPECS,
        manifest=manifest,
    )
    return knowornot_report(inputs)


def test_small_configurations_show_insufficient_data_and_large_ones_their_interval():
    page = _page({"tiny": 3, "large": 40})
    table = page.split("<h2>Abstention and factuality per configuration</h2>")[1].split("</table>")[0]
    assert "0.500 (insufficient data (n = 3))" in table and "0.600 (insufficient data (n = 1))" in table
    assert "0.500 [0.250, 0.750]" in table and "0.600 [0.400, 0.800]" in table  # large: 40 and 20 judged
    card = page.split("<h2>Summary</h2>")[1].split("</section>")[0]
    assert "kon-demo" in card and "tiny, large" in card and "grader" in card and "$0.5000 on 40 calls" in card
    assert f"1 configuration(s) with fewer than {MIN_CLUSTERS} judged responses" in card


def test_contents_link_every_section_and_headings_are_words():
    page = _page({"a": 12})
    links = re.findall(r"href='#([^']+)'", page.split("</nav>")[0])
    assert len(links) == page.count("<section id=") >= 6
    assert set(links) <= set(re.findall(r"id='([^']+)'", page))
    headings = [re.sub(r"<code>.*?</code>", "", h) for h in re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", page)]
    assert headings and not [h for h in headings if re.search(r"\b[a-z0-9]+_[a-z0-9_]+\b", h)]
