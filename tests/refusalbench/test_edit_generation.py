"""Edit-style generation (``generation.edit_style``): the edit applier, a scripted run in both styles,
the default path unchanged, and the config option."""

from __future__ import annotations

import json
import textwrap

import pytest

from refusalbench.tasks.core.config import ModelConfig, load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.prompting import template_hash
from refusalbench.tasks.llm.scripted_replies import last_user_text, scripted_generator_responder
from refusalbench.tasks.llm.structured_outputs import (
    GeneratorMultiEdit,
    GeneratorMultiOutput,
    GeneratorSingleEdit,
    GeneratorSingleOutput,
    NewPassage,
    PassageTextEdit,
    TextEdit,
)
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage
from refusalbench.tasks.refusalbench.stages.assign import assign_levers
from refusalbench.tasks.refusalbench.stages.edits import EDIT_FAILURE, EditFailure, apply_edits, rewrite_of
from refusalbench.tasks.refusalbench.stages.generate import generate_candidates, generation_calls, generation_messages

ALL = frozenset({"generator_single", "generator_multi"})
SINGLE = BaseItem(
    id="s1",
    question="When did the canal open?",
    answers=["1794"],
    context="The canal opened in 1794. It carried coal. It closed in 1931.",
)
MULTI = BaseItem(
    id="m1",
    question="When did the canal open?",
    answers=["1794"],
    passages=[
        Passage(text="The canal opened in 1794. It carried coal.", relevant=True),
        Passage(text="Barges were pulled by horses.", relevant=False),
    ],
)


def edits(*pairs: tuple[str, str]) -> list[TextEdit]:
    return [TextEdit(find=find, replace=replace) for find, replace in pairs]


# ----------------------------------------------------------------- the applier (pure)


def test_edits_apply_exactly_and_in_any_order():
    text = SINGLE.context
    assert apply_edits(text, [], "context") == text
    assert (
        apply_edits(text, edits(("It carried coal. ", "")), "context") == "The canal opened in 1794. It closed in 1931."
    )
    both = edits(("in 1931", "later"), ("The canal opened in 1794.", "The canal opened."))
    assert (
        apply_edits(text, both, "context")
        == apply_edits(text, both[::-1], "context")
        == "The canal opened. It carried coal. It closed later."
    )
    # Located in the original, not in an earlier edit's result: a replacement is never edited again.
    assert apply_edits("a b", edits(("a", "b"), ("b", "c")), "q") == "b c"


@pytest.mark.parametrize(
    "found, reason",
    [
        (edits(("", "x")), "context edit 1: empty find"),
        (edits(("opened in 1795", "x")), "context edit 1: find text not in the original: 'opened in 1795'"),
        (edits(("It c", "x")), "context edit 1: find text occurs 2 times (ambiguous): 'It c'"),
        (edits(("coal", "gas"), ("carried coal", "x")), "context edits 2 and 1 overlap"),
        (edits(("The canal opened in 1794. it", "x")), "context edit 1: find text not in the original"),  # case counts
    ],
)
def test_an_edit_that_does_not_apply_says_why(found, reason):
    with pytest.raises(EditFailure) as info:
        apply_edits(SINGLE.context, found, "context")
    assert str(info.value).startswith(reason)


def test_overlapping_occurrences_are_ambiguous():
    with pytest.raises(EditFailure, match="occurs 2 times"):
        apply_edits("aaa", edits(("aa", "b")), "question")


def test_multi_rewrite_keeps_order_and_flags_and_appends_new_passages():
    output = GeneratorMultiEdit(
        question_edits=edits(("When", "In which year")),
        passage_edits=[PassageTextEdit(passage=1, find=" It carried coal.", replace="")],
        new_passages=[NewPassage(text="Some say 1795.", relevant=True)],
        rationale="r",
        answer_constraint_holds=True,
    )
    rewrite = rewrite_of(MULTI, output)
    assert isinstance(rewrite, GeneratorMultiOutput)
    assert rewrite.perturbed_question == "In which year did the canal open?"
    assert [(p.index, p.text, p.relevant) for p in rewrite.passages] == [
        (1, "The canal opened in 1794.", True),
        (2, "Barges were pulled by horses.", False),
        (3, "Some say 1795.", True),
    ]
    with pytest.raises(EditFailure, match=r"passage edit 1: no passage 3 \(the item has 2\)"):
        rewrite_of(
            MULTI, output.model_copy(update={"passage_edits": [PassageTextEdit(passage=3, find="a", replace="")]})
        )
    single = rewrite_of(
        SINGLE,
        GeneratorSingleEdit(
            question_edits=[], context_edits=edits(("1931", "the 1930s")), rationale="r", answer_constraint_holds=False
        ),
    )
    assert single == GeneratorSingleOutput(
        perturbed_question=SINGLE.question,
        rationale="r",
        perturbed_context="The canal opened in 1794. It carried coal. It closed in the 1930s.",
        answer_constraint_holds=False,
    )


# ----------------------------------------------------------------- generation through the scripted server


@pytest.fixture
def generation(fake_llm, tmp_path):
    """A gateway to the scripted generator; two single items and a multi one, each with a lever of four strata
    (question-only, context-only and both-sides levers among them)."""
    fake_llm.responder = scripted_generator_responder
    gateway = Gateway(
        {"gen": ModelConfig(model="openai/gen", api_base=fake_llm.url)}, SQLiteCache(tmp_path / "c.sqlite")
    )
    items = [
        SINGLE,
        SINGLE.model_copy(update={"id": "s2", "context": "Coal came by barge. The canal opened in 1794."}),
        MULTI,
    ]
    levers = load_catalogue()
    strata = [
        ("P-MissingInfo", "HIGH"),
        ("P-FalsePremise", "HIGH"),
        ("P-Ambiguity", "MEDIUM"),
        ("P-Contradiction", "LOW"),
    ]
    assignments = assign_levers(items, levers, seed=3, strata=strata)
    return gateway, {i.id: i for i in items}, {lv.id: lv for lv in levers}, assignments


