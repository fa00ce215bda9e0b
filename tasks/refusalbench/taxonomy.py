"""The uncertainty taxonomy of RefusalBench: classes, intensities, refusal codes.

One place defines the six perturbation classes, the three intensities, the
canonical refusal code of each class and every spelling a model may use for it
(the scorer accepts all of them). Everything else imports from here.
"""

from __future__ import annotations

from typing import Literal, get_args

from refusalbench.tasks.core.errors import closest_names

PerturbationClass = Literal[
    "P-Ambiguity",
    "P-Contradiction",
    "P-MissingInfo",
    "P-FalsePremise",
    "P-GranularityMismatch",
    "P-EpistemicMismatch",
]
Intensity = Literal["LOW", "MEDIUM", "HIGH"]
LeverTarget = Literal["query", "context", "query-context"]

PERTURBATION_CLASSES: tuple[str, ...] = get_args(PerturbationClass)
INTENSITIES: tuple[str, ...] = get_args(Intensity)
STRATA: tuple[tuple[str, str], ...] = tuple(
    (cls, intensity) for cls in PERTURBATION_CLASSES for intensity in INTENSITIES
)

# An item's context: one passage (single) or several, only some relevant (multi).
VARIANTS: tuple[str, ...] = ("single", "multi")

ANSWER_CORRECTLY = "ANSWER_CORRECTLY"

# Canonical code per class: the spelling the reference evaluation prompt uses.
CANONICAL_CODE: dict[str, str] = {
    "P-Ambiguity": "REFUSE_AMBIGUOUS_QUERY",
    "P-Contradiction": "REFUSE_CONTRADICTORY_CONTEXT",
    "P-MissingInfo": "REFUSE_INFO_MISSING_IN_CONTEXT",
    "P-FalsePremise": "REFUSE_FALSE_PREMISE_IN_QUERY",
    "P-GranularityMismatch": "REFUSE_GRANULARITY_MISMATCH",
    "P-EpistemicMismatch": "REFUSE_NONFACTUAL_QUERY",
}
REFUSE_OTHER = "REFUSE_OTHER"
REFUSAL_CODES: tuple[str, ...] = (*CANONICAL_CODE.values(), REFUSE_OTHER)

# Every accepted spelling -> canonical code. Matching is case-insensitive.
CODE_ALIASES: dict[str, str] = {
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

# Short slug per class, used in lever ids and file names.
CLASS_SLUG: dict[str, str] = {
    "P-Ambiguity": "ambiguity",
    "P-Contradiction": "contradiction",
    "P-MissingInfo": "missing-info",
    "P-FalsePremise": "false-premise",
    "P-GranularityMismatch": "granularity",
    "P-EpistemicMismatch": "epistemic",
}


def expected_behaviour(perturbation_class: str, intensity: str) -> str:
    """Ground truth of a stratum: LOW stays answerable, MEDIUM/HIGH need the class's code."""
    if perturbation_class not in CANONICAL_CODE:
        raise ValueError(f"unknown perturbation class {perturbation_class!r}")
    if intensity not in INTENSITIES:
        raise ValueError(f"unknown intensity {intensity!r}")
    return ANSWER_CORRECTLY if intensity == "LOW" else CANONICAL_CODE[perturbation_class]


def canonical_code(code: str) -> str | None:
    """Canonical spelling of a refusal code or alias (any case); None if not a code."""
    if code.strip().upper() == ANSWER_CORRECTLY:
        return ANSWER_CORRECTLY
    return CODE_ALIASES.get(code.strip().upper())


# ---------------------------------------------------------------- names as people type them


class UnknownName(ValueError):
    """A class, intensity or stratum name that matches none of the taxonomy's (one line, with the choices)."""


def _name_key(text: str) -> str:
    # "P-MissingInfo", "missinginfo", "missing-info" and "MISSING_INFO" are one name.
    key = str(text).strip().casefold()
    if key[:2] in ("p-", "p_"):
        key = key[2:]
    return "".join(ch for ch in key if ch.isalnum())


# Every accepted key -> canonical class: the class name without ``P-`` and its id slug, in any case.
_CLASS_KEYS: dict[str, str] = {
    key: cls for cls in PERTURBATION_CLASSES for key in (_name_key(cls), _name_key(CLASS_SLUG[cls]))
}
_INTENSITY_KEYS: dict[str, str] = {_name_key(i): i for i in INTENSITIES}


def _resolve(text: str, keys: dict[str, str], what: str, choices: tuple[str, ...], spelling: str) -> str:
    found = keys.get(_name_key(text))
    if found is not None:
        return found
    close = closest_names(_name_key(text), keys, 1)
    hint = f" (did you mean {keys[close[0]]}?)" if close else ""
    raise UnknownName(f"unknown {what} {str(text)!r}{hint}; valid: {', '.join(choices)} ({spelling})")


def parse_class(text: str) -> str:
    """The canonical class for ``text``: ``ambiguity``, ``AMBIGUITY``, ``P-Ambiguity``, ``missing-info`` ...

    Raises ``UnknownName`` naming the value, the closest class and every valid one.
    """
    return _resolve(text, _CLASS_KEYS, "perturbation class", PERTURBATION_CLASSES, "any case, P- optional")


def parse_intensity(text: str) -> str:
    """The canonical intensity for ``text`` (``low``, ``Low``, ``LOW`` -> ``LOW``); ``UnknownName`` otherwise."""
    return _resolve(text, _INTENSITY_KEYS, "intensity", INTENSITIES, "any case")


def parse_stratum(spec: str) -> tuple[str, str]:
    """``CLASS/INTENSITY`` (each as ``parse_class`` / ``parse_intensity`` take it) -> canonical pair."""
    cls_text, sep, intensity_text = str(spec).partition("/")
    if not sep:
        raise UnknownName(f"unknown stratum {str(spec)!r}: expected CLASS/INTENSITY, e.g. P-MissingInfo/LOW")
    try:
        return parse_class(cls_text), parse_intensity(intensity_text)
    except UnknownName as exc:
        raise UnknownName(f"unknown stratum {str(spec)!r} (expected CLASS/INTENSITY): {exc}") from None
