"""Judged responses -> the prepared frame that every metric reads.

:func:`prepare` validates the judged-responses columns (``model, item_id, expected``, a
``response`` or a ``decision``, ``answer_correct``, optional ``confidence`` and breakdown
columns) and turns labels into small integer codes, so the rest of the package works on
numpy arrays. A bad cell is an InputError naming its row's file line.

Decisions the contract leaves open:
- ``answer_correct`` missing/null on an answer attempt counts as not correct (the judge
  failed; an unjudged answer is not evidence of a right one); such attempts on answerable
  items are flagged ``answer_unjudged`` and counted as ``n_unjudged``. The column may be
  absent only when no answerable item got an answer attempt.
- An empty/absent reply parses as an answer attempt (no code), judged like any other.

An optional ``base_id`` (the base item the benchmark item was written from) is kept: the
intervals resample base items (:mod:`.clusters`); a row without one is its own cluster.

Rows may carry an ``outcome`` (``tasks/llm/reply_outcomes.py``; missing = ``ok``): a row whose
outcome is not ``ok`` has no usable response (truncated, provider_blocked, too_long, empty)
or failed (call_error, judge_error). It needs no decision, is ``scored = False`` and enters
no accuracy metric; the outcome rates (``non_response_rate``, ``coverage``, ...) count it.

Multi-document (GaRAGe) judgments may add ``raf``, ``eligibility``, ``factuality`` (0/1)
and ``variant`` (single|multi). Where ``raf`` is given and ``answer_correct`` is not, RAF = 1
is the correct answer; where both are given they must agree. RAF = 1 with eligibility = 0
is impossible (RAF requires eligibility) and is refused. A row is multi-document by its
``variant`` (an empty cell: single-document); without a ``variant`` column, every row is
multi-document when the file carries any RAF score and single-document otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.reply_outcomes import OK, ROW_OUTCOMES
from refusalbench.tasks.refusalbench.decisions import ANSWER, normalise_decision, parse_decision
from refusalbench.tasks.refusalbench.scoring.calibration import NO_BIN, confidence_of
from refusalbench.tasks.refusalbench.taxonomy import ANSWER_CORRECTLY, REFUSAL_CODES, VARIANTS, canonical_code

REQUIRED_COLUMNS: tuple[str, ...] = ("model", "item_id", "expected")
BREAKDOWN_DIMENSIONS: tuple[str, ...] = (
    "perturbation_class",
    "intensity",
    "lever_id",
    "domain",
    "generator",
)
# The base item a benchmark item was written from: items of one base item share its question and
# context, so the bootstrap resamples base items (:mod:`.clusters`). Optional; kept as text.
CLUSTER_COLUMN = "base_id"
PREPARED_COLUMNS: tuple[str, ...] = (
    "model",
    "item_id",
    "expected",
    "decision",
    "answerable",
    "refused",
    "answer_correct",
    "answered_correctly",
    "right_code",
    "correct",
    "confidence",
    "confidence_value",
    "confidence_bin",
    "outcome",
    "scored",
)

# Fixed label spaces: code 0 = ANSWER_CORRECTLY / ANSWER, codes 1.. = the canonical refusal
# codes in the same order in both, -1 = not a label.
EXPECTED_LABELS: tuple[str, ...] = (ANSWER_CORRECTLY, *REFUSAL_CODES)
DECISION_LABELS: tuple[str, ...] = (ANSWER, *REFUSAL_CODES)
ANSWER_CODE = 0
_LABEL_CODE: dict[str, int] = {
    **{label: code for code, label in enumerate(EXPECTED_LABELS)},
    **{label: code for code, label in enumerate(DECISION_LABELS)},
}

JUDGE_SCORE_COLUMNS: tuple[str, ...] = ("raf", "eligibility", "factuality")

LineOf = Callable[[int], "int | None"]


def row_line(position: int) -> int:
    """The default row -> line mapping: a frame's row i is "line" i + 1."""
    return position + 1


def _fail(source: str, line_of: LineOf, mask: np.ndarray, field: str, problem: Callable[[int], str]) -> None:
    """Raise InputError for the first True position of ``mask``, if any."""
    bad = np.flatnonzero(mask)
    if bad.size:
        first = int(bad[0])
        raise InputError(source, problem(first), line=line_of(first), field=field)


