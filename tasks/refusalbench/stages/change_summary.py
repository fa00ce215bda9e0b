"""What a perturbation changed, computed exactly from the base item and the candidate.

Verifiers judge a candidate by comparing two versions of the same text. Spotting which
sentence went missing in a paragraph is where weak verifiers fail first (and where
strong ones spend attention the rubric's harder criteria need), so the verifier prompt
states the edit beside the two versions: the question changed or not; per context (or
passage) the sentences removed, added and rewritten. It is a plain sentence-level diff:
no judgement, the same for every verifier, and a reader can check it against the texts.
"""

from __future__ import annotations

import difflib
import re

from refusalbench.tasks.refusalbench.schema.records import BaseItem, Candidate, Passage
from refusalbench.tasks.refusalbench.stages.prechecks import normalise

# A sentence ends at ., ! or ? followed by whitespace; good enough for a diff the reader can check
# (NLTK's punkt would load a tokenizer into every verification process for no gain here).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def diff_sentences(text: str | None) -> list[str]:
    """The text's sentences as the summary compares them: split at end punctuation, whitespace collapsed."""
    return [s for s in map(normalise, _SENTENCE_END.split(text or "")) if s]


def _quote(parts: list[str]) -> str:
    return " ".join(f'"{p}"' for p in parts)


def text_changes(original: str | None, perturbed: str | None) -> list[str]:
    """One line per edit between the two texts' sentence lists (empty: the same sentences)."""
    before, after = diff_sentences(original), diff_sentences(perturbed)
    lines = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        if op == "delete":
            lines.append(f"removed: {_quote(before[i1:i2])}")
        elif op == "insert":
            lines.append(f"added: {_quote(after[j1:j2])}")
        elif op == "replace":
            lines.append(f"rewritten: {_quote(before[i1:i2])} -> {_quote(after[j1:j2])}")
    return lines


def _section(title: str, total: int, changes: list[str]) -> list[str]:
    if not changes:
        return [f"- {title}: unchanged."]
    return [f"- {title} ({total} sentence(s) before): {len(changes)} edit(s)", *(f"  - {c}" for c in changes)]


def _passage_sections(original: list[Passage], perturbed: list[Passage]) -> list[str]:
    lines = []
    for index in range(max(len(original), len(perturbed))):
        title = f"Passage {index + 1}"
        if index >= len(original):
            lines.append(f"- {title} (new, {'relevant' if perturbed[index].relevant else 'not relevant'}): added.")
        elif index >= len(perturbed):
            lines.append(f"- {title}: missing from the perturbed version.")
        else:
            before, after = original[index], perturbed[index]
            lines += _section(title, len(diff_sentences(before.text)), text_changes(before.text, after.text))
            if before.relevant != after.relevant:
                lines.append(f"  - relevance flag: {before.relevant} -> {after.relevant}")
    return lines


def change_summary(item: BaseItem, candidate: Candidate) -> str:
    """Markdown bullet lines: the question's edit, then the context's (or each passage's)."""
    before, after = normalise(item.question), normalise(candidate.question)
    lines = ["- Question: unchanged."] if before == after else [f'- Question: rewritten: "{before}" -> "{after}"']
    if candidate.variant == "multi":
        lines += _passage_sections(item.passages or [], candidate.passages or [])
    else:
        lines += _section("Context", len(diff_sentences(item.context)), text_changes(item.context, candidate.context))
    return "\n".join(lines)
