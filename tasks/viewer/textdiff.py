"""What a perturbation changed: a word-level diff of the original and perturbed text, as HTML.

Words and the whitespace between them are the tokens, so the marked-up text keeps its line
breaks; removed words are ``<del>``, added ones ``<ins>``, everything escaped.
"""

from __future__ import annotations

import difflib
import html
import re

_TOKENS = re.compile(r"\s+|[^\s]+")


def _tokens(text: str) -> list[str]:
    return _TOKENS.findall(text)


def word_diff(before: str | None, after: str | None) -> tuple[str, str, bool]:
    """(original with removals marked, perturbed with additions marked, whether anything changed), as HTML."""
    old, new = _tokens(before or ""), _tokens(after or "")
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    left: list[str] = []
    right: list[str] = []
    changed = False
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        removed, added = html.escape("".join(old[i1:i2])), html.escape("".join(new[j1:j2]))
        if op == "equal":
            left.append(removed)
            right.append(added)
            continue
        changed = True
        if removed:
            left.append(f"<del>{removed}</del>")
        if added:
            right.append(f"<ins>{added}</ins>")
    return "".join(left), "".join(right), changed
