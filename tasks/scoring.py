"""Scoring judged responses: the metrics of DESIGN.md §6, bootstrap intervals, breakdowns.

Pure functions over pandas/numpy; no model calls. The flow and the ``score`` CLI both go
through :func:`score_frame` and :func:`render_score_outputs`.

How it stays fast at a million rows: every metric of §6 is a ratio of sums of per-row
indicators (ECE too: ``Σ_b n_b/N·|acc_b − conf_b| = Σ_b |Σcorrect_b − Σconf_b| / N``).
So one vector of *sufficient statistics* per model (or per model × group) is computed
with ``np.bincount``, and :func:`metrics_from_stats` turns any stack of such vectors into
metrics. The bootstrap draws, per model, multinomial counts over the model's distinct row
*types* (a type = the indicator flags + confidence bin + confidence value) — the same
distribution as resampling rows with replacement — and multiplies them with the per-type
statistics: 1,000 resamples cost one small matrix product, not 1,000 group-bys.

Decisions the contract leaves open (documented here, tested in tests/test_scoring.py):
- ``answer_correct`` missing/null on an answer attempt counts as not correct (the judge
  failed; an unjudged answer is not evidence of a right one); ``n_unjudged`` counts such
  attempts on answerable items. The column may be absent only when no answerable item got
  an answer attempt.
- An empty/absent reply parses as an answer attempt (no code), judged like any other.
- ``detection_f1``: NaN when precision or recall is NaN; 0 when both are defined and 0.
- ``hierarchical_score`` / ``calibrated_refusal_score``: NaN when either factor is NaN.
- ECE: rows without a confidence are left out; NaN when no row has one. Verbal levels get
  one bin each; numbers get 10 equal-width bins on [0, 1] (1.0 in the last). A model that
  mixes both kinds keeps the two families of bins apart (15 bins in all) and every bin is
  weighted by its share of all the model's rows with a confidence.
- Bootstrap: percentile 95% intervals; resamples where a metric is undefined (e.g. no
  refusal drawn) are ignored for that metric; NaN interval if all are. Each model uses its
  own generator seeded by (seed, crc32(model)), so adding a model leaves the others'
  intervals unchanged. When a model has more than ``MAX_EXACT_TYPES`` distinct types
  (float confidences are nearly all distinct), numeric confidences are grouped on a 0.001
  grid for the bootstrap only, each group carrying its exact mean; bins stay exact. The
  point estimates never use this grouping.
- NaN is written to metrics.json as ``null`` (valid JSON); :func:`read_metrics_json` maps
  it back to NaN.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.errors import InputError
from refusalbench.tasks.decisions import (
    ANSWER,
    CONFIDENCE_LEVELS,
    LEVELS_ASCENDING,
    normalise_decision,
    parse_confidence,
    parse_decision,
)
from refusalbench.tasks.taxonomy import ANSWER_CORRECTLY, INTENSITIES, REFUSAL_CODES, canonical_code

# ----------------------------------------------------------------- names

METRICS: tuple[str, ...] = (
    "answer_accuracy",
    "refusal_accuracy",
    "false_refusal_rate",
    "missed_refusal_rate",
    "refusal_rate",
    "correct_refusal_rate",
    "detection_precision",
    "detection_recall",
    "detection_f1",
    "category_accuracy",
    "hierarchical_score",
    "calibrated_refusal_score",
    "ece",
    "ece_answer",
    "ece_refusal",
)
COUNTS: tuple[str, ...] = ("n", "n_answerable", "n_unanswerable", "n_confidence", "n_unjudged")
BREAKDOWN_DIMENSIONS: tuple[str, ...] = (
    "perturbation_class",
    "intensity",
    "lever_id",
    "domain",
    "generator",
)
REQUIRED_COLUMNS: tuple[str, ...] = ("model", "item_id", "expected")
BREAKDOWN_COLUMNS: tuple[str, ...] = (
    "model", "group", "value", "metric", "estimate", "ci_low", "ci_high", "n",
)
PREPARED_COLUMNS: tuple[str, ...] = (
    "model", "item_id", "expected", "decision", "answerable", "refused", "answer_correct",
    "answered_correctly", "right_code", "correct", "confidence", "confidence_value",
    "confidence_bin",
)

# Confidence bins: 0..4 the verbal levels (ascending), 5..14 the ten float bins.
N_VERBAL_BINS = len(LEVELS_ASCENDING)
N_FLOAT_BINS = 10
N_BINS = N_VERBAL_BINS + N_FLOAT_BINS
NO_BIN = -1
MAX_EXACT_TYPES = 4096
FLOAT_GRID = 1000  # bootstrap grouping of numeric confidences: 0.001

# Sufficient statistics, in this order, then the ECE block
# [scope (0 answer attempts, 1 refusals)][bin][count, sum correct, sum confidence].
_BASE_STATS: tuple[str, ...] = (
    "n",
    "n_answerable",
    "n_unanswerable",
    "answered_correctly",
    "right_code",
    "refused",
    "answerable_refused",
    "unanswerable_refused",
    "unanswerable_answered",
    "n_unjudged",
)
_N_BASE = len(_BASE_STATS)
_N_STATS = _N_BASE + 2 * N_BINS * 3


def bin_label(bin_index: int) -> str:
    """Human label of a confidence bin: the level name or the float range."""
    if bin_index < N_VERBAL_BINS:
        return LEVELS_ASCENDING[bin_index]
    k = bin_index - N_VERBAL_BINS
    return f"{k / 10:.1f}-{(k + 1) / 10:.1f}"


# ----------------------------------------------------------------- preparing input

LineOf = Callable[[int], "int | None"]


def _row_line(position: int) -> int:
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
    return np.asarray(mapped, dtype=dtype)[codes]


def _categorical(codes: np.ndarray, labels: Sequence[str | None]) -> pd.Categorical:
    """Categorical of per-unique labels (None -> missing) without touching every row in Python."""
    label_codes, categories = pd.factorize(pd.Series(list(labels), dtype=object), use_na_sentinel=True)
    return pd.Categorical.from_codes(label_codes[codes], categories=pd.Index(categories, dtype=object))


# Fixed label spaces: code 0 = ANSWER_CORRECTLY / ANSWER, codes 1.. = the canonical refusal
# codes in the same order in both, -1 = not a label.
EXPECTED_LABELS: tuple[str, ...] = (ANSWER_CORRECTLY, *REFUSAL_CODES)
DECISION_LABELS: tuple[str, ...] = (ANSWER, *REFUSAL_CODES)
ANSWER_CODE = 0
_LABEL_CODE: dict[str, int] = {
    **{label: code for code, label in enumerate(EXPECTED_LABELS)},
    **{label: code for code, label in enumerate(DECISION_LABELS)},
}


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


def _confidence_of(value: Any) -> tuple[str | None, float, int, bool]:
    """(canonical text, value, bin, ok) of one confidence cell; missing -> (None, nan, -1, True)."""
    if value is None or value is pd.NA:
        return None, math.nan, NO_BIN, True
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        number = float(value)
        if math.isnan(number):
            return None, math.nan, NO_BIN, True
        if not 0.0 <= number <= 1.0:
            return None, math.nan, NO_BIN, False
        text = repr(round(number, 6))
    elif isinstance(value, str):
        if not value.strip():
            return None, math.nan, NO_BIN, True
        text = value if value in CONFIDENCE_LEVELS else parse_confidence(value)
        if text is None:
            return None, math.nan, NO_BIN, False
    else:
        return None, math.nan, NO_BIN, False
    if text in CONFIDENCE_LEVELS:
        return text, CONFIDENCE_LEVELS[text], LEVELS_ASCENDING.index(text), True
    number = float(text)
    return text, number, N_VERBAL_BINS + min(int(number * N_FLOAT_BINS), N_FLOAT_BINS - 1), True


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
    return values.isna().to_numpy()


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
    line_of = line_of or _row_line
    columns = set(df.columns)
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            raise InputError(source, "required column is missing", field=col)
    if "response" not in columns and "decision" not in columns:
        raise InputError(source, "need a 'response' or a 'decision' column", field="response")
    n = len(df)

    model = df["model"]
    _fail(source, line_of, _is_missing(model) | (model.astype(str).str.strip() == "").to_numpy(),
          "model", lambda i: "model name is missing")
    _fail(source, line_of, _is_missing(df["item_id"]), "item_id", lambda i: "item_id is missing")
    _fail(source, line_of, _is_missing(df["expected"]), "expected", lambda i: "expected is missing")

    # Labels become small integer codes in fixed label spaces (EXPECTED_LABELS,
    # DECISION_LABELS): a refusal code has the same number in both, so "right code" is
    # one integer compare.
    codes, mapped = _per_unique(
        df["expected"], lambda v: _label_code(canonical_code(v) if isinstance(v, str) else None)
    )
    expected = _lookup(codes, mapped, np.int8)
    _fail(source, line_of, expected < 0, "expected",
          lambda i: f"not ANSWER_CORRECTLY or a refusal code: {df['expected'].iloc[i]!r}")

    decision = np.full(n, -1, dtype=np.int8)
    if "decision" in columns:
        given = df["decision"]
        present = ~_is_missing(given)
        codes, mapped = _per_unique(given, lambda v: _label_code(normalise_decision(v)))
        normalised = _lookup(codes, mapped, np.int8)
        _fail(source, line_of, present & (normalised < 0), "decision",
              lambda i: f"not ANSWER or a refusal code: {given.iloc[i]!r}")
        decision[present] = normalised[present]
    unset = decision < 0
    if unset.any():
        if "response" in columns:
            decision[unset] = _parse_responses(df["response"][unset])
        else:
            _fail(source, line_of, unset, "decision", lambda i: "decision is missing")

    answerable = expected == ANSWER_CODE
    refused = decision != ANSWER_CODE
    if "answer_correct" in columns:
        codes, mapped = _per_unique(df["answer_correct"], _as_bool)
        _fail(source, line_of, _lookup(codes, [m == "bad" for m in mapped], bool),
              "answer_correct", lambda i: f"not a boolean: {df['answer_correct'].iloc[i]!r}")
        answer_judged = _lookup(codes, [m is not None for m in mapped], bool)
        answer_correct = _lookup(codes, [m is True for m in mapped], bool)
    else:
        # Refusals need no judge; answer attempts do, so the column must exist for them.
        _fail(source, line_of, answerable & ~refused, "answer_correct",
              lambda i: "column is missing but this answerable item got an answer attempt")
        answer_judged = np.zeros(n, dtype=bool)
        answer_correct = np.zeros(n, dtype=bool)

    answered_correctly = answerable & ~refused & answer_correct
    right_code = ~answerable & (decision == expected)
    if "confidence" in columns:
        codes, mapped = _per_unique(df["confidence"], _confidence_of)
        _fail(source, line_of, ~_lookup(codes, [c[3] for c in mapped], bool), "confidence",
              lambda i: f"not a confidence level or a number in [0, 1]: {df['confidence'].iloc[i]!r}")
        conf_text = _categorical(codes, [c[0] for c in mapped])
        conf_value = _lookup(codes, [c[1] for c in mapped], np.float64)
        conf_bin = _lookup(codes, [c[2] for c in mapped], np.int8)
    else:
        conf_text = pd.Categorical.from_codes(np.full(n, -1), categories=pd.Index([], dtype=object))
        conf_value = np.full(n, np.nan)
        conf_bin = np.full(n, NO_BIN, dtype=np.int8)

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
            "answer_unjudged": answerable & ~refused & ~answer_judged,
            "answered_correctly": answered_correctly,
            "right_code": right_code,
            "correct": answered_correctly | right_code,
            "confidence": conf_text,
            "confidence_value": conf_value,
            "confidence_bin": conf_bin,
        }
    )
    duplicated = out.duplicated(["model", "item_id"]).to_numpy()
    _fail(source, line_of, duplicated, "item_id",
          lambda i: f"duplicate (model, item_id) = ({out['model'].iat[i]!r}, {out['item_id'].iat[i]!r})")
    for dim in BREAKDOWN_DIMENSIONS:
        if dim in columns:
            codes, mapped = _per_unique(df[dim], _group_text)
            out[dim] = _categorical(codes, mapped)
    return out


def _group_text(value: Any) -> str | None:
    """A breakdown value as text; 3.0 (an integer read back as float) becomes "3"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def ensure_prepared(df: pd.DataFrame) -> pd.DataFrame:
    return df if is_prepared(df) else prepare(df)


