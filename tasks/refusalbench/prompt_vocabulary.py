"""RefusalBench's words in the prompt templates: the refusal codes with their help text, the
verbal confidence levels, and the constraint a generator must respect.

The callers pass them as template variables (``TARGET_VOCABULARY`` to the target templates,
``VERIFIER_VOCABULARY`` to the verifier templates), so ``llm.prompting`` knows no method.
"""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.llm.structured_outputs import ANSWER_ATTEMPT
from refusalbench.tasks.refusalbench.decisions import CONFIDENCE_LEVELS
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, CANONICAL_CODE, REFUSAL_CODES, REFUSE_OTHER

# (code, what it means, a tiny illustration) -- shown to target models so they can pick a code.
REFUSAL_CODE_HELP: tuple[tuple[str, str, str], ...] = (
    (
        CANONICAL_CODE["P-Ambiguity"],
        "the question or the context can be read in more than one way and the readings lead to different answers",
        'asked "What colour is the bank?" when the text describes both a river bank and a bank building',
    ),
    (
        CANONICAL_CODE["P-Contradiction"],
        "the context states incompatible facts about exactly what is asked",
        "one sentence dates the treaty to 1918 and another, equally credible, to 1921",
    ),
    (
        CANONICAL_CODE["P-MissingInfo"],
        "the context is on topic but the fact needed for the answer is absent",
        'asked who bought the firm when the text only says "a rival bought it"',
    ),
    (
        CANONICAL_CODE["P-FalsePremise"],
        "the question assumes something that the context shows to be false",
        "asked why a project was cancelled when the text says it was completed",
    ),
    (
        CANONICAL_CODE["P-GranularityMismatch"],
        "the question asks for a broader or finer level of detail than the context provides",
        "asked for a national average when the text gives figures for two towns",
    ),
    (
        CANONICAL_CODE["P-EpistemicMismatch"],
        "the question asks for an opinion, a value judgement or a prediction that facts cannot settle",
        "asked which of two paintings is more beautiful when the text lists only their sizes",
    ),
    (
        REFUSE_OTHER,
        "the question cannot be answered reliably for a reason not covered above",
        "the context is unreadable or garbled",
    ),
)


def answer_constraint_text(expected: str) -> str:
    """The constraint a generator must respect, worded from the item's ground truth."""
    if expected == ANSWER_CORRECTLY:
        return (
            "LOW intensity: the perturbed question must STILL be answerable from the perturbed context, "
            "and the reference answer(s) must remain correct. The change should look like a small trap, "
            "but a careful reader can still resolve it."
        )
    return (
        f"MEDIUM/HIGH intensity: after the change it must be IMPOSSIBLE to give the reference answer "
        f"(or any single correct answer) from the perturbed context. A careful reader should respond "
        f"with {expected}, and with no other refusal code."
    )


# What target_single.j2 / target_multi.j2 list: the codes a target may reply with, and the
# levels it may state, most confident first (the order of decisions.CONFIDENCE_LEVELS).
TARGET_VOCABULARY: dict[str, Any] = {
    "REFUSAL_CODE_HELP": REFUSAL_CODE_HELP,
    "CONFIDENCE_LEVELS": tuple(CONFIDENCE_LEVELS),
}
# What judge_single.j2 / judge_multi.j2 / judge_decision.j2 classify a reply as: an answer attempt or a
# refusal category (structured_outputs.JUDGE_CLASSIFICATIONS, the codes in REFUSAL_CODE_HELP's order).
JUDGE_VOCABULARY: dict[str, Any] = {"ANSWER_ATTEMPT": ANSWER_ATTEMPT, "REFUSAL_CODE_HELP": REFUSAL_CODE_HELP}
# What verifier_single.j2 / verifier_multi.j2 compare the expected response with.
VERIFIER_VOCABULARY: dict[str, Any] = {"ANSWER_CORRECTLY": ANSWER_CORRECTLY}
# What target_paper.j2 / judge_paper.j2 (evaluation.protocol: paper) list: the seven codes alone, as the
# released benchmarks' protocol shows them.
PAPER_TARGET_VOCABULARY: dict[str, Any] = {"REFUSAL_CODES": REFUSAL_CODES}
PAPER_JUDGE_VOCABULARY: dict[str, Any] = {"ANSWER_ATTEMPT": ANSWER_ATTEMPT, "REFUSAL_CODES": REFUSAL_CODES}
