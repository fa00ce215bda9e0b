"""Edit-style generation: a generator's find-and-replace edits applied to the original item, in code.

With ``generation.edit_style`` a generator writes only what its lever changes
(``GeneratorSingleEdit`` / ``GeneratorMultiEdit``) instead of the whole rewritten item; the
functions here turn those edits into the full rewrite they stand for (``GeneratorSingleOutput`` /
``GeneratorMultiOutput``), so the candidate record is built the same way whichever was asked for.

Application is exact and order-free: every edit's ``find`` is located in the ORIGINAL text (it
must occur there exactly once, character for character), the located spans must not overlap,
and all replacements are spliced in at once. An edit that does not apply (empty ``find``, text
absent, ambiguous, overlapping another edit, a passage number the item does not have) raises
:class:`EditFailure` with the reason; the caller records it as that candidate's generation
failure, never drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

from refusalbench.tasks.llm.structured_outputs import (
    GeneratorMultiEdit,
    GeneratorMultiOutput,
    GeneratorSingleEdit,
    GeneratorSingleOutput,
    PassageEdit,
    TextEdit,
)
from refusalbench.tasks.refusalbench.schema.records import BaseItem

EDIT_FAILURE = "edit does not apply"  # the prefix of a failed candidate's error


class EditFailure(ValueError):
    """An edit that cannot be applied to the original text; the message says which and why."""


def _quoted(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _occurrences(text: str, find: str) -> list[int]:
    """Every start of ``find`` in ``text``, overlapping ones included ("aa" twice in "aaa")."""
    starts, at = [], text.find(find)
    while at != -1:
        starts.append(at)
        at = text.find(find, at + 1)
    return starts


def apply_edits(text: str, edits: Sequence[TextEdit], where: str) -> str:
    """``text`` with every edit applied (see the module docstring); ``where`` names the text in a failure."""
    spans: list[tuple[int, int, str, int]] = []
    for number, edit in enumerate(edits, 1):
        if not edit.find:
            raise EditFailure(f"{where} edit {number}: empty find")
        starts = _occurrences(text, edit.find)
        if not starts:
            raise EditFailure(f"{where} edit {number}: find text not in the original: {_quoted(edit.find)}")
        if len(starts) > 1:
            raise EditFailure(
                f"{where} edit {number}: find text occurs {len(starts)} times (ambiguous): {_quoted(edit.find)}"
            )
        spans.append((starts[0], starts[0] + len(edit.find), edit.replace, number))
    spans.sort()
    for (_, end, _, first), (start, _, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise EditFailure(f"{where} edits {first} and {second} overlap")
    pieces, cursor = [], 0
    for start, end, replace, _ in spans:
        pieces += [text[cursor:start], replace]
        cursor = end
    return "".join(pieces) + text[cursor:]


def _metadata(output: GeneratorSingleEdit | GeneratorMultiEdit) -> dict[str, object]:
    return dict(
        lever_applied=output.lever_applied,
        rationale=output.rationale,
        answer_constraint_holds=output.answer_constraint_holds,
        expected_behaviour=output.expected_behaviour,
    )


def rewrite_single(item: BaseItem, output: GeneratorSingleEdit) -> GeneratorSingleOutput:
    """The full rewrite a single-document item's edits stand for."""
    return GeneratorSingleOutput(
        perturbed_question=apply_edits(item.question, output.question_edits, "question"),
        perturbed_context=apply_edits(item.context or "", output.context_edits, "context"),
        **_metadata(output),
    )


def rewrite_multi(item: BaseItem, output: GeneratorMultiEdit) -> GeneratorMultiOutput:
    """The full rewrite a multi-document item's edits stand for: every original passage in order
    (its relevance flag kept), edited where asked, then the new passages."""
    originals = item.passages or []
    by_passage: dict[int, list[TextEdit]] = {}
    for number, edit in enumerate(output.passage_edits, 1):
        if not 1 <= edit.passage <= len(originals):
            raise EditFailure(f"passage edit {number}: no passage {edit.passage} (the item has {len(originals)})")
        by_passage.setdefault(edit.passage, []).append(TextEdit(find=edit.find, replace=edit.replace))
    passages = [
        PassageEdit(index=i, text=apply_edits(p.text, by_passage.get(i, []), f"passage {i}"), relevant=p.relevant)
        for i, p in enumerate(originals, 1)
    ]
    passages += [
        PassageEdit(index=len(originals) + n, text=new.text, relevant=new.relevant)
        for n, new in enumerate(output.new_passages, 1)
    ]
    return GeneratorMultiOutput(
        perturbed_question=apply_edits(item.question, output.question_edits, "question"),
        passages=passages,
        **_metadata(output),
    )


def rewrite_of(
    item: BaseItem, output: GeneratorSingleEdit | GeneratorMultiEdit
) -> GeneratorSingleOutput | GeneratorMultiOutput:
    """The full rewrite ``output``'s edits of ``item`` stand for (EditFailure when one does not apply)."""
    return rewrite_multi(item, output) if isinstance(output, GeneratorMultiEdit) else rewrite_single(item, output)
