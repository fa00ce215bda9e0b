"""Rules for missing-information levers: the answer's sentences deleted, the answer replaced by a
pointer to absent material, the date or names taken out, or the context swapped for unrelated
text; and the LOW levers that stay answerable (an example, an aside or a date's month dropped)."""

from __future__ import annotations

import re
from collections.abc import Callable

from refusalbench.tasks.refusalbench.rule_generator.base import (
    NotApplicable,
    RuleOutput,
    answer_in_context,
    answers_pattern,
    item_texts,
    register_rule,
    rule_output,
)
from refusalbench.tasks.refusalbench.rule_generator.text import YEAR, answer_clues, content_words, pick, sentences, tidy
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage


def _delete_sentences(item: BaseItem, doomed: Callable[[str], bool], what: str) -> RuleOutput:
    passages, deleted = item_texts(item), 0
    for passage in passages:
        parts = sentences(passage.text)
        kept = [s for s in parts if not doomed(s)]
        if len(kept) == len(parts):
            continue
        if not kept:
            raise NotApplicable("every sentence of a passage states the answer")
        passage.text, deleted = " ".join(kept), deleted + len(parts) - len(kept)
    if not deleted:
        raise NotApplicable(f"no sentence {what}")
    return rule_output(
        item, passages, f"Deleted the {deleted} sentence(s) {what}; the rest of the context is unchanged."
    )


@register_rule("missing-info-medium-answer-clause-excised")
def excise_answer_sentences(item: BaseItem, key: str) -> RuleOutput:
    pattern = answer_in_context(item)
    return _delete_sentences(item, lambda s: bool(pattern.search(s)), "stating the answer")


@register_rule("missing-info-high-answer-token-purge")
def purge_answer_tokens(item: BaseItem, key: str) -> RuleOutput:
    pattern, clues = answer_in_context(item), answer_clues(item.answers)
    return _delete_sentences(
        item,
        lambda s: bool(pattern.search(s) or (clues and clues.search(s))),
        "containing the answer or one of its names or figures",
    )


def _replace_answer(item: BaseItem, pointer: str, *, clues_must_go: bool) -> RuleOutput:
    pattern, passages, replaced = answer_in_context(item), item_texts(item), 0
    for passage in passages:
        passage.text, n = pattern.subn(pointer, passage.text)
        replaced += n
    clues = answer_clues(item.answers)
    if clues_must_go and clues and any(clues.search(p.text) for p in passages):
        raise NotApplicable("a name or figure of the answer would remain in the context")
    return rule_output(
        item,
        passages,
        f"Replaced the {replaced} mention(s) of the answer with '{pointer}', "
        "material that the context does not include.",
    )


@register_rule("missing-info-medium-placeholder-citation")
def cite_missing_table(item: BaseItem, key: str) -> RuleOutput:
    return _replace_answer(item, "[given in Table 4]", clues_must_go=False)


@register_rule("missing-info-high-audio-only-reference")
def point_to_recording(item: BaseItem, key: str) -> RuleOutput:
    return _replace_answer(item, "[stated in the attached recording]", clues_must_go=True)


_WHEN = re.compile(r"^\s*(when\b|in (which|what) year\b|what year\b|on (which|what) date\b)", re.IGNORECASE)


@register_rule("missing-info-medium-missing-temporal-adjunct")
def delete_time_expression(item: BaseItem, key: str) -> RuleOutput:
    if not _WHEN.search(item.question):
        raise NotApplicable("the question does not ask when")
    dates = [a for a in item.answers if YEAR.search(a)]
    if not dates:
        raise NotApplicable("the answer is not a date")
    pattern = answer_in_context(item.model_copy(update={"answers": dates}))
    adjunct = re.compile(
        rf"\s*,?\s*\b(?:in|on|during|since|by)\s+(?:the\s+year\s+)?(?:{pattern.pattern})", re.IGNORECASE
    )
    passages = item_texts(item)
    for passage in passages:
        parts = [adjunct.sub("", s).lstrip(" ,;") for s in sentences(passage.text)]
        passage.text = tidy(" ".join(s[:1].upper() + s[1:] for s in parts if s))
    if any(YEAR.search(p.text) or pattern.search(p.text) for p in passages):
        raise NotApplicable("another date would remain in the context")
    return rule_output(item, passages, "Deleted the time expression that dates the event; no other date remains.")


