"""The verifier prompt states exactly what a perturbation changed (tasks/refusalbench/stages/change_summary.py)."""

from __future__ import annotations

from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, Passage
from refusalbench.tasks.refusalbench.stages.change_summary import change_summary, diff_sentences, text_changes
from refusalbench.tasks.refusalbench.stages.verify import verification_messages

CONTEXT = "The bridge opened in 1932. It is 503 metres long. Tolls were removed in 1970."


def candidate(item: BaseItem, **fields) -> Candidate:
    base = dict(
        candidate_id="c1",
        assignment_id="a1",
        base_id=item.id,
        lever_id="x",
        perturbation_class="P-MissingInfo",
        intensity="MEDIUM",
        variant=item.variant,
        generator="rules",
        status="ok",
        expected="REFUSE_MISSING",
        prompt_hash="0" * 12,
        question=item.question,
        context=item.context,
        passages=item.passages,
    )
    return Candidate(**{**base, **fields})


def test_sentences_split_on_end_punctuation_and_collapse_whitespace():
    assert diff_sentences("One.  Two!\nThree?  Four") == ["One.", "Two!", "Three?", "Four"]
    assert diff_sentences(None) == [] and diff_sentences("   ") == []


def test_a_deleted_sentence_is_named_and_nothing_else():
    perturbed = "The bridge opened in 1932. Tolls were removed in 1970."
    assert text_changes(CONTEXT, perturbed) == ['removed: "It is 503 metres long."']
    assert text_changes(CONTEXT, " ".join(CONTEXT.split())) == []


def test_added_and_rewritten_sentences():
    perturbed = "The bridge opened in 1933. It is 503 metres long. Tolls were removed in 1970. A survey disagrees."
    assert text_changes(CONTEXT, perturbed) == [
        'rewritten: "The bridge opened in 1932." -> "The bridge opened in 1933."',
        'added: "A survey disagrees."',
    ]


def test_single_summary_says_question_unchanged_and_lists_context_edits():
    item = BaseItem(id="b1", question="How long is the bridge?", answers=["503 metres"], context=CONTEXT)
    text = change_summary(item, candidate(item, context="The bridge opened in 1932. Tolls were removed in 1970."))
    assert text.splitlines() == [
        "- Question: unchanged.",
        "- Context (3 sentence(s) before): 1 edit(s)",
        '  - removed: "It is 503 metres long."',
    ]
    rewritten = change_summary(item, candidate(item, question="How long is the tunnel?"))
    assert rewritten.splitlines() == [
        '- Question: rewritten: "How long is the bridge?" -> "How long is the tunnel?"',
        "- Context: unchanged.",
    ]


def test_multi_summary_covers_each_passage_new_passages_and_flags():
    passages = [Passage(text="A is 5. B is 6.", relevant=True), Passage(text="Noise here.", relevant=False)]
    item = BaseItem(id="b2", question="What is A?", answers=["5"], passages=passages)
    perturbed = [
        Passage(text="A is 5. B is 6.", relevant=False),
        Passage(text="Noise here.", relevant=False),
        Passage(text="A is 7.", relevant=True),
    ]
    assert change_summary(item, candidate(item, passages=perturbed)).splitlines() == [
        "- Question: unchanged.",
        "- Passage 1: unchanged.",
        "  - relevance flag: True -> False",
        "- Passage 2: unchanged.",
        "- Passage 3 (new, relevant): added.",
    ]


def test_the_verifier_prompt_carries_the_summary():
    lever = next(lv for lv in load_catalogue() if lv.perturbation_class == "P-MissingInfo" and lv.intensity == "MEDIUM")
    item = BaseItem(id="b1", question="How long is the bridge?", answers=["503 metres"], context=CONTEXT)
    messages = verification_messages(
        candidate(item, lever_id=lever.id, context="The bridge opened in 1932."), item, lever
    )
    user = messages[-1]["content"]
    assert "# What changed" in user
    assert 'removed: "It is 503 metres long." "Tolls were removed in 1970."' in user
