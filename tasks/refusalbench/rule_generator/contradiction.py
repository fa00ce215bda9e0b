"""Rules for contradiction levers: the answer's sentence restated with a conflicting figure, year
or unit, each version attributed to a named source (at LOW, the clash comes from an obviously
unreliable one, so the item stays answerable)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from refusalbench.tasks.refusalbench.rule_generator.base import (
    NotApplicable,
    RuleOutput,
    answers_pattern,
    item_texts,
    register_rule,
    rule_output,
)
from refusalbench.tasks.refusalbench.rule_generator.text import NUMBER, YEAR, pick, sentences
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage

# Small numbers are often written out ("nine members"); an altered one is written in digits.
_WORD_VALUES = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
# A figure stands on its own: the 2 of "CO2" or "B2B" is not one.
_FIGURE = re.compile(rf"(?<![\w.])(?:{NUMBER.pattern})(?!\w)|\b(?:{'|'.join(_WORD_VALUES)})\b", re.IGNORECASE)


def _value(figure: str) -> float:
    return float(_WORD_VALUES.get(figure.lower(), figure.replace(",", "")))


@dataclass(frozen=True)
class _Figure:
    """Where the answer sits: passage, sentence, and the span of the answer (with a number) in that sentence."""

    passage: int
    sentence: int
    start: int
    end: int


def _answer_figure(item: BaseItem, passages: list[Passage]) -> _Figure:
    numeric = [a for a in item.answers if _FIGURE.search(a)]
    if not numeric:
        raise NotApplicable("the answer is not a number")
    pattern = answers_pattern(numeric)
    for p_index, passage in enumerate(passages):
        if not passage.relevant:
            continue
        for s_index, sentence in enumerate(sentences(passage.text)):
            found = pattern.search(sentence)
            if found:
                return _Figure(p_index, s_index, found.start(), found.end())
    raise NotApplicable("the answer's figure is not written in a signal passage")


def _format_like(value: float, like: str) -> str:
    decimals = len(like.split(".", 1)[1]) if "." in like and like[0].isdigit() else 0
    grouped = "," in like or value >= 10_000
    return f"{value:,.{decimals}f}" if grouped else f"{value:.{decimals}f}"


def _is_year(number: str) -> bool:
    return bool(YEAR.fullmatch(number))


def _attributed(sentence: str, source: str) -> str:
    return f"{sentence.rstrip().rstrip('.!?')}, according to {source}."


def _restate(
    item: BaseItem,
    passages: list[Passage],
    figure: _Figure,
    replacement: tuple[int, int, str],
    sources: tuple[str, str],
    rationale: str,
) -> RuleOutput:
    """The answer's sentence attributed to the first source, and its altered copy attributed to the
    second: right after it (single context) or in a second signal passage (multi-document)."""
    parts = sentences(passages[figure.passage].text)
    original = parts[figure.sentence]
    start, end, new = replacement
    clash = _attributed(original[:start] + new + original[end:], sources[1])
    parts[figure.sentence] = _attributed(original, sources[0])
    if item.passages is None:
        parts.insert(figure.sentence + 1, clash)
    else:
        other = next((p for i, p in enumerate(passages) if p.relevant and i != figure.passage), None)
        if other is None:
            raise NotApplicable("the lever needs a second signal passage")
        other.text = f"{other.text.rstrip()} {clash}"
    passages[figure.passage].text = " ".join(parts)
    return rule_output(
        item, passages, f"{rationale}; the original is attributed to {sources[0]}, the altered copy to {sources[1]}."
    )


def _number_rule(
    item: BaseItem, key: str, change: Callable[[str, str], str | None], sources: tuple[str, str], unsuitable: str
) -> RuleOutput:
    """Restate the answer with each of its figures changed by ``change(figure, key)`` (None: kept)."""
    passages = item_texts(item)
    figure = _answer_figure(item, passages)
    answer = sentences(passages[figure.passage].text)[figure.sentence][figure.start : figure.end]
    altered = _FIGURE.sub(lambda m: change(m.group(0), key) or m.group(0), answer)
    if altered == answer:
        raise NotApplicable(unsuitable)
    return _restate(
        item,
        passages,
        figure,
        (figure.start, figure.end, altered),
        sources,
        f"Restated the answer's sentence with '{altered}' instead of '{answer}'",
    )


def _shifted_year(number: str, key: str) -> str:
    offset = 2 + pick(key, "years", 8)
    return str(int(number) + (offset if pick(key, "sign", 2) else -offset))


def _ten_fold(number: str, key: str) -> str | None:
    return None if _is_year(number) else _format_like(_value(number) * 10, number)


def _year_only(number: str, key: str) -> str | None:
    return _shifted_year(number, key) if _is_year(number) else None


def _drifted(number: str, key: str) -> str:
    if _is_year(number):
        return _shifted_year(number, key)
    value = _value(number)
    new = _format_like(value * (0.75, 0.8, 1.25, 1.5)[pick(key, "factor", 4)], number)
    return new if new != number and float(new.replace(",", "")) > 0 else _format_like(value + 1, number)


@register_rule("contradiction-high-order-of-magnitude-numeric-clash")
def ten_fold_figure(item: BaseItem, key: str) -> RuleOutput:
    return _number_rule(
        item,
        key,
        _ten_fold,
        ("one official statistical publication", "another official statistical publication"),
        "the answer is a year, not a quantity",
    )


@register_rule("contradiction-medium-dual-authoritative-dates")
def second_official_date(item: BaseItem, key: str) -> RuleOutput:
    return _number_rule(
        item,
        key,
        _year_only,
        ("the national archive", "the official state register"),
        "the answer is not a year or date",
    )


@register_rule("contradiction-medium-source-timing-drift")
def drifting_report(item: BaseItem, key: str) -> RuleOutput:
    return _number_rule(
        item,
        key,
        _drifted,
        ("a bulletin published on 3 March", "a bulletin published on 5 March about the same reference date"),
        "no figure to change",
    )


@register_rule("contradiction-low-fringe-vs-official-source")
def fringe_claim(item: BaseItem, key: str) -> RuleOutput:
    # LOW: the clash comes from an obviously unreliable source, so the official figure still answers.
    return _number_rule(
        item,
        key,
        _drifted,
        ("the official reference figures", "an anonymous post on a conspiracy forum"),
        "no figure to change",
    )


# Units that do not convert into one another by the same number (200 litres vs. 200 gallons).
_UNIT_SWAP = {
    "degrees celsius": "degrees Fahrenheit",
    "celsius": "Fahrenheit",
    "°c": "°F",
    "fahrenheit": "Celsius",
    "kilometres": "miles",
    "kilometers": "miles",
    "miles": "kilometres",
    "metres": "feet",
    "meters": "feet",
    "feet": "metres",
    "kilograms": "pounds",
    "pounds": "kilograms",
    "litres": "gallons",
    "liters": "gallons",
    "gallons": "litres",
    "minutes": "hours",
    "hours": "minutes",
    "seconds": "minutes",
    "days": "weeks",
    "weeks": "months",
    "months": "years",
    "years": "months",
    "percent": "per mille",
}
_UNIT_AFTER = re.compile(
    r"\s*(?:{})(?!\w)".format("|".join(re.escape(u) for u in sorted(_UNIT_SWAP, key=len, reverse=True))), re.IGNORECASE
)


@register_rule("contradiction-medium-conflicting-numerical-units")
def clashing_unit(item: BaseItem, key: str) -> RuleOutput:
    passages = item_texts(item)
    figure = _answer_figure(item, passages)
    sentence = sentences(passages[figure.passage].text)[figure.sentence]
    number = _FIGURE.search(sentence, figure.start, figure.end)
    unit = _UNIT_AFTER.match(sentence, number.end()) if number else None
    if unit is None:
        raise NotApplicable("the answer's figure carries no unit with a clashing counterpart")
    written, swapped = unit.group(0).strip(), _UNIT_SWAP[unit.group(0).strip().lower()]
    return _restate(
        item,
        passages,
        figure,
        (unit.start(), unit.end(), " " + swapped),
        ("one technical reference", "another technical reference"),
        f"Restated the answer's figure in {swapped} instead of {written}",
    )