# ----------------------------------------------------------------- reading input files

def _csv_line_of(path: Path) -> LineOf:
    """Row position -> first file line of that CSV record (records may span lines)."""
    cache: list[int] = []

    def line_of(position: int) -> int | None:
        if not cache:
            with path.open(newline="", encoding="utf-8") as handle:
                reader = csv.reader(handle)
                previous_end = 1 if next(reader, None) is not None else 0
                for _ in reader:
                    cache.append(previous_end + 1)
                    previous_end = reader.line_num
        return cache[position] if position < len(cache) else None

    return line_of


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) per physical line; an oversized or non-UTF-8 line is an InputError.

    Lines are read with a size bound, so an enormous line is refused without being loaded.
    """
    from refusalbench.tasks.basesets import MAX_LINE_BYTES

    with path.open("rb") as handle:
        number = 0
        while chunk := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
                raise InputError(str(path), f"line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB; refusing to read it",
                                 line=number)
            if number == 1:
                chunk = chunk.removeprefix(b"\xef\xbb\xbf")
            try:
                text = chunk.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(str(path), f"not valid UTF-8 (byte 0x{chunk[exc.start]:02x} at column {exc.start + 1})",
                                 line=number) from None
            yield number, text


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, list[int]]:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    for number, line in _jsonl_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(str(path), f"invalid JSON: {exc.msg}", line=number) from None
        if not isinstance(record, dict):
            raise InputError(str(path), "each line must be a JSON object", line=number)
        records.append(record)
        lines.append(number)
    return pd.DataFrame.from_records(records), lines


def read_judged(path: str | Path) -> pd.DataFrame:
    """Read judged responses (Parquet, JSONL or CSV) and return them :func:`prepare`-d.

    Errors are InputError with the file line of the first bad record (Parquet: row number).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(str(path), "file not found")
    suffix = "".join(path.suffixes[-1:]).lower()
    if suffix in (".parquet", ".pq"):
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise InputError(str(path), f"not a readable Parquet file: {exc}") from None
        line_of: LineOf = _row_line
    elif suffix in (".jsonl", ".ndjson", ".json"):
        df, lines = _read_jsonl(path)
        line_of = lambda position: lines[position] if position < len(lines) else None  # noqa: E731
    elif suffix == ".csv":
        try:
            df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise InputError(str(path), f"not a readable CSV file: {exc}") from None
        line_of = _csv_line_of(path)
    else:
        raise InputError(str(path), f"unsupported file type {suffix or '(none)'}: use .parquet, .jsonl or .csv")
    if df.empty:
        raise InputError(str(path), "no judged responses in file")
    return prepare(df, source=str(path), line_of=line_of)