def test_edit_style_yields_the_candidates_the_full_rewrite_gives(generation, fake_llm):
    gateway, items, levers, assignments = generation
    full = generate_candidates(gateway, assignments, items, levers, "gen")
    edit = generate_candidates(gateway, assignments, items, levers, "gen", edit_templates=ALL)
    assert len(fake_llm.calls) == 2 * len(assignments) == 24
    assert all(c.status == "ok" for c in full + edit)
    differs = {"prompt_hash", "raw", "completion_tokens", "prompt_tokens", "cost_usd", "latency_s", "cached"}
    for f, e in zip(full, edit):
        assert e.model_dump(exclude=differs) == f.model_dump(exclude=differs)
        assert e.prompt_hash == template_hash(f"generator_{e.variant}_edit.j2") != f.prompt_hash
    assert any(c.passages and len(c.passages) == 3 for c in edit)  # a HIGH lever appended a passage
    # Fewer output words: the scripted server bills whitespace-separated words.
    assert sum(c.completion_tokens for c in edit) < sum(c.completion_tokens for c in full)


def test_per_template_option_and_unchanged_default_prompts(generation):
    _, items, levers, assignments = generation
    default = generation_calls(assignments, items, levers, "gen")
    for spec, a in zip(default, assignments):
        assert spec.messages == generation_messages(
            items[a.base_id], levers[a.lever_id]
        )  # the call-cache key as before
        assert spec.schema_ in (GeneratorSingleOutput, GeneratorMultiOutput)
    only_multi = generation_calls(assignments, items, levers, "gen", frozenset({"generator_multi"}))
    assert [s.schema_.__name__ for s in only_multi] == [
        "GeneratorMultiEdit" if a.variant == "multi" else "GeneratorSingleOutput" for a in assignments
    ]
    assert [s.messages for s in only_multi if s.schema_ is GeneratorSingleOutput] == [
        s.messages for s in default if s.schema_ is GeneratorSingleOutput
    ]
    assert all("find-and-replace" in s.messages[0]["content"] for s in only_multi if s.schema_ is GeneratorMultiEdit)


def test_an_edit_that_does_not_apply_is_a_recorded_failure(generation, fake_llm):
    gateway, items, levers, assignments = generation
    bad = assignments[0]

    def respond(request):  # every edit reply about the first item quotes text its context lacks
        reply = scripted_generator_responder(request)
        if items[bad.base_id].context in last_user_text(request):
            return json.dumps({**json.loads(reply), "context_edits": [{"find": "not in the context", "replace": "x"}]})
        return reply

    fake_llm.responder = respond
    candidates = generate_candidates(gateway, assignments, items, levers, "gen", edit_templates=ALL)
    assert len(candidates) == len(assignments)  # nothing dropped
    failed = [c for c in candidates if c.status != "ok"]
    assert failed and all(c.status == "parse_error" and c.outcome == "parse_error" for c in failed)
    assert all(
        c.error == f"{EDIT_FAILURE}: context edit 1: find text not in the original: 'not in the context'"
        and c.raw
        and "not in the context" in c.raw
        for c in failed
    )
    assert {c.base_id for c in failed} == {bad.base_id} and len(failed) == 4


# ----------------------------------------------------------------- the config option


@pytest.mark.parametrize(
    "value, templates", [(None, set()), ("all", ALL), ("[generator_multi]", {"generator_multi"}), ("[]", set())]
)
def test_config_edit_style(tmp_path, value, templates):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent("""\
        models:
          gen: {model: openai/gen}
        generation:
          base_set: items.jsonl
          generators: [gen]
          verifiers: [gen]
        """)
        + (f"  edit_style: {value}\n" if value is not None else "")
    )
    assert load_config(path).generation.edit_templates() == templates


@pytest.mark.parametrize(
    "value, problem",
    [
        ("[generator_sngle]", "unknown generator template 'generator_sngle'"),
        ("full", "'full' is not a list of generator templates"),
    ],
)
def test_config_edit_style_rejects_unknown_templates(tmp_path, value, problem):
    path = tmp_path / "run.yaml"
    path.write_text(
        "models:\n  gen: {model: openai/gen}\ngeneration:\n  base_set: items.jsonl\n  generators: [gen]\n"
        f"  verifiers: [gen]\n  edit_style: {value}\n"
    )
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value).startswith(
        f"{path}:7: generation.edit_style: {problem}: choose from generator_single, generator_multi"
    )


def test_dry_run_replies_to_edit_requests_with_edits_that_apply():
    from refusalbench.tasks.llm.scripted_replies import dry_run_responder
    from refusalbench.tasks.llm.structured_outputs import parse_output
    from refusalbench.tasks.refusalbench.stages.generate import generation_prompt

    lever = next(lv for lv in load_catalogue() if lv.intensity == "HIGH" and lv.target == "query-context")
    for item in (SINGLE, MULTI):
        messages, schema = generation_prompt(item, lever, ALL)
        reply = dry_run_responder(
            {
                "messages": messages,
                "response_format": {"type": "json_schema", "json_schema": {"name": schema.__name__, "schema": {}}},
            }
        )
        output, error = parse_output(schema, reply)
        assert error is None
        rewrite = rewrite_of(item, output)
        assert rewrite.perturbed_question != item.question