def _per_unique(values: pd.Series, fn: Callable[[Any], Any]) -> tuple[np.ndarray, list[Any]]:
    """Apply ``fn`` once per distinct value (labels and confidences repeat a lot).

    Returns (codes, mapped): row i's result is ``mapped[codes[i]]``; missing cells get
    ``fn(None)``, stored last.
    """
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    mapped = [fn(u) for u in uniques.tolist()] + [fn(None)]  # tolist: fast from Arrow
    return np.where(codes < 0, len(mapped) - 1, codes), mapped


def _lookup(codes: np.ndarray, mapped: Sequence[Any], dtype: Any) -> np.ndarray:
    looked_up: np.ndarray = np.asarray(mapped, dtype=dtype)[codes]
    return looked_up


def _categorical(codes: np.ndarray, labels: Sequence[str | None]) -> pd.Categorical:
    """Categorical of per-unique labels (None -> missing) without touching every row in Python."""
    label_codes, categories = pd.factorize(pd.Series(list(labels), dtype=object), use_na_sentinel=True)
    return pd.Categorical.from_codes(label_codes[codes], categories=pd.Index(categories, dtype=object))


def _label_code(label: str | None) -> int:
    return -1 if label is None else _LABEL_CODE[label]


_TRUE = {"true", "1", "yes", "y", "t", "1.0"}
_FALSE = {"false", "0", "no", "n", "f", "0.0"}


