"""The report's generation and model-comparison figures: the tables behind them, and when each is drawn.

The synthetic run is small enough to check by hand:

    candidate  generator  class          intensity  verdicts (g1, v2)   accepted / sampled
    c1         g1         P-Ambiguity    LOW        PASS, PASS          yes
    c2         g1         P-Ambiguity    HIGH       PASS, FAIL          no
    c3         g1         P-MissingInfo  HIGH       PASS, PASS          yes
    c4         g2         P-Ambiguity    LOW        FAIL, PASS          no
    c5         g2         P-MissingInfo  MEDIUM     PASS, ERROR         no

g1 both generates and verifies; v2 only verifies.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from refusalbench.tasks.core.charts import specs_in
from refusalbench.tasks.refusalbench.report import ReportInputs, build_generation_report, build_report
from refusalbench.tasks.refusalbench.report.comparison_figures import (
    alignment_table,
    comparison_figures_html,
    domain_difficulty,
    model_facts,
    scaling_table,
    thinking_table,
)
from refusalbench.tasks.refusalbench.report.generation_figures import (
    composition_table,
    contribution_table,
    generation_figures_html,
    kappa_matrix,
    pass_rate_table,
    self_bias_table,
)
from refusalbench.tasks.refusalbench.schema.json_files import GVAnalysis
from refusalbench.tasks.refusalbench.stages.gv_analysis import gv_analysis

CHART = 'class="vl-chart"'

CANDIDATES = [
    ("c1", "g1", "P-Ambiguity", "LOW"),
    ("c2", "g1", "P-Ambiguity", "HIGH"),
    ("c3", "g1", "P-MissingInfo", "HIGH"),
    ("c4", "g2", "P-Ambiguity", "LOW"),
    ("c5", "g2", "P-MissingInfo", "MEDIUM"),
]
VERDICTS = {
    "c1": ("PASS", "PASS"),
    "c2": ("PASS", "FAIL"),
    "c3": ("PASS", "PASS"),
    "c4": ("FAIL", "PASS"),
    "c5": ("PASS", "ERROR"),
}


def analysis(verifiers=("g1", "v2"), generators=("g1", "g2"), accepted=("c1", "c3")) -> dict:
    """gv_analysis.json of the synthetic run, as the report reads it (JSON form)."""
    # c1 and c4 perturb the same assignment: the matched set (Fig. 3) is that one.
    candidates = pd.DataFrame(
        [
            {
                "candidate_id": c,
                "assignment_id": {"c4": "c1"}.get(c, c),
                "generator": g,
                "perturbation_class": k,
                "intensity": i,
                "status": "ok",
                "precheck_failures": [],
            }
            for c, g, k, i in CANDIDATES
        ]
    )
    generator_of = {c: g for c, g, _, _ in CANDIDATES}
    rows = [
        {
            "candidate_id": c,
            "generator": generator_of[c],
            "verifier": v,
            "verdict": verdict,
            "stated_verdict": None if verdict == "ERROR" else verdict,
            "consistent": None if verdict == "ERROR" else True,
        }
        for c, pair in VERDICTS.items()
        for v, verdict in zip(("g1", "v2"), pair)
        if v in verifiers
    ]
    raw = gv_analysis(candidates, pd.DataFrame(rows), set(accepted), set(accepted), list(generators), list(verifiers))
    return GVAnalysis.model_validate(raw).model_dump(mode="json")


# ---------------------------------------------------------------- generation tables


def test_generation_tables_by_hand():
    gv = analysis()
    assert composition_table(gv).to_dict() == {
        "LOW": {"P-Ambiguity": 1, "P-MissingInfo": 0},
        "HIGH": {"P-Ambiguity": 0, "P-MissingInfo": 1},
    }
    # Both accepted candidates are g1's; g2 keeps its (empty) bar.
    for stage in ("accepted", "sampled"):
        table = contribution_table(gv, stage)
        assert table.loc["g1"].to_dict() == {"P-Ambiguity": 1, "P-MissingInfo": 1}
        assert table.loc["g2"].sum() == 0

    rates, judged = pass_rate_table(gv, "class")
    # g1 Ambiguity: c1 PASS PASS, c2 PASS FAIL -> 3/4; g2 MissingInfo: c5's ERROR is not a verdict -> 1/1.
    assert rates.loc["g1"].to_dict() == {"P-Ambiguity": 0.75, "P-MissingInfo": 1.0}
    assert rates.loc["g2"].to_dict() == {"P-Ambiguity": 0.5, "P-MissingInfo": 1.0}
    assert judged.loc["g2"].to_dict() == {"P-Ambiguity": 2, "P-MissingInfo": 1}
    rates, judged = pass_rate_table(gv, "intensity")
    assert list(rates.columns) == ["LOW", "MEDIUM", "HIGH"]  # taxonomy order, not alphabetical
    assert rates.loc["g1", "LOW"] == 1.0 and rates.loc["g1", "HIGH"] == 0.75 and math.isnan(rates.loc["g1", "MEDIUM"])
    assert judged.loc["g1", "MEDIUM"] == 0

    # g1 on its own Ambiguity items: self 2/2, cross (v2) 1/2 -> +0.5; on MissingInfo 1/1 vs 1/1 -> 0.
    assert self_bias_table(gv).loc["g1"].to_dict() == {"P-Ambiguity": 0.5, "P-MissingInfo": 0.0}
    assert gv["self_evaluation_by_class"]["g1"]["P-Ambiguity"]["n_cross"] == 2

    # Over c1-c4 (c5 has no v2 verdict): g1 PPPF, v2 PFPP -> observed 1/2, chance 5/8, kappa -1/3.
    kappa = kappa_matrix(gv)
    assert kappa.loc["g1", "v2"] == pytest.approx(-1 / 3) and kappa.loc["v2", "g1"] == pytest.approx(-1 / 3)
    assert kappa.loc["g1", "g1"] == 1.0


def test_every_generation_figure_is_drawn_when_the_run_allows():
    page = generation_figures_html(analysis())
    # composition, contributions, pass rate by class and by intensity, self vs cross, self-evaluation bias, kappa
    assert page.count(CHART) == 7
    assert "class='note'" not in page


def test_generation_figures_left_out_say_what_is_missing():
    page = generation_figures_html(analysis(verifiers=("v2",), generators=("g2",), accepted=()))
    assert (
        "Self-evaluation bias by class: needs a model that is both a generator and a verifier "
        "(this run: generators g2; verifiers v2)." in page
    )
    assert "Verifier agreement: needs at least two verifiers (this run: v2)." in page
    assert (
        "Self vs cross pass rate: needs a model that is both a generator and a verifier "
        "(this run: generators g2; verifiers v2)." in page
    )
    # Nothing accepted: no composition, no contributions, each said in one line.
    assert "Benchmark composition: the benchmark holds no item." in page
    assert "Generator contributions: no candidate was accepted." in page
    assert page.count(CHART) == 2  # the two pass-rate heatmaps
    assert "not enough data" not in page.lower()


def test_a_run_without_any_verdict_says_so():
    candidates = pd.DataFrame(
        [
            {
                "candidate_id": "c1",
                "generator": "g1",
                "perturbation_class": "P-Ambiguity",
                "intensity": "LOW",
                "status": "parse_error",
                "precheck_failures": None,
            }
        ]
    )
    verifications = pd.DataFrame(
        columns=["candidate_id", "generator", "verifier", "verdict", "stated_verdict", "consistent"]
    )
    raw = gv_analysis(candidates, verifications, set(), set(), ["g1"], ["g1", "v2"])
    page = generation_figures_html(GVAnalysis.model_validate(raw).model_dump(mode="json"))
    assert "Pass rate by generator and perturbation class: no candidate received a PASS or FAIL verdict." in page
    assert "Self-evaluation bias by class: no candidate of g1 received a PASS or FAIL verdict." in page
    assert "NA for g1 and v2: no candidate judged by both." in page
    assert page.count(CHART) == 1  # the kappa matrix, every pair NA


# ---------------------------------------------------------------- model-comparison tables


def _m(answer, refusal):
    return {
        "answer_accuracy": answer,
        "refusal_accuracy": refusal,
        "calibrated_refusal_score": (answer + refusal) / 2,
        "n": 10,
    }


METRICS = {
    "qwen-s": _m(0.1, 0.1),
    "qwen-l": _m(0.5, 0.2),
    "olmo-sft": _m(0.3, 0.1),
    "olmo-dpo": _m(0.4, 0.3),
    "olmo-dpo-7": _m(0.5, 0.4),
    "sonnet": _m(0.6, 0.7),
    "sonnet-1024": _m(0.58, 0.72),
    "other": _m(0.5, 0.5),
}
REGISTRY = {
    "qwen-s": {"model": "x/q05", "family": "Qwen 1.5", "parameters_b": 0.5},
    "qwen-l": {"model": "x/q7", "family": "Qwen 1.5", "parameters_b": 7},
    "olmo-sft": {"model": "x/o1s", "family": "OLMo-2", "parameters_b": 1, "training": "sft"},
    "olmo-dpo": {"model": "x/o1d", "family": "OLMo-2", "parameters_b": 1, "training": "dpo"},
    "olmo-dpo-7": {"model": "x/o7d", "family": "OLMo-2", "parameters_b": 7, "training": "dpo"},
    "sonnet": {"model": "x/sonnet", "thinking_budget": 0},
    "sonnet-1024": {"model": "x/sonnet", "thinking_budget": 1024},
    "other": {"model": "x/other"},
}


def domain_breakdown() -> pd.DataFrame:
    # law: answer (0.8, 0.6) refusal (0.4, 0.2); health: answer (1.0, 0.8) refusal (0.5, 0.7)
    cells = [("a", "law", 0.8, 0.4), ("b", "law", 0.6, 0.2), ("a", "health", 1.0, 0.5), ("b", "health", 0.8, 0.7)]
    return pd.DataFrame(
        [
            {"model": m, "group": "domain", "value": d, "metric": metric, "estimate": value}
            for m, d, a, r in cells
            for metric, value in (("answer_accuracy", a), ("refusal_accuracy", r))
        ]
    )


def test_comparison_tables_by_hand():
    facts = model_facts(sorted(METRICS), REGISTRY)
    scaling = scaling_table(METRICS, facts)
    # Qwen has two sizes; OLMo-2 DPO two (1B, 7B); OLMo-2 SFT one size only; thinking variants are not sizes.
    assert scaling[["line", "model", "parameters_b"]].values.tolist() == [
        ["OLMo-2 (DPO)", "olmo-dpo", 1.0],
        ["OLMo-2 (DPO)", "olmo-dpo-7", 7.0],
        ["Qwen 1.5", "qwen-s", 0.5],
        ["Qwen 1.5", "qwen-l", 7.0],
    ]
    assert scaling.set_index("model").loc["qwen-l", "calibrated_refusal_score"] == pytest.approx(0.35)

    (pair,) = alignment_table(METRICS, facts).to_dict("records")
    assert pair["family"] == "OLMo-2" and pair["parameters_b"] == 1.0
    assert (pair["refusal_accuracy_sft"], pair["refusal_accuracy_dpo"]) == (0.1, 0.3)

    thinking = thinking_table(METRICS, facts)
    assert thinking[["group", "model", "thinking_budget"]].values.tolist() == [
        ["sonnet", "sonnet", 0],
        ["sonnet", "sonnet-1024", 1024],
    ]

    difficulty = domain_difficulty(domain_breakdown()).set_index("domain")
    assert list(difficulty.index) == ["law", "health"]  # hardest first
    assert difficulty.loc["law", "answer_difficulty"] == pytest.approx(0.3)
    assert difficulty.loc["law", "refusal_difficulty"] == pytest.approx(0.7)
    assert difficulty.loc["law", "difficulty"] == pytest.approx(0.5)
    assert difficulty.loc["health", "difficulty"] == pytest.approx((0.1 + 0.4) / 2)


def test_comparison_figures_drawn_when_the_models_allow():
    page = comparison_figures_html(METRICS, domain_breakdown(), REGISTRY)
    assert page.count(CHART) == 4
    assert "class='note'" not in page


def test_comparison_figures_left_out_name_what_is_missing():
    metrics = {"qwen-s": METRICS["qwen-s"], "olmo-sft": METRICS["olmo-sft"], "other": METRICS["other"]}
    page = comparison_figures_html(metrics, domain_breakdown()[lambda f: f["value"] == "law"], REGISTRY)
    assert page.count(CHART) == 0
    assert (
        "Scaling curves: needs at least two sizes of one model family (this run: olmo-sft (OLMo-2, 1B), "
        "qwen-s (Qwen 1.5, 0.5B); 1 model(s) without family and parameters_b in the registry)."
    ) in page
    assert (
        "SFT vs DPO: needs an SFT and a DPO model of one family at the same size "
        "(this run, models marked sft/dpo: olmo-sft (SFT, OLMo-2, 1B))." in page
    )
    assert (
        "Thinking budget: needs at least two thinking budgets of one model "
        "(this run, models with thinking_budget: none)." in page
    )
    assert "Domain difficulty: needs items from at least two domains (this run&#x27;s domains: law)." in page
    assert "not enough data" not in page.lower()


# ---------------------------------------------------------------- the pages


def test_full_report_takes_the_registry_from_the_manifest():
    manifest = {"run_id": "r", "config": {"models": REGISTRY}}
    page = build_report(
        ReportInputs(metrics=METRICS, breakdown=domain_breakdown(), manifest=manifest, gv_analysis=analysis())
    )
    comparison = page.split("<h2>Model comparison</h2>")[1].split("</section>")[0]
    generation = page.split("<h2>Benchmark generation</h2>")[1].split("</section>")[0]
    assert comparison.count(CHART) == 4 and generation.count(CHART) == 7
    # The drawn tables are not repeated as raw JSON in the G-V section.
    gv_section = page.split("<h2>Generator × verifier analysis</h2>")[1].split("</section>")[0]
    assert "self_evaluation_by_class" not in gv_section and "Funnel" in gv_section
    assert "Matched-set comparison" in gv_section and "criterion_failure_rates" not in gv_section


def test_generation_only_report_has_no_evaluation_sections():
    page = build_generation_report(
        ReportInputs(
            metrics={}, gv_analysis=analysis(), manifest={"run_id": "r"}, title="RefusalBench report (generation only)"
        )
    )
    assert page.count(CHART) == 7
    assert "Leaderboard" not in page and "Model comparison" not in page and "not enough data" not in page.lower()
    assert "<h2>Run metadata</h2>" in page


def test_the_generation_charts_hold_the_analysis_numbers():
    """Each chart's data, read back from the page, is the analysis': the composition's cells, and the pass
    rate per generator x class with the verdicts behind it (n) for the tooltip."""
    specs = {spec["title"]["text"]: spec for spec in specs_in(generation_figures_html(analysis()))}
    composition = next(s for title, s in specs.items() if title.startswith("Benchmark composition"))
    cells = {(r["perturbation_class"], r["intensity"]): r["items"] for r in composition["data"]["values"]}
    assert cells[("P-Ambiguity", "LOW")] == 1 and cells[("P-MissingInfo", "HIGH")] == 1
    assert sum(cells.values()) == 2  # c1 and c3, the accepted candidates, are sampled
    rates = specs["Pass rate by generator and perturbation class (Fig. 4 form)"]["data"]["values"]
    # g1's P-Ambiguity candidates c1 (PASS, PASS) and c2 (PASS, FAIL): 3 of 4 verdicts pass
    assert {"row": "g1", "column": "P-Ambiguity", "value": 0.75, "n": 4} in rates
    kappa = specs["Verifier agreement (Cohen's kappa)"]["data"]["values"]
    assert {"row": "g1", "column": "v2", "value": -0.3333, "n": None} in kappa


# ---------------------------------------------------------------- after a scripted generate run


@pytest.mark.usefixtures("prefect_harness")
def test_generate_leaves_a_generation_report(tmp_path, fake_llm):
    from tests.pipeline.test_generation_flow import run, write_config
    from tests.scripted import by_model, generator_reply, intensity_of, requested_schema, verifier_reply

    def gen_a(request):  # gen-a generates and also verifies (it passes everything it sees)
        return (
            verifier_reply("PASS") if requested_schema(request) == "VerifierOutput" else generator_reply(request, "a")
        )

    fake_llm.responder = by_model(
        {
            "gen-a": gen_a,
            "gen-b": lambda r: generator_reply(r, "b"),
            "ver-b": lambda r: verifier_reply(
                "FAIL" if intensity_of(r) == "HIGH" and " question a?" in json.dumps(r) else "PASS"
            ),
        }
    )
    out = tmp_path / "run"
    run(write_config(tmp_path, fake_llm.url, verifiers=["gen-a", "ver-b"]), out)

    page = (out / "report.html").read_text()
    assert "<title>RefusalBench report (generation only)</title>" in page
    generation = page.split("<h2>Benchmark generation</h2>")[1].split("</section>")[0]
    assert generation.count(CHART) == 7, generation
    gv = json.loads((out / "gv_analysis.json").read_text())
    # Both generators attempted every assignment: all are matched; gen-a passes all its own candidates.
    matched = gv["matched_set"]
    assert matched["matched_assignments"] == matched["assignments"] > 0
    assert matched["self_evaluation"]["gen-a"]["self_pass_rate"] == matched["self_pass_rate"] == 1.0
    assert "Matched-set comparison" in page
    # gen-a passes all its own candidates; ver-b fails its 3 HIGH ones (P-MissingInfo): +100pp there, 0 elsewhere.
    bias = gv["self_evaluation_by_class"]["gen-a"]
    assert bias["P-MissingInfo"]["self_evaluation_bias"] == pytest.approx(1.0)
    assert bias["P-Ambiguity"]["self_evaluation_bias"] == pytest.approx(0.0)
    assert sum(n for row in gv["benchmark_composition"].values() for n in row.values()) == gv["funnel"]["sampled"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "report.html" in manifest["artifacts"] and "report" in manifest["timings_s"]


def test_small_multiples_keep_a_model_whose_every_cell_is_undefined():
    """A model whose every rate is NaN still gets its panel (null cells: none drawn, the tooltip's n kept);
    a grid of one perturbation class is no comparison: its chart is one line saying so."""
    from refusalbench.tasks.refusalbench.report.figures import class_intensity_chart

    grid = pd.DataFrame(
        {
            "model": ["a", "a", "b", "a"],
            "perturbation_class": ["P-Ambiguity"] * 3 + ["P-MissingInfo"],
            "intensity": ["LOW", "MEDIUM", "LOW", "LOW"],
            "correct_rate": [0.5, 0.2, math.nan, 1 / 3],
            "n": [2, 3, 0, 3],
        }
    )
    (spec,) = specs_in(class_intensity_chart(grid))
    assert spec["facet"]["sort"] == ["a", "b"]
    values = spec["data"]["values"]
    assert {
        "model": "b",
        "perturbation_class": "P-Ambiguity",
        "intensity": "LOW",
        "correct_rate": None,
        "n": 0,
    } in values
    assert {
        "model": "a",
        "perturbation_class": "P-MissingInfo",
        "intensity": "LOW",
        "correct_rate": 0.3333,
        "n": 3,
    } in values

    one_class = class_intensity_chart(grid[grid["perturbation_class"] == "P-Ambiguity"])
    assert CHART not in one_class
    assert one_class == '<p class="note">Class × intensity: left out: only one perturbation class.</p>'
