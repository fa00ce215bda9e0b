"""The rule-based generator: each rule on small items, its honesty checks, its place in configs,
and a generation flow where it is the only generator (the scripted server sees verifier calls only)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from pydantic import ValidationError

from refusalbench.tasks.core.config import ModelConfig, load_config, packaged_config
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.local_models import check_available, model_status
from refusalbench.tasks.refusalbench.basesets import load_base_set
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.rule_generator import (
    RULES,
    NotApplicable,
    apply_rule,
    register_rule,
    rule_skips,
    ruleset_hash,
)
from refusalbench.tasks.refusalbench.rule_generator.text import answer_pattern, content_words, sentences
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage
from refusalbench.tasks.refusalbench.stages.assign import assign_levers, parse_strata, sample_base_items
from refusalbench.tasks.refusalbench.stages.generate import candidate_id, rule_candidates
from tests.conftest import ROOT
from tests.scripted import verifier_reply

LEVERS = {lever.id: lever for lever in load_catalogue()}


def single(question: str, answers: list[str], context: str, id: str = "x") -> BaseItem:
    return BaseItem(id=id, question=question, answers=answers, context=context)


def apply(lever_id: str, item: BaseItem, key: str = "k"):
    return apply_rule(item, LEVERS[lever_id], key)


BRIDGE = single(
    "When did the Harbour Bridge open?",
    ["1932"],
    "Work on the Harbour Bridge began after a long debate. The Harbour Bridge opened in 1932. "
    "It carries eight lanes of traffic.",
)
LANES = single(
    "How many lanes does the bridge carry?",
    ["eight", "8"],
    "The bridge took six years to build. It carries eight lanes of traffic across the harbour. "
    "Its arch is made of steel.",
)
FOUNDER = single(
    "Who founded the pump works in Leeds?",
    ["Ada Lee"],
    "The pump works in Leeds was founded by Ada Lee in 1901. Ms Lee had trained as an engineer in Glasgow. "
    "The works makes pumps for farms.",
)


# ---------------------------------------------------------------- the registry


def test_every_rule_realises_a_catalogue_lever_of_its_class() -> None:
    assert len(RULES) >= 10
    for lever_id, rule in RULES.items():
        lever = LEVERS[lever_id]  # KeyError: a rule for a lever the catalogue does not have
        module_class = {"missing_info": "P-MissingInfo", "contradiction": "P-Contradiction"}[
            rule.__module__.rsplit(".", 1)[1]
        ]
        assert lever.perturbation_class == module_class, lever_id


def test_a_lever_has_one_rule_and_an_unruled_lever_is_not_applicable() -> None:
    with pytest.raises(
        ValueError, match="rule for lever 'missing-info-medium-answer-clause-excised' is already registered"
    ):
        register_rule("missing-info-medium-answer-clause-excised")(lambda item, key: None)
    unruled = next(lever for lever in LEVERS.values() if lever.id not in RULES)
    with pytest.raises(NotApplicable, match="no rule"):
        apply_rule(BRIDGE, unruled, "k")


# ---------------------------------------------------------------- missing information


def test_answer_sentences_are_deleted_and_the_rest_kept() -> None:
    out = apply("missing-info-medium-answer-clause-excised", LANES)
    assert out.question == LANES.question and out.passages is None
    assert out.context == "The bridge took six years to build. Its arch is made of steel."
    assert "Deleted the 1 sentence" in out.rationale


def test_token_purge_also_deletes_sentences_with_a_name_of_the_answer() -> None:
    medium = apply("missing-info-medium-answer-clause-excised", FOUNDER).context
    high = apply("missing-info-high-answer-token-purge", FOUNDER).context
    # "Lee" alone is a name of the answer: the HIGH rule removes "Ms Lee ..." as well.
    assert medium == "Ms Lee had trained as an engineer in Glasgow. The works makes pumps for farms."
    assert high == "The works makes pumps for farms."


def test_pointer_rules_replace_every_mention_of_the_answer() -> None:
    table = apply("missing-info-medium-placeholder-citation", LANES).context
    assert "It carries [given in Table 4] lanes of traffic" in table and "eight" not in table
    audio = apply("missing-info-high-audio-only-reference", LANES).context
    assert "[stated in the attached recording]" in audio and "eight" not in audio


def test_time_expression_is_deleted_only_when_no_other_date_remains() -> None:
    out = apply("missing-info-medium-missing-temporal-adjunct", BRIDGE)
    assert "The Harbour Bridge opened." in out.context and not re.search(r"\d{4}", out.context)
    dated = BRIDGE.model_copy(update={"context": BRIDGE.context + " It was widened in 1988."})
    with pytest.raises(NotApplicable, match="another date"):
        apply("missing-info-medium-missing-temporal-adjunct", dated)
    with pytest.raises(NotApplicable, match="does not ask when"):
        apply("missing-info-medium-missing-temporal-adjunct", LANES)


def test_unrelated_context_shares_no_term_with_the_question() -> None:
    out = apply("missing-info-high-entirely-irrelevant-context", LANES)
    assert not content_words(out.context) & content_words(LANES.question)
    multi = BaseItem(
        id="m",
        question="What is the dose?",
        answers=["5 mg"],
        passages=[Passage(text="The dose is 5 mg.", relevant=True), Passage(text="Tablets are white.", relevant=False)],
    )
    passages = apply("missing-info-high-entirely-irrelevant-context", multi).passages
    assert len(passages) == 2 and not any(p.relevant for p in passages)  # every passage is noise now
    assert passages[1].text == "Tablets are white."


def test_names_are_redacted_when_the_answer_is_a_name() -> None:
    out = apply("missing-info-high-all-names-redacted", FOUNDER).context
    assert "Ada" not in out and "Lee" not in out and "Leeds" not in out and "Glasgow" not in out
    assert out == (
        "The pump works in [REDACTED] was founded by [REDACTED] in 1901. [REDACTED] had trained as an "
        "engineer in [REDACTED]. The works makes pumps for farms."
    )
    with pytest.raises(NotApplicable, match="not a name"):
        apply("missing-info-high-all-names-redacted", LANES)


def test_refusal_rules_leave_no_mention_of_the_answer_on_the_sample_sets() -> None:
    items = [*load_base_set(ROOT / "data/sample_single.jsonl"), *load_base_set(ROOT / "data/sample_multi.jsonl")]
    applied = 0
    for lever_id in (i for i in RULES if i.startswith("missing-info-") and "-low-" not in i):
        for item in items:
            try:
                out = apply(lever_id, item, item.id)
            except NotApplicable:
                continue
            applied += 1
            texts = [out.context] if out.context is not None else [p.text for p in out.passages]
            assert not any(answer_pattern(item.answers).search(t) for t in texts), (lever_id, item.id)
            assert out.question == item.question
    assert applied > 100


# ---------------------------------------------------------------- missing information, LOW


def test_low_rules_keep_the_answer() -> None:
    example = single(
        "Which gas do plants take in?",
        ["carbon dioxide"],
        "Plants take in carbon dioxide. For example, an oak absorbs it all summer. Leaves are green.",
    )
    assert (
        apply("missing-info-low-drop-example-sentence", example).context
        == "Plants take in carbon dioxide. Leaves are green."
    )
    aside = single(
        "Which gas do plants take in?",
        ["carbon dioxide"],
        "Plants take in carbon dioxide. Leaves (like needles) hold chlorophyll.",
    )
    assert (
        apply("missing-info-low-parenthetical-excise", aside).context
        == "Plants take in carbon dioxide. Leaves hold chlorophyll."
    )
    date = single("In which year did the wall fall?", ["1989"], "The wall fell on 9 November 1989. Crowds gathered.")
    assert apply("missing-info-low-trim-month-but-keep-year", date).context == "The wall fell in 1989. Crowds gathered."
    with pytest.raises(NotApplicable):
        apply(
            "missing-info-low-parenthetical-excise",
            single("What is the boiling point?", ["100 degrees"], "Water boils at 100 degrees (at sea level)."),
        )


# ---------------------------------------------------------------- contradiction


def test_ten_fold_figure_is_inserted_beside_the_original() -> None:
    item = single("How many bones does an adult have?", ["206"], "A baby has about 270 bones. An adult has 206 bones.")
    out = apply("contradiction-high-order-of-magnitude-numeric-clash", item)
    assert sentences(out.context) == [
        "A baby has about 270 bones.",
        "An adult has 206 bones, according to one official statistical publication.",
        "An adult has 2060 bones, according to another official statistical publication.",
    ]


def test_written_out_numbers_years_and_units_conflict_too() -> None:
    assert (
        "It carries 80 lanes of traffic" in apply("contradiction-high-order-of-magnitude-numeric-clash", LANES).context
    )
    dates = apply("contradiction-medium-dual-authoritative-dates", BRIDGE).context
    years = re.findall(r"opened in (\d{4}), according to (the [\w ]+)", dates)
    assert years[0] == ("1932", "the national archive") and years[1][0] != "1932"
    assert years[1][1] == "the official state register" and 2 <= abs(int(years[1][0]) - 1932) <= 9
    unit = single("How long is the span?", ["503 metres"], "The span is 503 metres long.")
    assert (
        "The span is 503 feet long, according to another technical reference."
        in apply("contradiction-medium-conflicting-numerical-units", unit).context
    )
    with pytest.raises(NotApplicable, match="not a year"):
        apply("contradiction-medium-dual-authoritative-dates", LANES)
    with pytest.raises(NotApplicable, match="not a number"):
        apply("contradiction-high-order-of-magnitude-numeric-clash", FOUNDER)


def test_low_contradiction_blames_an_unreliable_source_and_keeps_the_answer() -> None:
    out = apply("contradiction-low-fringe-vs-official-source", LANES).context
    assert "eight lanes of traffic across the harbour, according to the official reference figures." in out
    assert re.search(
        r"\d+ lanes of traffic across the harbour, according to an anonymous post on a conspiracy forum\.", out
    )


def test_multi_document_clash_goes_into_another_signal_passage() -> None:
    item = BaseItem(
        id="m",
        question="What is the dose?",
        answers=["5 mg"],
        passages=[
            Passage(text="The dose is 5 mg.", relevant=True),
            Passage(text="Tablets are white.", relevant=True),
            Passage(text="Unrelated.", relevant=False),
        ],
    )
    passages = apply("contradiction-high-order-of-magnitude-numeric-clash", item).passages
    assert passages[0].text.startswith("The dose is 5 mg, according to one")
    assert (
        passages[1].text
        == "Tablets are white. The dose is 50 mg, according to another official statistical publication."
    )
    assert passages[2].text == "Unrelated."
    lonely = item.model_copy(update={"passages": item.passages[:1]})
    with pytest.raises(NotApplicable, match="second signal passage"):
        apply("contradiction-high-order-of-magnitude-numeric-clash", lonely)


# ---------------------------------------------------------------- honesty checks and determinism


def test_a_rule_does_not_apply_where_it_would_be_dishonest() -> None:
    with pytest.raises(NotApplicable, match="not written verbatim"):
        apply("missing-info-medium-answer-clause-excised", single("Q?", ["Paris"], "Nothing here. Nor here."))
    with pytest.raises(NotApplicable, match="question itself"):
        apply("missing-info-medium-answer-clause-excised", single("Is it Paris?", ["Paris"], "It is Paris. Yes."))
    with pytest.raises(NotApplicable, match="every sentence"):
        apply("missing-info-medium-answer-clause-excised", single("Where?", ["Paris"], "In Paris."))


def test_rules_are_deterministic_and_keyed_by_the_assignment() -> None:
    for lever_id in RULES:
        for item in (BRIDGE, LANES, FOUNDER):
            try:
                first = apply(lever_id, item, "key-1")
            except NotApplicable:
                continue
            assert apply(lever_id, item, "key-1") == first
    drifts = {apply("contradiction-medium-source-timing-drift", LANES, f"key-{i}").context for i in range(12)}
    assert len(drifts) > 1  # the changed value depends on the assignment key, not on chance


def test_rule_candidates_are_parsed_rows_with_the_rules_hash_and_skips_are_counted() -> None:
    items = {i.id: i for i in (BRIDGE.model_copy(update={"id": "b"}), LANES.model_copy(update={"id": "l"}))}
    levers = [
        lever for lever in LEVERS.values() if (lever.perturbation_class, lever.intensity) == ("P-MissingInfo", "MEDIUM")
    ]
    assignments = assign_levers(
        list(items.values()), levers, seed=0, levers_per_stratum=len(levers), strata=[("P-MissingInfo", "MEDIUM")]
    )
    candidates = rule_candidates(assignments, items, LEVERS, "rules")
    # b: answer sentence excised, pointer, time expression deleted; l: the first two.
    assert sorted((c.base_id, c.lever_id.split("-", 3)[3]) for c in candidates) == [
        ("b", "answer-clause-excised"),
        ("b", "missing-temporal-adjunct"),
        ("b", "placeholder-citation"),
        ("l", "answer-clause-excised"),
        ("l", "placeholder-citation"),
    ]
    by_assignment = {a.assignment_id: a for a in assignments}
    for c in candidates:
        assert c.status == "ok" and c.generator == "rules" and c.prompt_hash == ruleset_hash()
        assert (
            c.candidate_id == candidate_id(c.assignment_id, "rules") and c.expected == "REFUSE_INFO_MISSING_IN_CONTEXT"
        )
        assert c.intensity == by_assignment[c.assignment_id].intensity and c.rationale and c.cost_usd == 0.0
    skips = rule_skips(assignments, items, LEVERS)
    assert sum(skips.values()) == len(assignments) - len(candidates)
    assert skips["no rule for this lever"] == 2 * (len(levers) - 3)


# ---------------------------------------------------------------- a generator named like a model


def test_config_names_the_rule_generator_like_a_model() -> None:
    rules = ModelConfig(model="rules/v1")
    assert rules.rule_based and not ModelConfig(model="openai/gpt-4o").rule_based
    with pytest.raises(ValidationError, match="unknown rule set"):
        ModelConfig(model="rules/v9")
    with pytest.raises(ValidationError, match="runs in process"):
        ModelConfig(model="rules/v1", api_base="http://127.0.0.1:9/v1")
    assert check_available(["rules"], {"rules": rules}, probe=True) == {"rules": None}
    assert model_status("rules", rules, probe=True)["runs_on"].startswith("in process")


def test_the_gateway_refuses_to_send_a_prompt_to_the_rule_generator() -> None:
    result = Gateway({"rules": ModelConfig(model="rules/v1")}).complete("rules", [{"role": "user", "content": "hello"}])
    assert result.error_kind == "call_error" and "rule-based generator" in result.error


def test_demo_lists_the_rule_generator_beside_the_llm_generators() -> None:
    cfg = load_config(packaged_config("demo.yaml"))
    gen = cfg.generation
    assert "rules" in gen.generators and cfg.models["rules"].rule_based
    assert sum(not cfg.models[g].rule_based for g in gen.generators) >= 1
    assert "rules" not in gen.verifiers and "rules" not in cfg.evaluation.targets
    # Its two local verifiers still judge every candidate, but are too small to decide (demo.yaml says why).
    assert len(gen.verifiers) == 2 and gen.filter == "none"
    # The claim in demo.yaml: over seeds 0-9 the draw gives the rules a MEDIUM/HIGH item on most seeds.
    base = load_base_set(cfg.resolve_path(gen.base_set))
    covered = 0
    for seed in range(10):
        items = sample_base_items(base, gen.base_sample, seed)
        assignments = assign_levers(items, list(LEVERS.values()), seed=seed, strata=parse_strata(gen.strata))
        made = rule_candidates(assignments, {i.id: i for i in items}, LEVERS, "rules")
        covered += any(c.intensity != "LOW" for c in made)
    assert covered >= 6


# ---------------------------------------------------------------- in a generation flow


@pytest.mark.usefixtures("prefect_harness")
def test_rule_generator_in_a_flow_makes_no_call_and_is_verified_like_any_generator(tmp_path, fake_llm) -> None:
    from refusalbench.flows.launch import run_generation

    rows = [BRIDGE.model_copy(update={"id": "b"}), LANES.model_copy(update={"id": "l"})]
    (tmp_path / "base.jsonl").write_text("\n".join(r.model_dump_json(exclude_none=True) for r in rows) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(f"""
