"""Reading a target model's raw reply: its refusal decision and its stated confidence.

The code parser here is the judge-free decision and, in ``evaluate``, the cheap first pass: with
``evaluation.decision: judge`` the judge classifies every reply except one that is nothing but a
refusal code (:func:`bare_code`), and the parser's agreement with the judge is reported.

Decision: a reply that contains a refusal code — any spelling listed in
``taxonomy.CODE_ALIASES``, any case, wrapped in markdown or prose — is a refusal with that
code; when several distinct codes appear, the one written last counts. A reply without a
code is an answer attempt, even when its prose says that information is "missing".
An empty or absent reply is also an answer attempt (``"ANSWER"``): it carries no code, and
the judge marks the (empty) answer wrong, so it never counts as a correct refusal.

Confidence: one of five verbal levels or a number in [0, 1] (or a percentage).
"""

from __future__ import annotations

import math
import re

from refusalbench.tasks.llm.structured_outputs import ANSWER_ATTEMPT
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, CODE_ALIASES

ANSWER = "ANSWER"

# ----------------------------------------------------------------- refusal codes

# Longest spelling first, so REFUSE_INFO_MISSING_IN_CONTEXT is taken whole and never
# also read as its prefix REFUSE_INFO_MISSING. A code may not touch a letter or digit
# on either side ("REFUSE_CONTRADICTION" is not REFUSE_CONTRADICT), but underscores,
# asterisks and backticks may surround it, because markdown emphasis uses them
# (``__REFUSE_MISSING__``, ``**REFUSE_MISSING**``).
_CODE_SPELLINGS = sorted(CODE_ALIASES, key=len, reverse=True)
_CODE_PATTERN = re.compile(
    r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, _CODE_SPELLINGS)) + r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


def find_codes(text: str | None) -> list[str]:
    """Canonical codes of every code spelling in ``text``, in order (one per occurrence)."""
    if not isinstance(text, str) or not text:
        return []
    return [CODE_ALIASES[match.group(1).upper()] for match in _CODE_PATTERN.finditer(text)]


# The same pattern behind a greedy prefix: one match() yields the last code directly.
_LAST_CODE_PATTERN = re.compile(r"(?s:.*)" + _CODE_PATTERN.pattern, re.IGNORECASE)


def parse_decision(text: str | None) -> str:
    """``"ANSWER"`` or the canonical refusal code of a raw reply (last distinct code wins)."""
    if not isinstance(text, str) or not text:
        return ANSWER
    # The last occurrence is the last distinct code too: repeats of one code change nothing.
    match = _LAST_CODE_PATTERN.match(text)
    return CODE_ALIASES[match.group(1).upper()] if match else ANSWER


# A last line that states a confidence ("CONFIDENCE: CONFIDENT", "**Confidence:** 0.8").
_CONFIDENCE_LINE = re.compile(r"\n[\s*_`#>-]*confidence(?:[\s_-]*level)?[\s*_`]*[:=][^\n]*\s*\Z", re.IGNORECASE)
_CODE_MARKUP = " \t\r\n*_`\"'.,;:!()[]{}<>#-"


def bare_code(text: str | None) -> str | None:
    """The canonical code when a reply is nothing but one refusal code, else None.

    Markup around the code (``**REFUSE_MISSING**``, a trailing full stop, quotes) and one final
    CONFIDENCE line are allowed. Such a reply is unambiguous: the judge stage takes it as the
    refusal it names without asking the judge (``decision_source: parser``).
    """
    if not isinstance(text, str) or not text.strip():
        return None
    body = _CONFIDENCE_LINE.sub("", "\n" + text.strip()).strip(_CODE_MARKUP)
    return CODE_ALIASES.get(body.upper())


def normalise_decision(value: object) -> str | None:
    """A ``decision`` cell as ANSWER or a canonical code; None when it is neither.

    Accepts ANSWER / ANSWER_CORRECTLY / ANSWER_ATTEMPT (the judge's word; any case) and every
    refusal-code alias.
    """
    if not isinstance(value, str):
        return None
    key = value.strip().upper()
    if key in (ANSWER, ANSWER_CORRECTLY):
        return ANSWER
    if key in (ANSWER_ATTEMPT, "ANSWER ATTEMPT"):
        return ANSWER
    return CODE_ALIASES.get(key)


# ----------------------------------------------------------------- confidence

# Canonical verbal levels and the probability each stands for.
CONFIDENCE_LEVELS: dict[str, float] = {
    "VERY_CONFIDENT": 0.95,
    "CONFIDENT": 0.80,
    "SOMEWHAT_CONFIDENT": 0.60,
    "UNCERTAIN": 0.40,
    "VERY_UNCERTAIN": 0.15,
}
# Verbal levels from least to most confident: the bin order for reliability diagrams.
LEVELS_ASCENDING: tuple[str, ...] = tuple(sorted(CONFIDENCE_LEVELS, key=CONFIDENCE_LEVELS.__getitem__))