# ----------------------------------------------------------------- sufficient statistics

def _row_arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
    return {
        "answerable": df["answerable"].to_numpy(dtype=bool),
        "refused": df["refused"].to_numpy(dtype=bool),
        "answered_correctly": df["answered_correctly"].to_numpy(dtype=bool),
        "right_code": df["right_code"].to_numpy(dtype=bool),
        "correct": df["correct"].to_numpy(dtype=bool),
        "unjudged": df["answer_unjudged"].to_numpy(dtype=bool) if "answer_unjudged" in df
        else np.zeros(len(df), dtype=bool),
        "conf_value": df["confidence_value"].to_numpy(dtype=np.float64),
        "conf_bin": df["confidence_bin"].to_numpy(dtype=np.int64),
    }


def _stats(groups: np.ndarray, n_groups: int, rows: Mapping[str, np.ndarray],
           weights: np.ndarray | None = None) -> np.ndarray:
    """(n_groups × _N_STATS) sums of the row indicators per group.

    ``weights`` (one per row) lets the same code build per-type statistics.
    """
    w = np.ones(len(groups)) if weights is None else weights
    answerable, refused = rows["answerable"], rows["refused"]

    def total(mask: np.ndarray) -> np.ndarray:
        return np.bincount(groups, weights=w * mask, minlength=n_groups)

    base = [
        np.bincount(groups, weights=w, minlength=n_groups),
        total(answerable),
        total(~answerable),
        total(rows["answered_correctly"]),
        total(rows["right_code"]),
        total(refused),
        total(answerable & refused),
        total(~answerable & refused),
        total(~answerable & ~refused),
        total(rows["unjudged"]),
    ]
    stats = np.zeros((n_groups, _N_STATS))
    stats[:, :_N_BASE] = np.stack(base, axis=1) if n_groups else stats[:, :_N_BASE]
    has = rows["conf_bin"] >= 0
    if has.any():
        cell = (refused[has].astype(np.int64) * N_BINS + rows["conf_bin"][has])
        key = groups[has] * (2 * N_BINS) + cell
        size = n_groups * 2 * N_BINS
        wh = w[has]
        block = np.stack(
            [
                np.bincount(key, weights=wh, minlength=size),
                np.bincount(key, weights=wh * rows["correct"][has], minlength=size),
                np.bincount(key, weights=wh * rows["conf_value"][has], minlength=size),
            ],
            axis=1,
        )  # (size × 3), row = group*30 + scope*15 + bin
        stats[:, _N_BASE:] = block.reshape(n_groups, 2 * N_BINS * 3)
    return stats


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _ece(block: np.ndarray) -> np.ndarray:
    """ECE from (..., bins, 3) [count, sum correct, sum conf]: Σ_b |Σcorrect_b − Σconf_b| / N."""
    total = block[..., 0].sum(axis=-1)
    gap = np.abs(block[..., 1] - block[..., 2]).sum(axis=-1)
    return _ratio(gap, total)