models:
  rules: {{model: rules/v1}}
  ver-a: {{model: openai/ver-a, api_base: {fake_llm.url}, max_attempts: 2}}
cache:
  path: {tmp_path / "calls.sqlite"}
generation:
  base_set: base.jsonl
  generators: [rules]
  verifiers: [ver-a]
  seed: 3
  strata: [P-MissingInfo/MEDIUM]
  levers_per_stratum: 11
""")
    # The verifier fails the pointer-to-a-table candidates: they must be filtered out like any other.
    fake_llm.responder = lambda req: verifier_reply(
        "FAIL" if "[given in Table 4]" in json.dumps(req["messages"]) else "PASS"
    )
    out = tmp_path / "run"
    result = run_generation(str(config), str(out))

    assert {call["model"] for call in fake_llm.calls} == {"ver-a"} and len(fake_llm.calls) == 5
    candidates = pd.read_parquet(out / "candidates.parquet")
    assert len(candidates) == 5 and set(candidates.status) == {"ok"} and set(candidates.generator) == {"rules"}
    verifications = pd.read_parquet(out / "verifications.parquet")
    assert len(verifications) == 5 and (verifications.verdict == "FAIL").sum() == 2
    assert result.accepted == 3
    bench = pd.read_parquet(out / "benchmark.parquet")
    assert len(bench) == 3 and set(bench.generator) == {"rules"}
    assert set(bench.expected) == {"REFUSE_INFO_MISSING_IN_CONTEXT"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(manifest["counts"]["rule_skips"].values()) == 22 - 5
    gv = json.loads((out / "gv_analysis.json").read_text())
    assert gv["pass_rate_matrix"]["rules"]["ver-a"] == pytest.approx(3 / 5)

    # Reproducible: a second run elsewhere writes the same candidates (and is served from the cache).
    run_generation(str(config), str(tmp_path / "again"))
    again = pd.read_parquet(tmp_path / "again" / "candidates.parquet")
    pd.testing.assert_frame_equal(again.drop(columns="cached"), candidates.drop(columns="cached"))
    assert len(fake_llm.calls) == 5
