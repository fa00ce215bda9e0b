"""Refusal-code and confidence parsing (DESIGN.md §6)."""

from __future__ import annotations

import pytest

from refusalbench.tasks.refusalbench.decisions import (
    ANSWER,
    CONFIDENCE_LEVELS,
    confidence_value,
    find_codes,
    is_verbal_confidence,
    normalise_decision,
    parse_confidence,
    parse_decision,
)

# Every spelling DESIGN.md §6 lists, with the canonical code it must map to.
ALIASES = {
    "REFUSE_AMBIGUOUS": "REFUSE_AMBIGUOUS_QUERY",
    "REFUSE_AMBIGUOUS_QUERY": "REFUSE_AMBIGUOUS_QUERY",
    "REFUSE_CONTRADICTORY": "REFUSE_CONTRADICTORY_CONTEXT",
    "REFUSE_CONTRADICT": "REFUSE_CONTRADICTORY_CONTEXT",
    "REFUSE_CONTRADICTORY_CONTEXT": "REFUSE_CONTRADICTORY_CONTEXT",
    "REFUSE_MISSING": "REFUSE_INFO_MISSING_IN_CONTEXT",
    "REFUSE_INFO_MISSING": "REFUSE_INFO_MISSING_IN_CONTEXT",
    "REFUSE_INFO_MISSING_IN_CONTEXT": "REFUSE_INFO_MISSING_IN_CONTEXT",
    "REFUSE_FALSE_PREMISE": "REFUSE_FALSE_PREMISE_IN_QUERY",
    "REFUSE_FALSE_PREMISE_IN_QUERY": "REFUSE_FALSE_PREMISE_IN_QUERY",
    "REFUSE_GRANULARITY": "REFUSE_GRANULARITY_MISMATCH",
    "REFUSE_GRANULARITY_MISMATCH": "REFUSE_GRANULARITY_MISMATCH",
    "REFUSE_NONFACTUAL": "REFUSE_NONFACTUAL_QUERY",
    "REFUSE_NONFACTUAL_QUERY": "REFUSE_NONFACTUAL_QUERY",
    "REFUSE_OTHER": "REFUSE_OTHER",
}

WRAPPERS = [
    "{}",
    "**{}**",
    "__{}__",
    "`{}`",
    "*{}*",
    "Decision: {}.",
    "I cannot answer this question from the passage ({}).",
    "The passage does not say.\n\n> {}\n",
    '{{"decision": "{}"}}',
]


@pytest.mark.parametrize("spelling,canonical", sorted(ALIASES.items()))
@pytest.mark.parametrize("case", [str.upper, str.lower, str.title])
def test_every_alias_in_any_case_maps_to_its_canonical_code(spelling, canonical, case):
    assert parse_decision(case(spelling)) == canonical


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("spelling,canonical", sorted(ALIASES.items()))
def test_codes_are_found_inside_markdown_and_prose(spelling, canonical, wrapper):
    assert parse_decision(wrapper.format(spelling)) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "The information is missing from the context.",
        "Missing information: the passage does not give a date.",
        "This question is ambiguous and the context is contradictory; I refuse.",
        "The answer is 1912.",
        "REFUSE_CONTRADICTION",  # not a listed spelling: letters continue the code
        "XREFUSE_MISSING",  # a letter before the code
        "REFUSE_MISSING2",  # a digit after the code
        "ANSWER_CORRECTLY",
    ],
)
def test_prose_without_a_code_is_an_answer_attempt(text):
    assert parse_decision(text) == ANSWER


@pytest.mark.parametrize("text", [None, "", "   "])
def test_empty_or_absent_reply_is_an_answer_attempt(text):
    assert parse_decision(text) == ANSWER


def test_several_distinct_codes_last_one_wins():
    text = "At first I thought REFUSE_AMBIGUOUS, but really **REFUSE_FALSE_PREMISE**."
    assert parse_decision(text) == "REFUSE_FALSE_PREMISE_IN_QUERY"
    assert parse_decision("REFUSE_OTHER ... refuse_contradict") == "REFUSE_CONTRADICTORY_CONTEXT"
    # A repeat of an earlier code after another one makes the repeated code last.
    assert parse_decision("REFUSE_MISSING, REFUSE_OTHER, REFUSE_MISSING") == "REFUSE_INFO_MISSING_IN_CONTEXT"


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize(
    "text",
    [
        "REFUSE_AMBIGUOUS then REFUSE_INFO_MISSING_IN_CONTEXT",
        "refuse_info_missing_in_context, REFUSE_OTHER",
        "REFUSE_CONTRADICT REFUSE_CONTRADICTORY_CONTEXT_ REFUSE_FALSE_PREMISE",
        "no code here",
    ],
)
def test_last_code_shortcut_agrees_with_the_full_scan(text, wrapper):
    text = wrapper.format(text)
    codes = find_codes(text)
    assert parse_decision(text) == (codes[-1] if codes else ANSWER)