def _as_bool(value: Any) -> Any:
    """True/False for bool-like values, None for missing, the string "bad" otherwise."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        if isinstance(value, float) and math.isnan(value):
            return None
        return bool(value) if value in (0, 1) else "bad"
    if isinstance(value, str):
        key = value.strip().lower()
        if key == "":
            return None
        if key in _TRUE:
            return True
        if key in _FALSE:
            return False
    return "bad"


def _parse_responses(responses: pd.Series) -> np.ndarray:
    """parse_decision over many replies; those that cannot hold a code skip the regex.

    Every code spelling contains "refuse" (ASCII, any case), so a vectorised substring test
    finds the only replies worth parsing; the rest are answer attempts.
    """
    texts = responses.astype("str")  # Arrow-backed: the substring test runs in C++
    maybe = texts.str.contains("refuse", case=False, regex=False).fillna(False).to_numpy(dtype=bool)
    result = np.full(len(responses), ANSWER_CODE, dtype=np.int8)
    if maybe.any():
        codes, mapped = _per_unique(responses[maybe], lambda text: _label_code(parse_decision(text)))
        result[maybe] = _lookup(codes, mapped, np.int8)
    return result


def _is_missing(values: pd.Series) -> np.ndarray:
    missing: np.ndarray = values.isna().to_numpy()
    return missing


def is_prepared(df: pd.DataFrame) -> bool:
    return all(col in df.columns for col in PREPARED_COLUMNS)


def prepare(
    df: pd.DataFrame,
    *,
    source: str = "<frame>",
    line_of: LineOf | None = None,
) -> pd.DataFrame:
    """Validate and normalise judged responses into the frame every metric reads.

    Adds: ``decision`` (ANSWER or canonical code; parsed from ``response`` where missing),
    canonical ``expected``, booleans ``answerable, refused, answer_correct,
    answered_correctly, right_code, correct``, and ``confidence`` (canonical text),
    ``confidence_value`` (float, NaN if none), ``confidence_bin`` (-1 if none). Keeps the
    optional breakdown columns as text; drops ``response``. Label columns (model, expected,
    decision, confidence, breakdown columns) are categoricals: cheap at a million rows.
    Raises InputError naming the first bad row (``line_of`` maps a row position to the
    file line; default: position + 1).
    """
    line_of = line_of or row_line
    columns = set(df.columns)
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            raise InputError(source, "required column is missing", field=col)
    if "response" not in columns and "decision" not in columns:
        raise InputError(source, "need a 'response' or a 'decision' column", field="response")
    n = len(df)

    model = df["model"]
    _fail(
        source,
        line_of,
        _is_missing(model) | (model.astype(str).str.strip() == "").to_numpy(),
        "model",
        lambda i: "model name is missing",
    )
    _fail(source, line_of, _is_missing(df["item_id"]), "item_id", lambda i: "item_id is missing")
    _fail(source, line_of, _is_missing(df["expected"]), "expected", lambda i: "expected is missing")

    # Labels become small integer codes in fixed label spaces (EXPECTED_LABELS,
    # DECISION_LABELS): a refusal code has the same number in both, so "right code" is
    # one integer compare.
    codes, mapped = _per_unique(
        df["expected"], lambda v: _label_code(canonical_code(v) if isinstance(v, str) else None)
    )
    expected = _lookup(codes, mapped, np.int8)
    _fail(
        source,
        line_of,
        expected < 0,
        "expected",
        lambda i: f"not ANSWER_CORRECTLY or a refusal code: {df['expected'].iloc[i]!r}",
    )

    outcome = _outcome_codes(df, source, line_of)
    scored = outcome == ROW_OUTCOMES.index(OK)
    decision = np.full(n, -1, dtype=np.int8)
    if "decision" in columns:
        given = df["decision"]
        present = ~_is_missing(given) & scored
        codes, mapped = _per_unique(given, lambda v: _label_code(normalise_decision(v)))
        normalised = _lookup(codes, mapped, np.int8)
        _fail(
            source,
            line_of,
            present & (normalised < 0),
            "decision",
            lambda i: f"not ANSWER or a refusal code: {given.iloc[i]!r}",
        )
        decision[present] = normalised[present]
    unset = (decision < 0) & scored  # a row without a usable response has no decision to find
    if unset.any():
        if "response" in columns:
            decision[unset] = _parse_responses(df["response"][unset])
        else:
            _fail(source, line_of, unset, "decision", lambda i: "decision is missing")

    answerable = expected == ANSWER_CODE
    refused = decision != ANSWER_CODE
    if "answer_correct" in columns:
        codes, mapped = _per_unique(df["answer_correct"], _as_bool)
        _fail(
            source,
            line_of,
            _lookup(codes, [m == "bad" for m in mapped], bool),
            "answer_correct",
            lambda i: f"not a boolean: {df['answer_correct'].iloc[i]!r}",
        )
        answer_judged = _lookup(codes, [m is not None for m in mapped], bool)
        answer_correct = _lookup(codes, [m is True for m in mapped], bool)
    else:
        if "raf" not in columns:
            # Refusals need no judge; answer attempts do, so the column must exist for them.
            _fail(
                source,
                line_of,
                answerable & ~refused,
                "answer_correct",
                lambda i: "column is missing but this answerable item got an answer attempt",
            )
        answer_judged = np.zeros(n, dtype=bool)
        answer_correct = np.zeros(n, dtype=bool)

    scores = _judge_scores(df, source, line_of)
    if "raf" in scores:
        raf_has = ~np.isnan(scores["raf"])
        raf_correct = scores["raf"] == 1
        _fail(
            source,
            line_of,
            answer_judged & raf_has & (answer_correct != raf_correct),
            "answer_correct",
            lambda i: f"disagrees with raf = {int(scores['raf'][i])} (correct means RAF = 1)",
        )
        answer_correct = np.where(answer_judged, answer_correct, raf_correct)
        answer_judged = answer_judged | raf_has
    if "answer_correct" not in columns and "raf" in scores:
        # The column may stand absent where RAF judged every answer attempt instead.
        _fail(
            source,
            line_of,
            answerable & ~refused & ~answer_judged,
            "answer_correct",
            lambda i: "column is missing and this answerable item's answer attempt has no raf",
        )

    answered_correctly = answerable & ~refused & answer_correct
    right_code = ~answerable & (decision == expected)
    if "confidence" in columns:
        codes, mapped = _per_unique(df["confidence"], confidence_of)
        _fail(
            source,
            line_of,
            ~_lookup(codes, [c[3] for c in mapped], bool),
            "confidence",
            lambda i: f"not a confidence level or a number in [0, 1]: {df['confidence'].iloc[i]!r}",
        )
        conf_text = _categorical(codes, [c[0] for c in mapped])
        conf_value = _lookup(codes, [c[1] for c in mapped], np.float64)
        conf_bin = _lookup(codes, [c[2] for c in mapped], np.int8)
    else:
        conf_text = pd.Categorical.from_codes(np.full(n, -1), categories=pd.Index([], dtype=object))
        conf_value = np.full(n, np.nan)
        conf_bin = np.full(n, NO_BIN, dtype=np.int8)
    # Unscored rows: no decision (code -1, so neither an answer attempt nor a right code), no
    # refusal, no confidence; the indicators below are all False for them.
    refused &= scored
    conf_value = np.where(scored, conf_value, np.nan)
    conf_bin = np.where(scored, conf_bin, NO_BIN).astype(np.int8)

    model_codes, model_names = pd.factorize(model, sort=True)
    out = pd.DataFrame(
        {
            "model": pd.Categorical.from_codes(model_codes, categories=[str(m) for m in model_names]),
            "item_id": df["item_id"].astype(str).to_numpy(),
            "expected": pd.Categorical.from_codes(expected, categories=EXPECTED_LABELS),
            "decision": pd.Categorical.from_codes(decision, categories=DECISION_LABELS),
            "answerable": answerable,
            "refused": refused,
            "answer_correct": answer_correct,
            # Only answerable items need a judge: answers to unanswerable ones are wrong anyway.
            "answer_unjudged": answerable & ~refused & ~answer_judged & scored,
            "answered_correctly": answered_correctly,
            "right_code": right_code,
            "correct": answered_correctly | right_code,
            "confidence": conf_text,
            "confidence_value": conf_value,
            "confidence_bin": conf_bin,
            "outcome": pd.Categorical.from_codes(outcome, categories=list(ROW_OUTCOMES)),
            "scored": scored,
        }
    )
    out["multi"] = _multi_rows(df, scores, source, line_of)
    for name in JUDGE_SCORE_COLUMNS:
        out[name] = scores.get(name, np.full(n, np.nan))
    duplicated = out.duplicated(["model", "item_id"]).to_numpy()
    _fail(
        source,
        line_of,
        duplicated,
        "item_id",
        lambda i: f"duplicate (model, item_id) = ({out['model'].iat[i]!r}, {out['item_id'].iat[i]!r})",
    )
    for dim in (*BREAKDOWN_DIMENSIONS, CLUSTER_COLUMN):
        if dim in columns:
            codes, mapped = _per_unique(df[dim], _group_text)
            out[dim] = _categorical(codes, mapped)
    return out


def _outcome_codes(df: pd.DataFrame, source: str, line_of: LineOf) -> np.ndarray:
    """Each row's outcome as its index in ROW_OUTCOMES (a missing column or cell: ``ok``), checked."""
    if "outcome" not in df.columns:
        return np.full(len(df), ROW_OUTCOMES.index(OK), dtype=np.int8)

    def code(value: Any) -> int:
        if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
            return ROW_OUTCOMES.index(OK)
        text = str(value).strip().lower() or OK
        return ROW_OUTCOMES.index(text) if text in ROW_OUTCOMES else -1

    codes, mapped = _per_unique(df["outcome"], code)
    outcome = _lookup(codes, mapped, np.int8)
    _fail(
        source,
        line_of,
        outcome < 0,
        "outcome",
        lambda i: f"not an outcome: {df['outcome'].iloc[i]!r} (one of {', '.join(ROW_OUTCOMES)})",
    )
    return outcome