def metrics_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of DESIGN.md §6 from a stack (..., _N_STATS) of sufficient statistics."""
    s = {name: stats[..., i] for i, name in enumerate(_BASE_STATS)}
    ece_block = stats[..., _N_BASE:].reshape(*stats.shape[:-1], 2, N_BINS, 3)
    answer_accuracy = _ratio(s["answered_correctly"], s["n_answerable"])
    refusal_accuracy = _ratio(s["right_code"], s["n_unanswerable"])
    precision = _ratio(s["unanswerable_refused"], s["refused"])
    recall = _ratio(s["unanswerable_refused"], s["n_unanswerable"])
    with np.errstate(divide="ignore", invalid="ignore"):
        # Both defined and both 0 -> 0; NaN propagates from an undefined side.
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    f1 = np.where(np.isnan(precision) | np.isnan(recall), np.nan, f1)
    category_accuracy = _ratio(s["right_code"], s["unanswerable_refused"])
    return {
        "answer_accuracy": answer_accuracy,
        "refusal_accuracy": refusal_accuracy,
        "false_refusal_rate": _ratio(s["answerable_refused"], s["n_answerable"]),
        "missed_refusal_rate": _ratio(s["unanswerable_answered"], s["n_unanswerable"]),
        "refusal_rate": _ratio(s["refused"], s["n"]),
        "correct_refusal_rate": recall,
        "detection_precision": precision,
        "detection_recall": recall,
        "detection_f1": f1,
        "category_accuracy": category_accuracy,
        "hierarchical_score": f1 * category_accuracy,
        "calibrated_refusal_score": (answer_accuracy + refusal_accuracy) / 2,
        "ece": _ece(ece_block.sum(axis=-3)),
        "ece_answer": _ece(ece_block[..., 0, :, :]),
        "ece_refusal": _ece(ece_block[..., 1, :, :]),
    }


def _counts_from_stats(stats: np.ndarray) -> dict[str, np.ndarray]:
    ece_block = stats[..., _N_BASE:].reshape(*stats.shape[:-1], 2, N_BINS, 3)
    return {
        "n": stats[..., 0],
        "n_answerable": stats[..., 1],
        "n_unanswerable": stats[..., 2],
        "n_confidence": ece_block[..., 0].sum(axis=(-1, -2)),
        "n_unjudged": stats[..., _BASE_STATS.index("n_unjudged")],
    }


def _model_codes(df: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    codes, models = pd.factorize(df["model"], sort=True)
    return codes.astype(np.int64), [str(m) for m in models]


# ----------------------------------------------------------------- metrics

def compute_metrics(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{model: {metric: value}} with every §6 metric (NaN where undefined) plus counts."""
    df = ensure_prepared(df)
    codes, models = _model_codes(df)
    stats = _stats(codes, len(models), _row_arrays(df))
    values = metrics_from_stats(stats)
    counts = _counts_from_stats(stats)
    result: dict[str, dict[str, float]] = {}
    for i, model in enumerate(models):
        row: dict[str, Any] = {name: float(values[name][i]) for name in METRICS}
        row.update({name: int(counts[name][i]) for name in COUNTS})
        result[model] = row
    return result