def test_long_spelling_is_one_code_not_also_its_prefix():
    assert find_codes("REFUSE_INFO_MISSING_IN_CONTEXT") == ["REFUSE_INFO_MISSING_IN_CONTEXT"]
    assert find_codes("REFUSE_CONTRADICTORY_CONTEXT") == ["REFUSE_CONTRADICTORY_CONTEXT"]
    assert find_codes("REFUSE_AMBIGUOUS then REFUSE_INFO_MISSING_IN_CONTEXT") == [
        "REFUSE_AMBIGUOUS_QUERY",
        "REFUSE_INFO_MISSING_IN_CONTEXT",
    ]
    assert find_codes("REFUSE_FALSE_PREMISE_IN_QUERY and REFUSE_GRANULARITY_MISMATCH") == [
        "REFUSE_FALSE_PREMISE_IN_QUERY",
        "REFUSE_GRANULARITY_MISMATCH",
    ]


def test_normalise_decision_accepts_answer_and_aliases_only():
    assert normalise_decision("answer") == ANSWER
    assert normalise_decision(" ANSWER_CORRECTLY ") == ANSWER
    assert normalise_decision("refuse_missing") == "REFUSE_INFO_MISSING_IN_CONTEXT"
    assert normalise_decision("maybe") is None
    assert normalise_decision(None) is None


# ----------------------------------------------------------------- confidence


@pytest.mark.parametrize(
    "text,expected",
    [
        ("VERY_CONFIDENT", "VERY_CONFIDENT"),
        ("very confident", "VERY_CONFIDENT"),
        ("Very-Confident", "VERY_CONFIDENT"),
        ("CONFIDENT", "CONFIDENT"),
        ("somewhat_confident", "SOMEWHAT_CONFIDENT"),
        ("uncertain", "UNCERTAIN"),
        ("VERY UNCERTAIN", "VERY_UNCERTAIN"),
        ("CONFIDENCE: VERY_UNCERTAIN", "VERY_UNCERTAIN"),  # contains UNCERTAIN
        ("Confidence: very confident", "VERY_CONFIDENT"),  # contains CONFIDENT
        ("**Confidence:** SOMEWHAT CONFIDENT", "SOMEWHAT_CONFIDENT"),
        ("Answer: Paris\nCONFIDENCE LEVEL = uncertain", "UNCERTAIN"),
        ("Paris.\nCONFIDENCE: 0.8", "0.8"),
        ("Paris.\nConfidence: 80%", "0.8"),
        ("Confidence: 80", "0.8"),  # after a label, >1 is a percentage
        ("Confidence = 0.35 (fairly low)", "0.35"),
        ("0.8", "0.8"),
        ("80%", "0.8"),
        ("1", "1.0"),
        ("REFUSE_MISSING\nVERY_CONFIDENT", "VERY_CONFIDENT"),  # code-like token without a label
        ("CONFIDENCE: CONFIDENT\nlater CONFIDENCE: UNCERTAIN", "UNCERTAIN"),  # last label wins
    ],
)
def test_parse_confidence(text, expected):
    assert parse_confidence(text) == expected


@pytest.mark.parametrize(
    "text",
    [None, "", "I am confident the answer is Paris.", "42", "Confidence: 150", "The year was 1912.", "sure"],
)
def test_parse_confidence_none(text):
    assert parse_confidence(text) is None


def test_confidence_values():
    assert {level: confidence_value(level) for level in CONFIDENCE_LEVELS} == {
        "VERY_CONFIDENT": 0.95,
        "CONFIDENT": 0.8,
        "SOMEWHAT_CONFIDENT": 0.6,
        "UNCERTAIN": 0.4,
        "VERY_UNCERTAIN": 0.15,
    }
    assert confidence_value("very uncertain") == 0.15
    assert confidence_value(0.3) == 0.3
    assert confidence_value(1) == 1.0
    assert confidence_value("0.25") == 0.25
    assert confidence_value("65%") == 0.65
    assert confidence_value(float("nan")) is None
    assert confidence_value(None) is None
    assert confidence_value(1.5) is None
    assert confidence_value("no idea") is None


def test_is_verbal_confidence():
    assert is_verbal_confidence("Somewhat confident")
    assert not is_verbal_confidence("0.6")
    assert not is_verbal_confidence(0.6)
