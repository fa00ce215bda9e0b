"""Text operations of the rule-based generator : sentences, answer
matching, number and year patterns, and choices keyed by the assignment (never random)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[$])")
_ABBREVIATIONS = ("e.g.", "i.e.", "Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Mt.", "U.S.", "U.K.", "vs.", "No.")
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
YEAR = re.compile(r"(?<![\d,.])(?:1[0-9]{3}|20[0-9]{2})(?![\d,])")
_WORD = re.compile(r"[a-z]{4,}")
_STOPWORDS = frozenset(
    "what which when where does with from that this have there their they into about many much were been being "
    "after before during other than then them these those would could should most more some such each only also "
    "very over under your year years called known used made make take first".split()
)


def sentences(text: str) -> list[str]:
    """The text's sentences (a split after . ! ? before a capital or digit, common abbreviations kept)."""
    out, start = [], 0
    for boundary in _BOUNDARY.finditer(text):
        if text[start : boundary.start()].endswith(_ABBREVIATIONS):
            continue
        out.append(text[start : boundary.start()])
        start = boundary.end()
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def answer_pattern(answers: Sequence[str]) -> re.Pattern[str] | None:
    """Any reference answer as a whole word or phrase (longest first, case-insensitive); None without one."""
    aliases = sorted({a.strip() for a in answers if a.strip()}, key=len, reverse=True)
    if not aliases:
        return None
    return re.compile("|".join(rf"(?<!\w){re.escape(a)}(?!\w)" for a in aliases), re.IGNORECASE)


def answer_clues(answers: Sequence[str]) -> re.Pattern[str] | None:
    """The tokens of the answers that identify them on their own: numbers and capitalised words."""
    tokens = {
        t
        for a in answers
        for t in re.findall(r"\w+", a)
        if (t[0].isdigit() or t[0].isupper()) and t.casefold() not in {"the", "a", "an"}
    }
    if not tokens:
        return None
    return re.compile("|".join(rf"(?<!\w){re.escape(t)}(?!\w)" for t in sorted(tokens, key=len, reverse=True)))


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def tidy(text: str) -> str:
    text = re.sub(r"\s+([,.;:!?])", r"\1", re.sub(r"[ \t]{2,}", " ", text))
    return re.sub(r",([.;:!?])", r"\1", text).strip()


def pick(key: str, salt: str, n: int) -> int:
    """A deterministic choice in range(n) from the assignment key."""
    return int.from_bytes(hashlib.sha256(f"{key}\x1f{salt}".encode()).digest()[:4], "big") % n
