"""The base sample stratified by domain after the pre-test (issue 27, item 3; paper App. C.1).

A GaRAGe-style base set (multi-document items in three domains) is pre-tested by a scripted model
that gets some items wrong; the generation flow then draws ``base_sample`` with equal counts per
domain from what the pre-test kept, and names the domain that had too few left.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from refusalbench.tasks.refusalbench.schema.records import BaseItem
from refusalbench.tasks.refusalbench.stages.base_sampling import (
    domain_draw,
    domain_shares,
    sample_by_domain,
    shortfalls,
)
from tests.scripted import (
    by_model,
    fenced,
    generator_reply,
    judge_by_reference,
    last_user_text,
    run_config,
    verifier_reply,
)

DOMAINS = ("Finance", "Health", "Science")
BASE = [
    {
        "id": f"{domain[0].lower()}{k}",
        "question": f"What is the {domain} figure number {k}?",
        "answers": [f"{k}0"],
        "domain": domain,
        "passages": [
            {"text": f"The {domain} figure number {k} is {k}0.", "relevant": True},
            {"text": "Unrelated passage.", "relevant": False},
        ],
    }
    for domain in DOMAINS
    for k in range(1, 4)
]
BY_QUESTION = {row["question"]: row for row in BASE}
WRONG = {"f1", "s1", "s2"}  # after the pre-test: Finance 2, Health 3, Science 1


def items(rows=BASE) -> list[BaseItem]:
    return [BaseItem.model_validate(row) for row in rows]


# ---------------------------------------------------------------- pure logic


def test_equal_shares_by_seed_and_a_short_domain_gives_all_it_has():
    kept = [item for item in items() if item.id not in WRONG]
    drawn = sample_by_domain(kept, 6, seed=4, domains=DOMAINS)
    assert Counter(item.domain for item in drawn) == {"Finance": 2, "Health": 2, "Science": 1}
    assert [item.id for item in drawn] == [item.id for item in kept if item in drawn]  # pool order
    assert sample_by_domain(kept, 6, seed=4, domains=DOMAINS) == drawn  # reproducible
    draw = domain_draw(kept, drawn, 6, 4, DOMAINS)
    assert draw["Science"] == {"share": 2, "available": 1, "sampled": 1, "shortfall": 1}
    assert shortfalls(draw) == {"Science": 1}
    # A domain the pre-test emptied is still one of the shares, and reported.
    no_science = [item for item in kept if item.domain != "Science"]
    assert shortfalls(domain_draw(no_science, sample_by_domain(no_science, 6, 4, DOMAINS), 6, 4, DOMAINS)) == {
        "Science": 2
    }
    # Without base_sample: the poorest domain's count for each; a remainder goes to domains drawn by seed.
    assert domain_shares(None, {"A": 3, "B": 1}, 0) == {"A": 1, "B": 1}
    assert sorted(domain_shares(7, {"A": 9, "B": 9, "C": 9}, 0).values()) == [2, 2, 3]


# ---------------------------------------------------------------- through the flow


def pretest_model(request):
    (question,) = fenced(last_user_text(request), "question")
    row = BY_QUESTION[question]
    return "I am not sure, maybe 99." if row["id"] in WRONG else row["answers"][0]


@pytest.mark.usefixtures("prefect_harness")
def test_generation_draws_equal_counts_per_domain_after_the_pretest(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_generation
    from refusalbench.tasks.refusalbench.report import ReportInputs, build_report

    fake_llm.responder = by_model(
        {
            "pre": pretest_model,
            "judge": judge_by_reference,
            "gen": generator_reply,
            "ver": lambda req: verifier_reply("PASS"),
        }
    )
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in BASE))
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["pre", "judge", "gen", "ver"],
        """
generation:
  base_set: base.jsonl
  generators: [gen]
  verifiers: [ver]
  seed: 1
  strata: [P-Ambiguity/LOW]
  base_sample: 6
  base_sample_by: domain
  pretest: {models: [pre], judge: judge}
""",
    )
    out = tmp_path / "run"
    run_generation(str(config), str(out))

    drawn = pd.read_parquet(out / "base_items.parquet")
    assert not set(drawn.id) & WRONG
    assert drawn.domain.value_counts().to_dict() == {"Finance": 2, "Health": 2, "Science": 1}
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["base_set_funnel"] == {"imported": 9, "pretested": 9, "kept": 6, "sampled": 5}
    assert counts["base_sample_by_domain"]["Health"] == {"share": 2, "available": 3, "sampled": 2, "shortfall": 0}
    assert counts["base_sample_shortfall"] == {"Science": 1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert any("Science (1 of 2)" in note for note in manifest["notes"])
    page = build_report(ReportInputs(metrics={}, manifest=manifest))
    assert "<h3>Base sample by domain</h3>" in page and "<b>Shortfall</b>: Science" in page


def test_base_sample_by_domain_needs_a_domain_on_every_item(tmp_path):
    from refusalbench.flows.generation import check_generation_inputs
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.core.errors import InputError

    (tmp_path / "base.jsonl").write_text(
        "".join(json.dumps({**r, "domain": None} if r["id"] == "h2" else r) + "\n" for r in BASE)
    )
    config = run_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        ["gen"],
        """
generation:
  base_set: base.jsonl
  generators: [gen]
  verifiers: [gen]
  base_sample_by: domain
""",
    )
    with pytest.raises(InputError, match=r"generation.base_sample_by: .*1 have none \(e.g. h2\)"):
        check_generation_inputs(load_config(config))