_SEP = r"[\s_-]+"
# Two-word levels before one-word levels: "VERY_UNCERTAIN" contains "UNCERTAIN".
_LEVEL_ALTERNATIVES = rf"very{_SEP}confident|somewhat{_SEP}confident|very{_SEP}uncertain|confident|uncertain"
# Inside a labelled value or a bare value, any case and separator is a level.
_LEVEL_ANY_CASE = re.compile(rf"(?<![A-Za-z])({_LEVEL_ALTERNATIVES})(?![A-Za-z])", re.IGNORECASE)
# In free text without a label, only code-like spellings count (upper case, or joined by
# underscores), so prose such as "I am confident that..." is not taken as a level.
_LEVEL_CODE_LIKE = re.compile(
    r"(?<![A-Za-z0-9])("
    r"VERY[ _-]CONFIDENT|SOMEWHAT[ _-]CONFIDENT|VERY[ _-]UNCERTAIN|CONFIDENT|UNCERTAIN"
    r"|(?i:very_confident|somewhat_confident|very_uncertain)"
    r")(?![A-Za-z0-9])"
)
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?|\.\d+)\s*(%|percent)?", re.IGNORECASE)
# "Confidence: X", "CONFIDENCE LEVEL = X", "**Confidence:** X", "confidence_level: X".
_LABEL = re.compile(r"confidence(?:[\s_-]*level)?[\s*_`]*[:=][\s*_`]*(?P<value>[^\n]*)", re.IGNORECASE)
_MARKUP = " \t\r\n*_`\"'.,;:()[]{}"


def _canonical_level(spelling: str) -> str:
    return re.sub(_SEP, "_", spelling.strip()).upper()


def _number_as_probability(value: float, *, percent: bool, bare_percent: bool) -> float | None:
    """A number read as a probability, or None when it cannot be one.

    ``percent``: written with "%"/"percent". ``bare_percent``: a number above 1 without a
    sign is also a percentage (allowed after a "CONFIDENCE:" label, where intent is clear).
    """
    if percent or (bare_percent and 1.0 < value <= 100.0):
        value /= 100.0
    if not 0.0 <= value <= 1.0:
        return None
    return value


def _format_probability(value: float) -> str:
    return repr(round(value, 6))


def _parse_value(value: str, *, whole: bool) -> str | None:
    """A confidence from a label's value (first level or number) or a whole bare string."""
    if whole:
        bare = value.strip(_MARKUP)
        level = _LEVEL_ANY_CASE.fullmatch(bare)
        if level:
            return _canonical_level(level.group(1))
        number = _NUMBER.fullmatch(bare)
        if number:
            # A bare "42" is more likely an answer than a confidence: only 0-1 or "42%".
            prob = _number_as_probability(
                float(number.group(1)), percent=number.group(2) is not None, bare_percent=False
            )
            return None if prob is None else _format_probability(prob)
        return None
    level = _LEVEL_ANY_CASE.search(value)
    number = _NUMBER.search(value)
    if level and (not number or level.start() < number.start()):
        return _canonical_level(level.group(1))
    if number:
        prob = _number_as_probability(float(number.group(1)), percent=number.group(2) is not None, bare_percent=True)
        return None if prob is None else _format_probability(prob)
    return None


def parse_confidence(text: str | None) -> str | None:
    """The confidence a reply states: a canonical level name, a probability as a string, or None.

    Looked for in this order: the whole text as a bare value ("very confident", "0.8",
    "80%"); the last "CONFIDENCE: ..." label (its first level or number); the last
    code-like level token anywhere (VERY_CONFIDENT, "SOMEWHAT CONFIDENT" in capitals).
    Bare numbers in free text are ignored: they are usually part of the answer.
    """
    if text is None or not isinstance(text, str) or not text.strip():
        return None
    whole = _parse_value(text, whole=True)
    if whole is not None:
        return whole
    labels = list(_LABEL.finditer(text))
    for label in reversed(labels):
        found = _parse_value(label.group("value"), whole=False)
        if found is not None:
            return found
    tokens = _LEVEL_CODE_LIKE.findall(text)
    if tokens:
        return _canonical_level(tokens[-1])
    return None


def confidence_value(confidence: object) -> float | None:
    """Probability of a confidence: level -> .95/.8/.6/.4/.15, number -> itself; None if absent."""
    if confidence is None or isinstance(confidence, bool):
        return None
    if isinstance(confidence, (int, float)):
        value = float(confidence)
        if math.isnan(value):
            return None
        return _number_as_probability(value, percent=False, bare_percent=False)
    if not isinstance(confidence, str):
        return None
    if confidence in CONFIDENCE_LEVELS:
        return CONFIDENCE_LEVELS[confidence]
    parsed = parse_confidence(confidence)
    if parsed is None:
        return None
    if parsed in CONFIDENCE_LEVELS:
        return CONFIDENCE_LEVELS[parsed]
    return float(parsed)


def is_verbal_confidence(confidence: object) -> bool:
    """True when a confidence is (or parses to) one of the five verbal levels."""
    if not isinstance(confidence, str):
        return False
    return (confidence if confidence in CONFIDENCE_LEVELS else parse_confidence(confidence)) in CONFIDENCE_LEVELS