def _judge_scores(df: pd.DataFrame, source: str, line_of: LineOf) -> dict[str, np.ndarray]:
    """The optional 0/1 judge columns present in ``df`` as floats (NaN = not judged), checked."""
    scores: dict[str, np.ndarray] = {}
    for name in JUDGE_SCORE_COLUMNS:
        if name not in df.columns:
            continue
        codes, mapped = _per_unique(df[name], _as_bool)

        def not_binary(i: int, name: str = name) -> str:
            return f"not 0/1: {df[name].iloc[i]!r}"

        _fail(source, line_of, _lookup(codes, [m == "bad" for m in mapped], bool), name, not_binary)
        scores[name] = _lookup(codes, [math.nan if m is None else float(m) for m in mapped], np.float64)
    if "raf" in scores and "eligibility" in scores:
        _fail(
            source,
            line_of,
            (scores["raf"] == 1) & (scores["eligibility"] == 0),
            "raf",
            lambda i: "RAF = 1 with eligibility = 0 is impossible (RAF requires eligibility)",
        )
    return scores


def _variant_text(value: Any) -> str | None:
    """A variant cell as lower-case text; None when missing (NaN, None, blank)."""
    if isinstance(value, str):
        return value.strip().lower() or None
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return repr(value)  # not a variant: reported as such


def _multi_rows(df: pd.DataFrame, scores: dict[str, np.ndarray], source: str, line_of: LineOf) -> np.ndarray:
    """Which rows are multi-document: by ``variant``; without that column, by whether any RAF exists."""
    if "variant" not in df.columns:
        return np.full(len(df), bool("raf" in scores and (~np.isnan(scores["raf"])).any()))
    codes, mapped = _per_unique(df["variant"], _variant_text)
    _fail(
        source,
        line_of,
        _lookup(codes, [m is not None and m not in VARIANTS for m in mapped], bool),
        "variant",
        lambda i: f"not single or multi: {df['variant'].iloc[i]!r}",
    )
    return _lookup(codes, [m == "multi" for m in mapped], bool)


def _group_text(value: Any) -> str | None:
    """A breakdown value as text; 3.0 (an integer read back as float) becomes "3"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def ensure_prepared(df: pd.DataFrame) -> pd.DataFrame:
    return df if is_prepared(df) else prepare(df)
