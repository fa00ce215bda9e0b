"""The report as a person sees it: a scripted main run, then report.html in headless Chromium.

Checks what only a browser shows: every chart draws offline (its SVG or canvas), no
section on a run that has the data says "not enough data", and the page photographs.
Set ``REFUSALBENCH_SCREENSHOTS=DIR`` to keep the screenshot for a look.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import pytest

from tests.browser import CHARTS_DRAWN, PAGE_FACTS, Browser
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, intensity_of, judge_by_reference, run_config, verifier_reply

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

CODES = ["REFUSE_INFO_MISSING", "REFUSE_AMBIGUOUS", "REFUSE_FALSE_PREMISE"]
LEVELS = ["VERY_CONFIDENT", "CONFIDENT", "SOMEWHAT_CONFIDENT", "UNCERTAIN"]
# The descriptions (aria-label) of the paper figures (report.paper_figures): Figs. 8, 11, 13, 16, 23, 24-25, confusion by intensity.
PAPER_FIGURES = [
    "confusion matrix across models",
    "confusion by intensity across models",
    "model by domain specialisation heatmaps",
    "benchmark items per domain",
    "class difficulty ranking",
    "refusal accuracy ranking",
    "model dashboards",
]


def target(kind: str):
    """Scripted targets that answer some items and refuse others, each with a stated confidence."""

    def reply(request) -> str:
        text = json.dumps(request["messages"])
        draw = int(hashlib.sha256((kind + text).encode()).hexdigest(), 16)
        level = LEVELS[draw % len(LEVELS)]
        if kind == "answerer" or draw % 3 == 0:
            return f"The answer is Perturbed context.\nConfidence: {level}"
        return f"{CODES[draw % len(CODES)]}\nConfidence: {level}"

    return reply


def scripted_run(tmp_path, fake_llm) -> str:
    from refusalbench.flows.launch import run_main

    fake_llm.responder = by_model(
        {
            "gen-a": lambda r: generator_reply(r, "a"),
            "gen-b": lambda r: generator_reply(r, "b"),
            "ver-a": lambda r: verifier_reply("PASS"),
            "ver-b": lambda r: verifier_reply(
                "FAIL" if intensity_of(r) == "HIGH" and "b?" in json.dumps(r) else "PASS"
            ),
            "answerer": target("answerer"),
            "mixed": target("mixed"),
            "cautious": target("cautious"),
            "judge": judge_by_reference,
        }
    )
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = ["gen-a", "gen-b", "ver-a", "ver-b", "answerer", "mixed", "cautious", "judge"]
    config = run_config(
        tmp_path,
        fake_llm.url,
        models,
        """
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [ver-a, ver-b]
  strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM, P-MissingInfo/HIGH, P-Ambiguity/LOW, P-Ambiguity/HIGH,
           P-FalsePremise/MEDIUM]
evaluation:
  targets: [answerer, mixed, cautious]
  judge: judge
  confidence: true
  bootstrap: 100
""",
        max_attempts=2,
    )
    out = tmp_path / "run"
    return run_main(str(config), str(out)).report


def test_report_renders_every_figure_in_a_browser(tmp_path, fake_llm):
    report = scripted_run(tmp_path, fake_llm)
    shot = tmp_path / "report.png"
    with Browser() as browser:
        facts = browser.look(f"file://{report}", script=PAGE_FACTS, screenshot=shot, wait_for=CHARTS_DRAWN)
    assert facts["charts"] >= 8 and facts["drawn"] == facts["charts"], facts["headings"]
    assert facts["images"] == 0
    assert "not enough data" not in facts["text"].lower(), [
        line for line in facts["text"].splitlines() if "not enough data" in line.lower()
    ]
    assert shot.stat().st_size > 50_000  # a real full-page photograph, not a blank tab
    # The paper's figures across models (27.5): each drawn once for the whole run, none left out.
    for alt in PAPER_FIGURES:
        assert facts["labels"].count(alt) == 1, (alt, facts["labels"])
    assert "Figures not drawn" not in facts["headings"], facts["text"].split("Figures not drawn")[-1][:500]
    shares = re.findall(
        r"^(ANSWER|REFUSE_\w+)\t([\d.]+)%$",
        facts["text"].split("Share of all predictions")[1].split("By intensity")[0],
        flags=re.MULTILINE,
    )
    assert shares and sum(float(share) for _, share in shares) == pytest.approx(100, abs=0.5), shares
    keep = os.environ.get("REFUSALBENCH_SCREENSHOTS")
    if keep:
        shutil.copy(shot, os.path.join(keep, "report.png"))
