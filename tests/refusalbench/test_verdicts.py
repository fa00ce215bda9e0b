"""Verdicts that agree with their reasons, and the model-free pre-checks before verification (issue 15).

Flow tests run the real generation flow against scripted models over HTTP and count the
requests each model received at the server; the unit tests exercise each rule alone.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest

from refusalbench.tasks.llm.gateway import CallResult
from refusalbench.tasks.llm.structured_outputs import VERIFIER_CRITERIA, VerifierOutput, parse_output
from refusalbench.tasks.refusalbench.report.gv import gv_section_html
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, Lever, LeverExample, Passage
from refusalbench.tasks.refusalbench.stages.gv_analysis import gv_analysis, summary_markdown
from refusalbench.tasks.refusalbench.stages.prechecks import (
    apply_prechecks,
    awaits_verification,
    precheck_names,
    run_prechecks,
)
from refusalbench.tasks.refusalbench.stages.verify import effective_verdict, required_criteria, verification_from_result
from tests.pipeline.test_generation_flow import run, write_config
from tests.scripted import by_model, fenced, generator_reply, last_user_text, requested_schema, verifier_reply

# ----------------------------------------------------------------- scripted models


def verdict_with_criteria(verdict: str, *, false: tuple[str, ...] = ()) -> str:
    """A verifier reply stating ``verdict`` whose criteria are all true except ``false``."""
    flags = {name: name not in false for name in (*VERIFIER_CRITERIA, "strategy_compliance")}
    return json.dumps({"notes": "", **flags, "verdict": verdict})


def contradicting_pass(request) -> str:
    """States PASS while most of its own criteria are false."""
    return verdict_with_criteria(
        "PASS",
        false=(
            "lever_fidelity",
            "intensity_achieved",
            "answer_constraint",
            "predicted_behaviour",
            "refusal_class_alignment",
        ),
    )


_PASSAGE = re.compile(r'<passage index="(\d+)" relevant="(true|false)">\n(.*?)\n</passage>', re.DOTALL)


def echo_generator(request) -> str:
    """Returns the base item unchanged: the original question and context (or passages)."""
    text = last_user_text(request)
    (question,) = fenced(text, "question")
    common = {
        "perturbed_question": question,
        "lever_applied": "x",
        "rationale": "r",
        "answer_constraint_holds": True,
        "expected_behaviour": "x",
    }
    if requested_schema(request) == "GeneratorMultiOutput":
        passages = [
            {"index": int(i), "text": body, "relevant": flag == "true"} for i, flag, body in _PASSAGE.findall(text)
        ]
        return json.dumps({**common, "passages": passages})
    (context,) = fenced(text, "context")
    return json.dumps({**common, "perturbed_context": context})


def perturbed_question(verifier_call) -> str:
    _original, perturbed = fenced(last_user_text(verifier_call), "question")
    return perturbed


# ----------------------------------------------------------------- flow level

flow_test = pytest.mark.usefixtures("prefect_harness")


@flow_test
def test_a_pass_its_criteria_contradict_gets_nothing_accepted(tmp_path, fake_llm):
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "gen-b": lambda req: generator_reply(req, "b"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "ver-b": contradicting_pass,
        }
    )
    out = tmp_path / "run"
    result = run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b"]), out)

    assert result.accepted == 0 and result.sampled == 0
    verifications = pd.read_parquet(out / "verifications.parquet")
    lying = verifications[verifications.verifier == "ver-b"]
    assert len(lying) == 12 and set(lying.stated_verdict) == {"PASS"}
    assert set(lying.verdict) == {"FAIL"} and not lying.consistent.any()
    honest = verifications[verifications.verifier == "ver-a"]
    assert set(honest.verdict) == {"PASS"} and honest.consistent.all()

    gv = json.loads((out / "gv_analysis.json").read_text())
    assert gv["verifier_consistency"]["ver-b"] == {
        "stated": 12,
        "inconsistent": 12,
        "inconsistency_rate": 1.0,
        "pass_overruled": 12,
        "fail_with_all_criteria_met": 0,
    }
    assert gv["verifier_consistency"]["ver-a"]["inconsistency_rate"] == 0.0
    # The pass-rate matrix counts the verdict that counts, not the one stated.
    assert gv["pass_rate_matrix"]["gen-a"]["ver-b"] == 0.0
    assert gv["funnel"] == {
        "attempted": 12,
        "parsed": 12,
        "prechecked": 12,
        "verified": 12,
        "accepted": 0,
        "sampled": 0,
    }
    decisions = json.loads((out / "filter_decisions.json").read_text())
    assert not any(d["accepted"] for d in decisions)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["inconsistent_verdicts"] == 12


@flow_test
def test_an_unchanged_candidate_costs_no_verifier_call(tmp_path, fake_llm):
    fake_llm.responder = by_model(
        {
            "gen-a": echo_generator,
            "gen-b": lambda req: generator_reply(req, "b"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "ver-b": lambda req: verifier_reply("PASS"),
        }
    )
    out = tmp_path / "run"
    result = run(write_config(tmp_path, fake_llm.url, verifiers=["ver-a", "ver-b"]), out)

    candidates = pd.read_parquet(out / "candidates.parquet")
    assert len(candidates) == 12 and set(candidates.status) == {"ok"}  # every attempt stays a row
    echoed = candidates[candidates.generator == "gen-a"]
    assert all(len(f) == 1 and f[0].startswith("unchanged: ") for f in echoed.precheck_failures)
    assert all(len(f) == 0 for f in candidates[candidates.generator == "gen-b"].precheck_failures)

    # Only gen-b's 6 candidates reached the verifiers, one request each; gen-a's none.
    for verifier in ("ver-a", "ver-b"):
        calls = fake_llm.calls_for(verifier)
        assert len(calls) == 6
        assert all(perturbed_question(call).startswith("Perturbed") for call in calls)
    verifications = pd.read_parquet(out / "verifications.parquet")
    assert set(verifications.candidate_id) == set(candidates.loc[candidates.generator == "gen-b", "candidate_id"])

    assert result.accepted == 6
    assert set(pd.read_parquet(out / "benchmark.parquet").generator) == {"gen-b"}
    gv = json.loads((out / "gv_analysis.json").read_text())
    assert gv["funnel"] == {"attempted": 12, "parsed": 12, "prechecked": 6, "verified": 6, "accepted": 6, "sampled": 6}
    assert gv["precheck_failures"] == {"unchanged": 6}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["precheck_failures"] == {"unchanged": 6}
    assert manifest["counts"]["prechecked"] == 6 and "precheck" in manifest["timings_s"]


# ----------------------------------------------------------------- verdict rule (unit)


def verifier_result(reply: str) -> CallResult:
    parsed, error = parse_output(VerifierOutput, reply)
    return CallResult(model="v", key="k", text=reply, parsed=parsed, error=error)


def candidate(variant: str = "single", **fields) -> Candidate:
    defaults = dict(
        candidate_id="c1",
        assignment_id="a1",
        base_id="b1",
        lever_id="x",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        variant=variant,
        generator="g",
        status="ok",
        expected="ANSWER_CORRECTLY",
        prompt_hash="h",
        question="Changed question?",
    )
    if variant == "multi":
        defaults["passages"] = [Passage(text="One.", relevant=True), Passage(text="Two.", relevant=False)]
    else:
        defaults["context"] = "Changed context."
    return Candidate(**(defaults | fields))


@pytest.mark.parametrize(
    "stated, false, verdict, consistent",
    [
        ("PASS", (), "PASS", True),
        ("PASS", ("answer_constraint",), "FAIL", False),
        ("FAIL", ("answer_constraint",), "FAIL", True),
        ("FAIL", (), "FAIL", False),
    ],
)
def test_the_effective_verdict_follows_the_criteria(stated, false, verdict, consistent):
    row = verification_from_result(candidate(), "v", verifier_result(verdict_with_criteria(stated, false=false)))
    assert (row.verdict, row.stated_verdict, row.consistent) == (verdict, stated, consistent)
    assert row.answer_constraint is (not false)


def test_multi_document_passes_need_strategy_compliance():
    assert required_criteria("multi") == (*VERIFIER_CRITERIA, "strategy_compliance")
    reply = verdict_with_criteria("PASS", false=("strategy_compliance",))
    assert verification_from_result(candidate("multi"), "v", verifier_result(reply)).verdict == "FAIL"
    # A single-document rubric does not ask for it, so a stray false there changes nothing.
    single = verification_from_result(candidate(), "v", verifier_result(reply))
    assert (single.verdict, single.consistent, single.strategy_compliance) == ("PASS", True, None)
    # Left out where the rubric asks for it: not a criterion that holds.
    flags = {name: True for name in VERIFIER_CRITERIA} | {"strategy_compliance": None}
    assert effective_verdict("PASS", flags, required_criteria("multi")) == ("FAIL", False)


def test_errors_have_no_stated_verdict():
    row = verification_from_result(
        candidate(), "v", CallResult(model="v", key="k", error="boom", error_kind="call_error")
    )
    assert (row.verdict, row.stated_verdict, row.consistent) == ("ERROR", None, None)


def test_consistency_is_counted_per_verifier_and_shown():
    rows = [
        verification_from_result(candidate(candidate_id=f"c{i}"), verifier, verifier_result(reply))
        for i in range(4)
        for verifier, reply in (
            ("honest", verifier_reply("PASS")),
            ("strict", verdict_with_criteria("FAIL")),
            ("broken", "not json"),
        )
    ]
    frame = pd.DataFrame([r.model_dump() for r in rows])
    cands = pd.DataFrame([candidate(candidate_id=f"c{i}").model_dump() for i in range(4)])
    analysis = gv_analysis(cands, frame, set(), set(), ["g"], ["honest", "strict", "broken"])
    consistency = analysis["verifier_consistency"]
    assert consistency["honest"]["inconsistency_rate"] == 0.0
    assert consistency["strict"] == {
        "stated": 4,
        "inconsistent": 4,
        "inconsistency_rate": 1.0,
        "pass_overruled": 0,
        "fail_with_all_criteria_met": 4,
    }
    assert consistency["broken"]["stated"] == 0 and math.isnan(consistency["broken"]["inconsistency_rate"])
    assert "| strict | 4 | 4 | 1.000 | 0 | 4 |" in summary_markdown(analysis)
    html = gv_section_html(analysis)
    assert "Verdict consistency" in html and "FAIL with every criterion true" in html


def test_a_section_escapes_verifier_names():
    evil = "<script>alert(1)</script>"
    html = gv_section_html(
        {
            "funnel": {"attempted": 1},
            "precheck_failures": {evil: 1},
            "verifier_consistency": {
                evil: {
                    "stated": 1,
                    "inconsistent": 0,
                    "inconsistency_rate": 0.0,
                    "pass_overruled": 0,
                    "fail_with_all_criteria_met": 0,
                }
            },
        }
    )
    assert evil not in html and "&lt;script&gt;" in html


# ----------------------------------------------------------------- pre-check rules (unit)

LEVER = Lever(
    id="x",
    name="X",
    perturbation_class="P-Ambiguity",
    intensity="LOW",
    target="query-context",
    instruction="do",
    example=LeverExample(question="q", context="c", expected="ANSWER_CORRECTLY", answer="a"),
    multi_document="m",
)
SINGLE = BaseItem(
    id="b1", question="When was the bridge opened?", answers=["1932"], context="The bridge opened in 1932."
)
MULTI = BaseItem(
    id="b1",
    question="What is the dose?",
    answers=["5 mg"],
    passages=[Passage(text="The dose is 5 mg.", relevant=True), Passage(text="Unrelated.", relevant=False)],
)


def failures(cand: Candidate, item: BaseItem) -> dict[str, str]:
    return dict(f.split(": ", 1) for f in run_prechecks(cand, item, LEVER))


def test_the_rules_are_registered_by_name():
    assert precheck_names() == [
        "unchanged",
        "required_fields",
        "passages_dropped",
        "passages_duplicated",
        "template_leftover",
        "prompt_markup",
        "refusal_code",
    ]


def test_a_real_perturbation_passes_every_rule():
    assert (
        failures(candidate(question="When was the bridge closed?", context="The bridge opened in 1932."), SINGLE) == {}
    )
    edited = [
        Passage(text="The dose was changed.", relevant=True),
        Passage(text="Unrelated.", relevant=False),
        Passage(text="A new passage.", relevant=True),
    ]
    assert failures(candidate("multi", question="What is the dose?", passages=edited), MULTI) == {}


def test_unchanged_after_whitespace_normalisation():
    same = candidate(question="  When was the bridge\nopened? ", context="The bridge  opened in 1932.\n")
    assert failures(same, SINGLE) == {"unchanged": "question and context equal the base item"}
    assert "unchanged" not in failures(
        candidate(question=SINGLE.question, context="The bridge opened in 1933."), SINGLE
    )
    same_multi = candidate("multi", question=MULTI.question, passages=list(MULTI.passages))
    assert failures(same_multi, MULTI) == {"unchanged": "question and passages equal the base item"}
    # A changed relevance flag is a change (conservative: only a full echo is rejected).
    flipped = [Passage(text="The dose is 5 mg.", relevant=False), Passage(text="Unrelated.", relevant=False)]
    assert "unchanged" not in failures(candidate("multi", question=MULTI.question, passages=flipped), MULTI)


def test_required_fields():
    assert failures(candidate(question="  "), SINGLE)["required_fields"] == "blank question"
    assert failures(candidate(context="\n"), SINGLE)["required_fields"] == "blank context"
    assert failures(candidate("multi", passages=[]), MULTI)["required_fields"] == "blank passages (none)"
    blank_one = [Passage(text="Edited.", relevant=True), Passage(text=" ", relevant=False)]
    assert failures(candidate("multi", passages=blank_one), MULTI)["required_fields"] == "blank passage 2"


def test_passages_dropped():
    one = [Passage(text="The dose was changed.", relevant=True)]
    assert failures(candidate("multi", passages=one), MULTI) == {
        "passages_dropped": "1 of the base item's 2 passages returned"
    }
    appended = [*MULTI.passages[:1], Passage(text="Edited.", relevant=False), Passage(text="Added.", relevant=True)]
    assert "passages_dropped" not in failures(candidate("multi", passages=appended), MULTI)


def test_passages_duplicated():
    doubled = [
        Passage(text="The dose was changed.", relevant=True),
        Passage(text="Unrelated.", relevant=False),
        Passage(text="Unrelated. ", relevant=True),
    ]
    assert failures(candidate("multi", passages=doubled), MULTI) == {
        "passages_duplicated": "1 passage(s) repeat another passage verbatim"
    }
    # Repeats the base item already has are not the generator's doing.
    base = BaseItem(
        id="b1",
        question="q?",
        answers=["a"],
        passages=[Passage(text="Same.", relevant=True), Passage(text="Same.", relevant=False)],
    )
    kept = [Passage(text="Same.", relevant=True), Passage(text="Same.", relevant=False)]
    assert "passages_duplicated" not in failures(candidate("multi", question="Other q?", passages=kept), base)


def test_template_leftover():
    assert failures(candidate(context="..."), SINGLE) == {"template_leftover": "placeholder value '...'"}
    assert failures(candidate(question="<true|false>"), SINGLE) == {
        "template_leftover": "placeholder value '<true|false>'"
    }
    assert failures(candidate(question="When was {{ item }} opened?"), SINGLE) == {
        "template_leftover": "template syntax '{{' in the text"
    }
    # An ellipsis inside ordinary text is not a placeholder; syntax the base item has is not a leftover.
    assert failures(candidate(context="The bridge opened in ... 1932."), SINGLE) == {}
    templated = BaseItem(id="b1", question="What does {{ x }} print?", answers=["x"], context="Jinja prints {{ x }}.")
    assert failures(candidate(question="What does {{ y }} print?", context="Jinja prints {{ x }}."), templated) == {}


def test_prompt_markup():
    copied = candidate(question="<question>\nWhen was the bridge closed?\n</question>")
    assert failures(copied, SINGLE) == {"prompt_markup": "prompt tag(s) <question> copied into the text"}
    tagged = [Passage(text='<passage index="1" relevant="true">Edited.</passage>', relevant=True), MULTI.passages[1]]
    assert failures(candidate("multi", passages=tagged), MULTI) == {
        "prompt_markup": "prompt tag(s) <passage> copied into the text"
    }
    assert failures(candidate(context="The <b>bridge</b> opened in 1932."), SINGLE) == {}


def test_refusal_code():
    leaked = candidate(context="The bridge opened at some point. REFUSE_INFO_MISSING_IN_CONTEXT")
    assert failures(leaked, SINGLE) == {"refusal_code": "refusal code(s) REFUSE_INFO_MISSING_IN_CONTEXT in the text"}
    assert failures(candidate(question="Which ANSWER_CORRECTLY applies?"), SINGLE) == {
        "refusal_code": "refusal code(s) ANSWER_CORRECTLY in the text"
    }
    assert failures(candidate(question="Did they refuse_missing the bid?"), SINGLE) == {}


def test_only_parsed_candidates_are_prechecked():
    broken = candidate(status="parse_error", question=None, context=None)
    echoed = candidate(question=SINGLE.question, context=SINGLE.context)
    checked = apply_prechecks([broken, echoed, candidate()], {"b1": SINGLE}, {"x": LEVER})
    assert [c.precheck_failures for c in checked] == [None, ["unchanged: question and context equal the base item"], []]
    assert [awaits_verification(c) for c in checked] == [False, False, True]