# Fluent paragraphs on topics far from any base set, for the lever that swaps the whole context.
OFF_TOPIC = (
    "Knitting a sock usually starts at the cuff. The stitches are cast on loosely so the top can stretch, "
    "then worked in rib for a few centimetres before the leg. Turning the heel takes short rows, and the toe "
    "is closed with a grafting stitch that leaves no seam.",
    "Rock pools form where the falling tide leaves sea water trapped among boulders. Their residents must "
    "cope with warming water and rising salinity until the sea returns. Anemones close up, limpets clamp "
    "down on the rock and small crabs hide under weed.",
    "A sourdough starter is a paste of flour and water colonised by wild yeasts and lactic bacteria. Fed "
    "every day, it becomes bubbly and smells pleasantly sour. Bakers keep a portion back from each batch to "
    "leaven the next loaf.",
    "In chess, the opening phase is about developing pieces quickly and contesting the centre. Players "
    "usually castle early to tuck the king away behind a wall of pawns. Moving the same piece twice before "
    "the others are out is generally frowned upon.",
    "Origami cranes are folded from a single square sheet without cuts or glue. The model begins with a "
    "preliminary base, which is narrowed into a bird base before the neck and tail are reverse-folded. A "
    "gentle pull on the tail makes the wings flap.",
    "Beekeepers inspect their hives on calm, warm afternoons when most foragers are out. Smoke keeps the "
    "colony calm while the frames are lifted. A healthy brood frame shows capped cells in a compact pattern "
    "with few gaps.",
)


@register_rule("missing-info-high-entirely-irrelevant-context")
def swap_in_unrelated_text(item: BaseItem, key: str) -> RuleOutput:
    pattern = answers_pattern(item.answers)
    topic = content_words(" ".join([item.question, *item.answers]))
    start = pick(key, "off-topic", len(OFF_TOPIC))
    pool = [
        t for t in OFF_TOPIC[start:] + OFF_TOPIC[:start] if not (content_words(t) & topic) and not pattern.search(t)
    ]
    passages = item_texts(item)
    signal = [p for p in passages if p.relevant]
    if len(pool) < len(signal):
        raise NotApplicable("no unrelated paragraph shares no term with the question")
    if any(pattern.search(p.text) for p in passages if not p.relevant):
        raise NotApplicable("a noise passage states the answer")
    for passage, text in zip(signal, pool):
        passage.text, passage.relevant = text, False
    return rule_output(
        item, passages, "Replaced the context with an unrelated paragraph that shares no term with the question."
    )


_CAPITALISED = re.compile(r"\b[A-Z][\w-]*")
_NEVER_NAMES = frozenset(
    "January February March April May June July August September October November December Monday Tuesday Wednesday "
    "Thursday Friday Saturday Sunday I".split()
)
_SENTENCE_OPENERS = frozenset(
    "The A An In On At It Its This That These Those When Where While After Before Although Because Once For With By "
    "From As Each Many Most Some If But And Or So Such Only Under Over Near Both All Any Every No Not".split()
)


def _redact_names(text: str, known_names: set[str]) -> str:
    """Every capitalised word that is a name -> [REDACTED]. A sentence's first word counts as a name
    only when it is an acronym, is capitalised elsewhere too, or starts a run of capitalised words
    ('East Germany')."""
    out = []
    for sentence in sentences(text):

        def redact(word: re.Match[str], sentence: str = sentence) -> str:
            token = word.group(0)
            if token in _NEVER_NAMES or (word.start() == 0 and token in _SENTENCE_OPENERS):
                return token
            acronym = len(token) > 1 and token.isupper()
            if (
                word.start() == 0
                and not acronym
                and token not in known_names
                and not _CAPITALISED.match(sentence, word.end() + 1)
            ):
                return token
            return "[REDACTED]"

        redacted = _CAPITALISED.sub(redact, sentence)
        out.append(re.sub(r"\[REDACTED\](?:(?:\s+(?:of|the|de|da|von|van))*\s+\[REDACTED\])+", "[REDACTED]", redacted))
    return " ".join(out)