_FLAG_NAMES: tuple[str, ...] = ("answerable", "refused", "answered_correctly", "right_code", "unjudged")


def _row_types(rows: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Collapse rows into distinct types: (count per type, one representative row per type).

    A type is (indicator flags, confidence bin, confidence). With more than
    MAX_EXACT_TYPES types, numeric confidences are grouped on a 1/FLOAT_GRID grid and a
    type's confidence is the exact mean of its rows (bins stay exact).
    """
    flags = sum(rows[name].astype(np.int64) << bit for bit, name in enumerate(_FLAG_NAMES))
    key = flags * (N_BINS + 1) + (rows["conf_bin"].astype(np.int64) + 1)
    conf = np.where(rows["conf_bin"] >= 0, rows["conf_value"], -1.0)
    table = pd.DataFrame({"key": key, "grid": conf, "conf": conf})
    if len(table.drop_duplicates(["key", "grid"])) > MAX_EXACT_TYPES:
        table["grid"] = np.where(conf >= 0, np.round(conf * FLOAT_GRID), -1.0)
    types = table.groupby(["key", "grid"], sort=True).agg(count=("conf", "size"), conf=("conf", "mean"))
    type_key = types.index.get_level_values("key").to_numpy()
    type_flags, type_bin = type_key // (N_BINS + 1), type_key % (N_BINS + 1) - 1
    representative = {name: (type_flags >> bit & 1).astype(bool) for bit, name in enumerate(_FLAG_NAMES)}
    representative["correct"] = representative["answered_correctly"] | representative["right_code"]
    representative["conf_value"] = np.where(type_bin >= 0, types["conf"].to_numpy(), np.nan)
    representative["conf_bin"] = type_bin
    return types["count"].to_numpy(), representative


def _bootstrap_one(rows: Mapping[str, np.ndarray], n_resamples: int,
                   rng: np.random.Generator, chunk: int = 250) -> dict[str, np.ndarray]:
    """Metric values of ``n_resamples`` resamples (with replacement) of one model's rows.

    Drawing n rows with replacement = drawing multinomial counts over the row types with
    probabilities count/n; the resample's statistics are then counts @ per-type statistics.
    """
    n = len(rows["answerable"])
    type_counts, representative = _row_types(rows)
    n_types = len(type_counts)
    per_type = _stats(np.arange(n_types), n_types, representative)  # (T × K)
    probabilities = type_counts / n
    pieces = []
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        drawn = rng.multinomial(n, probabilities, size=size).astype(np.float64)  # (size × T)
        pieces.append(drawn @ per_type)
    return metrics_from_stats(np.concatenate(pieces, axis=0))


def _model_rng(seed: int, model: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(model.encode("utf-8"))])


def bootstrap_intervals(
    df: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, dict[str, tuple[float, float]]]:
    """{model: {metric: (low, high)}}: percentile intervals, items resampled within each model."""
    df = ensure_prepared(df)
    wanted = list(metrics) if metrics is not None else list(METRICS)
    unknown = [m for m in wanted if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics: {unknown}")
    codes, models = _model_codes(df)
    rows = _row_arrays(df)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(models) + 1))
    tail = (1 - level) / 2 * 100
    result: dict[str, dict[str, tuple[float, float]]] = {}
    for i, model in enumerate(models):
        idx = order[bounds[i]:bounds[i + 1]]
        sample = _bootstrap_one({k: v[idx] for k, v in rows.items()}, n_resamples, _model_rng(seed, model))
        intervals: dict[str, tuple[float, float]] = {}
        for name in wanted:
            values = sample[name]
            values = values[~np.isnan(values)]
            if values.size == 0:
                intervals[name] = (math.nan, math.nan)
            else:
                low, high = np.percentile(values, [tail, 100 - tail])
                intervals[name] = (float(low), float(high))
        result[model] = intervals
    return result


# ----------------------------------------------------------------- breakdowns and tables

def _empty_breakdown() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
        BREAKDOWN_COLUMNS, ["str", "str", "str", "str", "float64", "float64", "float64", "int64"])})


def breakdown(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Metrics per model × value of ``by`` (long: model, group, value, metric, estimate, n).

    Rows whose ``by`` value is missing are left out; an absent or all-missing column gives
    an empty frame. ``group`` is the dimension name; ``n`` the rows in that model × value.
    """
    df = ensure_prepared(df)
    if by not in df.columns or df[by].isna().all():
        return _empty_breakdown()
    # Group key = model code × value code: two factorizations, no per-row tuples.
    model_codes, models = _model_codes(df)
    value_codes, values_found = pd.factorize(df[by], sort=True, use_na_sentinel=True)
    present = value_codes >= 0
    n_values = len(values_found)
    rows = {k: v[present] for k, v in _row_arrays(df).items()}
    keys = model_codes[present] * n_values + value_codes[present]
    stats = _stats(keys.astype(np.int64), len(models) * n_values, rows)
    used = np.flatnonzero(stats[:, 0] > 0)
    stats = stats[used]
    values = metrics_from_stats(stats)
    sizes = stats[:, 0].astype(np.int64)
    model_of = np.asarray(models, dtype=object)[used // n_values]
    value_of = np.asarray([str(v) for v in values_found], dtype=object)[used % n_values]
    frames = [
        pd.DataFrame({
            "model": model_of, "group": by, "value": value_of, "metric": name,
            "estimate": values[name], "ci_low": np.nan, "ci_high": np.nan, "n": sizes,
        })
        for name in METRICS
    ]
    return pd.concat(frames, ignore_index=True)


def overall_rows(metrics: Mapping[str, Mapping[str, float]],
                 intervals: Mapping[str, Mapping[str, tuple[float, float]]]) -> pd.DataFrame:
    """The overall metrics with their intervals in the breakdown's long layout."""
    records = []
    for model, values in metrics.items():
        for name in METRICS:
            low, high = intervals.get(model, {}).get(name, (math.nan, math.nan))
            records.append({
                "model": model, "group": "overall", "value": "all", "metric": name,
                "estimate": values[name], "ci_low": low, "ci_high": high, "n": int(values["n"]),
            })
    return pd.DataFrame.from_records(records, columns=list(BREAKDOWN_COLUMNS)) if records else _empty_breakdown()


def confusion(df: pd.DataFrame) -> pd.DataFrame:
    """Counts per model × expected × predicted (predicted = ANSWER or a canonical code)."""
    df = ensure_prepared(df)
    table = (
        df.groupby(["model", "expected", "decision"], sort=True, observed=True)
        .size()
        .reset_index(name="count")
        .rename(columns={"decision": "predicted"})
    )
    table["count"] = table["count"].astype(np.int64)
    return _plain_strings(table[["model", "expected", "predicted", "count"]], ["model", "expected", "predicted"])


def _plain_strings(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Output tables carry plain strings, not the prepared frame's categoricals."""
    return table.assign(**{c: table[c].astype(str) for c in columns})


def _intensity_order(values: Iterable[str]) -> list[str]:
    known = [i for i in INTENSITIES if i in set(values)]
    return known + sorted(set(values) - set(INTENSITIES))


def refusal_rate_by_intensity(df: pd.DataFrame) -> pd.DataFrame:
    """Refusal rate per model × intensity (LOW, MEDIUM, HIGH first): model, intensity, refusal_rate, n."""
    df = ensure_prepared(df)
    if "intensity" not in df.columns or df["intensity"].isna().all():
        return pd.DataFrame({"model": [], "intensity": [], "refusal_rate": [], "n": []})
    table = (
        df[df["intensity"].notna()]
        .groupby(["model", "intensity"], sort=True, observed=True)
        .agg(refusal_rate=("refused", "mean"), n=("refused", "size"))
        .reset_index()
    )
    table = _plain_strings(table, ["model", "intensity"])
    order = {v: i for i, v in enumerate(_intensity_order(table["intensity"]))}
    table = table.sort_values(["model", "intensity"], key=lambda s: s.map(order) if s.name == "intensity" else s)
    return table.reset_index(drop=True)


def class_intensity_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Share of correct responses per model × perturbation class × intensity (heatmap data)."""
    df = ensure_prepared(df)
    needed = ("perturbation_class", "intensity")
    if any(c not in df.columns or df[c].isna().all() for c in needed):
        return pd.DataFrame({"model": [], "perturbation_class": [], "intensity": [],
                             "correct_rate": [], "n": []})
    present = df[df["perturbation_class"].notna() & df["intensity"].notna()]
    return (
        present.groupby(["model", "perturbation_class", "intensity"], sort=True, observed=True)
        .agg(correct_rate=("correct", "mean"), n=("correct", "size"))
        .reset_index()
        .pipe(_plain_strings, ["model", "perturbation_class", "intensity"])
    )


def calibration_table(df: pd.DataFrame) -> pd.DataFrame:
    """Reliability-diagram data: model, scope (all|answer|refusal), bin, label, kind, n,
    mean_confidence, accuracy — only bins holding at least one response."""
    df = ensure_prepared(df)
    codes, models = _model_codes(df)
    stats = _stats(codes, len(models), _row_arrays(df))
    block = stats[:, _N_BASE:].reshape(len(models), 2, N_BINS, 3)
    scopes = {"all": block.sum(axis=1), "answer": block[:, 0], "refusal": block[:, 1]}
    records = []
    for scope, cells in scopes.items():
        for m, b in zip(*np.nonzero(cells[..., 0] > 0)):
            count, correct, confidence = cells[m, b]
            records.append({
                "model": models[m], "scope": scope, "bin": int(b), "label": bin_label(int(b)),
                "kind": "verbal" if b < N_VERBAL_BINS else "float", "n": int(count),
                "mean_confidence": confidence / count, "accuracy": correct / count,
            })
    columns = ["model", "scope", "bin", "label", "kind", "n", "mean_confidence", "accuracy"]
    table = pd.DataFrame.from_records(records, columns=columns)
    return table.sort_values(["model", "scope", "bin"], kind="stable").reset_index(drop=True)


CHAMPION_METRICS: tuple[str, ...] = ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy")


def domain_champions(df: pd.DataFrame, metrics: Sequence[str] = CHAMPION_METRICS) -> pd.DataFrame:
    """Best model per domain for each metric: domain, metric, model, estimate, n.

    Ties go to the alphabetically first model; a domain where every model's metric is
    NaN has no champion for it. Empty when there is no domain column.
    """
    table = breakdown(df, "domain")
    columns = ["domain", "metric", "model", "estimate", "n"]
    if table.empty:
        return pd.DataFrame({c: [] for c in columns})
    table = table[table["metric"].isin(list(metrics)) & table["estimate"].notna()]
    table = table.sort_values(["value", "metric", "estimate", "model"], ascending=[True, True, False, True])
    best = table.groupby(["value", "metric"], sort=True).head(1)
    return best.rename(columns={"value": "domain"})[columns].reset_index(drop=True)


# ----------------------------------------------------------------- the whole score

@dataclasses.dataclass
class ScoreResult:
    """Everything ``score`` produces; :func:`render_score_outputs` turns it into files."""

    metrics: dict[str, dict[str, float]]
    intervals: dict[str, dict[str, tuple[float, float]]]
    breakdown: pd.DataFrame
    confusion: pd.DataFrame
    calibration: pd.DataFrame
    class_intensity: pd.DataFrame
    refusal_by_intensity: pd.DataFrame
    champions: pd.DataFrame
    n_resamples: int
    seed: int
    generated_at: str

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        return {m: {c: int(v[c]) for c in COUNTS} for m, v in self.metrics.items()}

    @property
    def models(self) -> list[str]:
        return list(self.metrics)


def score_frame(df: pd.DataFrame, n_resamples: int = 1000, seed: int = 0,
                generated_at: str | None = None) -> ScoreResult:
    """Metrics, intervals, breakdowns (overall + each present dimension) and tables."""
    df = ensure_prepared(df)
    metrics = compute_metrics(df)
    intervals = bootstrap_intervals(df, n_resamples=n_resamples, seed=seed) if n_resamples > 0 else {}
    parts = [overall_rows(metrics, intervals)] + [breakdown(df, by) for by in BREAKDOWN_DIMENSIONS]
    parts = [p for p in parts if not p.empty]
    table = pd.concat(parts, ignore_index=True) if parts else _empty_breakdown()
    table["n"] = table["n"].astype(np.int64)
    return ScoreResult(
        metrics=metrics,
        intervals=intervals,
        breakdown=table,
        confusion=confusion(df),
        calibration=calibration_table(df),
        class_intensity=class_intensity_grid(df),
        refusal_by_intensity=refusal_rate_by_intensity(df),
        champions=domain_champions(df),
        n_resamples=n_resamples,
        seed=seed,
        generated_at=generated_at or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )


# ----------------------------------------------------------------- files

METRICS_FILE = "metrics.json"
TABLE_FILES: dict[str, str] = {
    "breakdown": "breakdown.parquet",
    "confusion": "confusion.parquet",
    "calibration": "calibration.parquet",
    "class_intensity": "class_intensity.parquet",
    "refusal_by_intensity": "refusal_by_intensity.parquet",
    "champions": "domain_champions.parquet",
}


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def metrics_document(result: ScoreResult) -> dict[str, Any]:
    """The metrics.json object (NaN as null)."""
    return {
        "models": {m: {k: _json_number(v) for k, v in values.items()} for m, values in result.metrics.items()},
        "intervals": {
            m: {k: [_json_number(lo), _json_number(hi)] for k, (lo, hi) in values.items()}
            for m, values in result.intervals.items()
        },
        "counts": result.counts,
        "bootstrap": {"n_resamples": result.n_resamples, "seed": result.seed, "level": 0.95,
                      "method": "percentile"},
        "undefined_as": "null",
        "generated_at": result.generated_at,
    }


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def render_score_outputs(result: ScoreResult) -> dict[str, bytes]:
    """File name -> content for metrics.json and the Parquet tables (store-agnostic)."""
    files = {METRICS_FILE: json.dumps(metrics_document(result), indent=2, allow_nan=False).encode("utf-8")}
    for attribute, name in TABLE_FILES.items():
        files[name] = _parquet_bytes(getattr(result, attribute))
    return files


def write_score(result: ScoreResult, out_dir: str | Path) -> list[Path]:
    """Write :func:`render_score_outputs` into a local folder; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in render_score_outputs(result).items():
        target = out / name
        target.write_bytes(content)
        written.append(target)
    return written


def _nan_number(value: Any) -> Any:
    return math.nan if value is None else value


def read_metrics_json(content: bytes | str) -> dict[str, Any]:
    """Parse metrics.json, turning null metric values and interval ends back into NaN."""
    document = json.loads(content)
    document["models"] = {
        m: {k: _nan_number(v) for k, v in values.items()} for m, values in document.get("models", {}).items()
    }
    document["intervals"] = {
        m: {k: (_nan_number(v[0]), _nan_number(v[1])) for k, v in values.items()}
        for m, values in document.get("intervals", {}).items()
    }
    return document


def load_score_outputs(files: Mapping[str, bytes]) -> ScoreResult:
    """Rebuild a ScoreResult from :func:`render_score_outputs`-style files (tables optional)."""
    if METRICS_FILE not in files:
        raise InputError(METRICS_FILE, "metrics.json is missing from the run folder")
    document = read_metrics_json(files[METRICS_FILE])
    tables = {}
    for attribute, name in TABLE_FILES.items():
        tables[attribute] = pd.read_parquet(io.BytesIO(files[name])) if name in files else pd.DataFrame()
    bootstrap = document.get("bootstrap", {})
    return ScoreResult(
        metrics=document["models"],
        intervals=document["intervals"],
        n_resamples=int(bootstrap.get("n_resamples", 0)),
        seed=int(bootstrap.get("seed", 0)),
        generated_at=str(document.get("generated_at", "")),
        **tables,
    )


def read_score(out_dir: str | Path) -> ScoreResult:
    """Load a local folder written by :func:`write_score`."""
    folder = Path(out_dir)
    names = [METRICS_FILE, *TABLE_FILES.values()]
    return load_score_outputs({n: (folder / n).read_bytes() for n in names if (folder / n).is_file()})
