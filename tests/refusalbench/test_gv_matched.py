"""The matched-set generator-verifier comparison (issue 27, item 4; paper §4.2 RQ1, Fig. 3).

The synthetic run, small enough to check by hand (generators g1, g2; verifiers g1, g2, v3):

    assignment  g1's candidate                    g2's candidate     in the matched set?
    a1          c11 ok                            c21 ok             yes
    a2          c12 pre-check reject (unchanged)  c22 ok             yes: c12 is FAIL from every verifier
    a3          c13 ok                            c23 call error     no (call error)
    a4          c14 ok                            -                  no (g2 never attempted it)

    verdicts (g1, g2, v3): c11 PASS FAIL PASS; c21 PASS PASS FAIL; c22 FAIL PASS ERROR; c13 PASS PASS PASS
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from refusalbench.tasks.refusalbench.report.generation_figures import self_cross_table
from refusalbench.tasks.refusalbench.report.gv import gv_section_html
from refusalbench.tasks.refusalbench.schema.json_files import GVAnalysis
from refusalbench.tasks.refusalbench.stages.gv_analysis import gv_analysis
from refusalbench.tasks.refusalbench.stages.gv_matched import CRITERIA

CANDIDATES = [
    ("c11", "a1", "g1", "ok", []),
    ("c21", "a1", "g2", "ok", []),
    ("c12", "a2", "g1", "ok", ["unchanged: the question and context are the original's"]),
    ("c22", "a2", "g2", "ok", []),
    ("c13", "a3", "g1", "ok", []),
    ("c23", "a3", "g2", "call_error", None),
    ("c14", "a4", "g1", "ok", []),
]
VERDICTS = {
    "c11": ("PASS", "FAIL", "PASS"),
    "c21": ("PASS", "PASS", "FAIL"),
    "c22": ("FAIL", "PASS", "ERROR"),
    "c13": ("PASS", "PASS", "PASS"),
}
VERIFIERS = ["g1", "g2", "v3"]


def analysis() -> dict:
    candidates = pd.DataFrame(
        [
            {
                "candidate_id": c,
                "assignment_id": a,
                "generator": g,
                "status": status,
                "precheck_failures": failures,
                "perturbation_class": "P-Ambiguity",
                "intensity": "LOW",
            }
            for c, a, g, status, failures in CANDIDATES
        ]
    )
    generator_of = {c: g for c, _, g, _, _ in CANDIDATES}
    rows = []
    for c, verdicts in VERDICTS.items():
        for verifier, verdict in zip(VERIFIERS, verdicts):
            criteria = {} if verdict == "ERROR" else {k: None if k == "strategy_compliance" else True for k in CRITERIA}
            if verdict == "FAIL":
                criteria["lever_fidelity"] = False
            rows.append(
                {
                    "candidate_id": c,
                    "generator": generator_of[c],
                    "verifier": verifier,
                    "verdict": verdict,
                    "stated_verdict": None if verdict == "ERROR" else verdict,
                    "consistent": None if verdict == "ERROR" else True,
                    **criteria,
                }
            )
    raw = gv_analysis(candidates, pd.DataFrame(rows), set(), set(), ["g1", "g2"], VERIFIERS)
    return GVAnalysis.model_validate(raw).model_dump(mode="json")


def test_matched_set_by_hand():
    gv = analysis()
    matched = gv["matched_set"]
    assert (matched["assignments"], matched["matched_assignments"]) == (4, 2)
    assert matched["excluded_assignments"] == {"not_attempted_by_every_generator": 1, "call_error": 1}
    assert matched["by_generator"]["g1"] == {"candidates": 2, "unparsed": 0, "precheck_rejects": 1}
    assert matched["unjudged"] == 1  # v3's ERROR on c22

    # g1: self c11 PASS + c12 FAIL (rejected) = 1/2; cross c11 FAIL PASS + c12 FAIL FAIL = 1/4.
    g1 = matched["self_evaluation"]["g1"]
    assert (g1["self_pass_rate"], g1["cross_pass_rate"], g1["n_self"], g1["n_cross"]) == (0.5, 0.25, 2, 4)
    assert g1["self_interval"][0] < 0.5 < g1["self_interval"][1]
    # The run-wide table drops the pre-check reject and keeps unmatched c13: g1 passes itself 2/2 there.
    assert gv["self_evaluation"]["g1"]["self_pass_rate"] == 1.0
    # g2: self 2/2; cross c21 PASS FAIL + c22 FAIL (v3's ERROR left out) = 1/3.
    assert matched["self_evaluation"]["g2"]["cross_pass_rate"] == pytest.approx(1 / 3)
    assert matched["self_pass_rate"] == 0.75 and matched["cross_pass_rate"] == pytest.approx((0.25 + 1 / 3) / 2)
    assert matched["pass_rate_matrix"]["g1"] == {"g1": 0.5, "g2": 0.0, "v3": 0.5}

    # Kappa over the verifiers' own verdicts (the reject's FAILs left out): g1-g2 PPF vs FPP = -1/2,
    # g2-v3 FP vs PF = -1, g1-v3 undefined (g1 passed both c11 and c21).
    kappas = {(k["verifier_a"], k["verifier_b"]): k for k in matched["verifier_kappa"]}
    assert kappas[("g1", "g2")]["kappa"] == pytest.approx(-0.5) and kappas[("g2", "v3")]["kappa"] == pytest.approx(-1)
    assert math.isnan(kappas[("g1", "v3")]["kappa"]) and "single verdict" in kappas[("g1", "v3")]["reason"]
    assert matched["mean_kappa"] == pytest.approx(-0.75) and matched["kappa_pairs_defined"] == 2

    # g1 judged c11, c21 PASS and c22 FAIL (lever fidelity false); strategy compliance never given.
    failures = matched["criterion_failure_rates"]["g1"]
    assert failures["lever_fidelity"] == pytest.approx(1 / 3) and failures["target_compliance"] == 0
    assert math.isnan(failures["strategy_compliance"]) and matched["criterion_verdicts"] == {"g1": 3, "g2": 3, "v3": 2}


def test_matched_set_in_the_report_table_and_fig3():
    gv = analysis()
    page = gv_section_html(gv)
    assert "<h3>Matched-set comparison (self vs cross)</h3>" in page
    assert "self pass rate <b>75.0%</b> vs cross pass rate <b>29.2%</b>" in page
    assert "<td class='name'>g1</td><td>2</td><td>0</td><td>1</td>" in page  # the pre-check reject counted
    table = self_cross_table(gv)
    assert list(table.index) == ["g1", "g2", "mean"] and table.loc["mean", "self"] == 0.75
    assert math.isnan(table.loc["mean", "self_low"])