@register_rule("missing-info-high-all-names-redacted")
def redact_all_names(item: BaseItem, key: str) -> RuleOutput:
    aliases = [re.sub(r"^(the|a|an)\s+", "", a.strip(), flags=re.IGNORECASE) for a in item.answers]
    if not aliases or not all(a[:1].isupper() for a in aliases):
        raise NotApplicable("the answer is not a name")
    pattern, passages = answer_in_context(item), item_texts(item)
    everything = " ".join([item.question, *(p.text for p in passages)])
    known = {
        m.group(0)
        for m in _CAPITALISED.finditer(everything)
        if m.start() >= 2 and everything[m.start() - 2] not in ".!?"
    }
    known |= {w for a in aliases for w in _CAPITALISED.findall(a)}
    for passage in (p for p in passages if p.relevant):
        passage.text = _redact_names(passage.text, known)
    if any(pattern.search(p.text) for p in passages):
        raise NotApplicable("the answer would remain in a passage")
    return rule_output(item, passages, "Replaced every proper name in the signal passages with [REDACTED].")


# ----------------------------------------------------------------- missing information, LOW (stays answerable)


def _keep_answer(item: BaseItem, passages: list[Passage], rationale: str) -> RuleOutput:
    pattern = answers_pattern(item.answers)
    if not any(pattern.search(p.text) for p in passages if p.relevant):
        raise NotApplicable("the answer would no longer be stated")
    return rule_output(item, passages, rationale)


_EXAMPLE = re.compile(r"^(for (example|instance)|one (case|example) is|to give an example)\b", re.IGNORECASE)


@register_rule("missing-info-low-drop-example-sentence")
def drop_example_sentence(item: BaseItem, key: str) -> RuleOutput:
    pattern, passages, dropped = answer_in_context(item), item_texts(item), 0
    for passage in (p for p in passages if p.relevant):
        parts = sentences(passage.text)
        kept = [s for s in parts if not (_EXAMPLE.search(s) and not pattern.search(s))]
        passage.text, dropped = " ".join(kept), dropped + len(parts) - len(kept)
    if not dropped:
        raise NotApplicable("no example sentence without the answer")
    return _keep_answer(item, passages, f"Deleted {dropped} illustrative sentence(s) that do not hold the answer.")


@register_rule("missing-info-low-parenthetical-excise")
def excise_parenthesis(item: BaseItem, key: str) -> RuleOutput:
    pattern, passages = answer_in_context(item), item_texts(item)
    for passage in (p for p in passages if p.relevant):
        parts = sentences(passage.text)
        for index, sentence in enumerate(parts):
            # Never in the answer's own sentence: there it could qualify the queried value.
            if pattern.search(sentence) or not re.search(r"\s\([^()]+\)", sentence):
                continue
            parts[index] = tidy(re.sub(r"\s\([^()]+\)", "", sentence, count=1))
            passage.text = " ".join(parts)
            return _keep_answer(item, passages, "Removed a parenthetical aside outside the answer's sentence.")
    raise NotApplicable("no parenthesis outside the answer's sentence")


_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_FULL_DATE = rf"(?:\d{{1,2}} (?:{_MONTHS})|(?:{_MONTHS}) \d{{1,2}},) (\d{{4}})\b"


@register_rule("missing-info-low-trim-month-but-keep-year")
def trim_date_to_year(item: BaseItem, key: str) -> RuleOutput:
    if not re.search(r"\byear\b", item.question, re.IGNORECASE):
        raise NotApplicable("the question does not ask for a year")
    passages, trimmed = item_texts(item), 0
    for passage in passages:
        # "on 9 November 1989" -> "in 1989"; a date in any other phrasing is left alone (and then blocks the rule).
        passage.text, n = re.subn(
            rf"\b([Oo])n {_FULL_DATE}", lambda m: ("I" if m.group(1) == "O" else "i") + "n " + m.group(2), passage.text
        )
        trimmed += n
    if not trimmed or any(re.search(_FULL_DATE, p.text) for p in passages):
        raise NotApplicable("no full date in the context, or one that cannot be trimmed cleanly")
    return _keep_answer(item, passages, f"Shortened {trimmed} full date(s) to the year alone.")
