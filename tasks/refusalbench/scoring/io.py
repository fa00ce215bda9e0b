"""Files in and out of scoring: judged responses in; metrics.json and Parquet tables out.

:func:`read_judged` reads Parquet, JSONL or CSV and returns the prepared frame; errors name
the file line of the first bad record. :func:`render_score_outputs` turns a ScoreResult
into file name -> bytes (store-agnostic), :func:`load_score_outputs` reads them back.
NaN is written to metrics.json as ``null`` (valid JSON); :func:`read_metrics_json` maps
it back to NaN.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.textinput import open_bytes, open_text, text_lines
from refusalbench.tasks.refusalbench.basesets import MAX_LINE_BYTES
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.scoring.calibration import FROM_RESPONSES, MAX_CONFIDENCE
from refusalbench.tasks.refusalbench.scoring.clusters import UNIT_DESCRIPTION
from refusalbench.tasks.refusalbench.scoring.inputs import LineOf, prepare, row_line
from refusalbench.tasks.refusalbench.scoring.result import DEFAULT_MIN_COVERAGE, ScoreResult
from refusalbench.tasks.refusalbench.scoring.summary import OUTCOME_TREATMENT, distribution_by_model

# ----------------------------------------------------------------- reading judged responses


def _csv_line_of(path: Path) -> LineOf:
    """Row position -> first file line of that CSV record (records may span lines)."""
    cache: list[int] = []

    def line_of(position: int) -> int | None:
        if not cache:
            with open_text(path) as handle:
                reader = csv.reader(handle)
                previous_end = 1 if next(reader, None) is not None else 0
                for _ in reader:
                    cache.append(previous_end + 1)
                    previous_end = reader.line_num
        return cache[position] if position < len(cache) else None

    return line_of


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) per physical line; an oversized or non-UTF-8 line is an InputError.

    Lines are read with a size bound, so an enormous line is refused without being loaded.
    """
    with open_bytes(path) as handle:
        for number, text in text_lines(handle, str(path), MAX_LINE_BYTES):
            if isinstance(text, InputError):
                raise text
            yield number, text


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, list[int]]:
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    for number, line in _text_lines(path):
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

    Multi-document columns (``raf``, ``eligibility``, ``factuality``, ``variant``) are
    optional. Errors are InputError with the file line of the first bad record (Parquet:
    row number).
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
        line_of: LineOf = row_line
    elif suffix in (".jsonl", ".ndjson", ".json"):
        df, lines = _read_jsonl(path)
        line_of = lambda position: lines[position] if position < len(lines) else None  # noqa: E731
    elif suffix == ".csv":
        for _ in _text_lines(path):  # bad bytes and enormous lines, named by line, before pandas reads it
            pass
        try:
            df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
        except pd.errors.ParserError as exc:
            raise InputError(str(path), f"not a readable CSV file: {exc}") from None
        line_of = _csv_line_of(path)
    else:
        raise InputError(str(path), f"unsupported file type {suffix or '(none)'}: use .parquet, .jsonl or .csv")
    if df.empty:
        raise InputError(str(path), "no judged responses in file")
    return prepare(df, source=str(path), line_of=line_of)


# ----------------------------------------------------------------- score files

# The file names are declared once, in the run-folder contract; these map a ScoreResult onto them.
METRICS_FILE = rb_files.METRICS.name
TABLE_FILES: dict[str, str] = {  # ScoreResult attribute -> Parquet file
    "breakdown": rb_files.BREAKDOWN.name,
    "confusion": rb_files.CONFUSION.name,
    "calibration": rb_files.CALIBRATION.name,
    "class_intensity": rb_files.CLASS_INTENSITY.name,
    "refusal_by_intensity": rb_files.REFUSAL_BY_INTENSITY.name,
    "champions": rb_files.DOMAIN_CHAMPIONS.name,
    "response_distribution": rb_files.RESPONSE_DISTRIBUTION.name,
}
STANDARD_ERROR_METHOD = "bootstrap standard deviation (ddof 1) of the same resamples (paper App. G)"
BREAKDOWN_INTERVAL_METHOD = (
    "Wilson score for proportions (on rows / design effect where a base item holds "
    "several rows of the group); percentile bootstrap of the group's base items for "
    "F1, hierarchical score, CRS and ECE"
)
IID_METHOD = (
    "intervals_iid, standard_errors_iid: each model's rows resampled as if independent (too narrow when "
    "items share a base item); kept beside the cluster figures for comparison"
)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _json_tree(value: Any) -> Any:
    """``value`` with every NaN inside it (dicts, lists) as None."""
    if isinstance(value, dict):
        return {k: _json_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_tree(v) for v in value]
    return _json_number(value)


def _nan_tree(value: Any) -> Any:
    """The inverse of :func:`_json_tree` for numbers: None back to NaN (booleans and text kept)."""
    if isinstance(value, dict):
        return {k: _nan_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_tree(v) for v in value]
    return math.nan if value is None else value


def _interval_table(intervals: Mapping[str, Mapping[str, tuple[float, float]]]) -> dict[str, dict[str, list[Any]]]:
    return {
        m: {k: [_json_number(lo), _json_number(hi)] for k, (lo, hi) in values.items()}
        for m, values in intervals.items()
    }


def metrics_document(result: ScoreResult) -> dict[str, Any]:
    """The metrics.json object (NaN as null)."""

    def numbers(table: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        return {m: {k: _json_number(v) for k, v in values.items()} for m, values in table.items()}

    correlation = result.frr_mrr_correlation
    return {
        "models": numbers(result.metrics),
        # Base items resampled (clusters); the *_iid figures beside them resample rows as if independent.
        "intervals": _interval_table(result.intervals),
        "standard_errors": numbers(result.standard_errors),
        "intervals_iid": _interval_table(result.intervals_iid),
        "standard_errors_iid": numbers(result.standard_errors_iid),
        "pairwise": _json_tree(result.pairwise) if result.pairwise else None,
        "counts": result.counts,
        "response_distribution": numbers(distribution_by_model(result.response_distribution))
        if not result.response_distribution.empty
        else {},
        "frr_mrr_correlation": {k: _json_number(v) for k, v in correlation.items()} if correlation else None,
        "multi_document": result.multi_document,
        # Where ECE came from (the calibration pass or the rows' own confidences) and App. F.2's
        # share of predictions at maximum confidence with their accuracy.
        "calibration": {
            "source": result.calibration_source,
            "max_confidence": MAX_CONFIDENCE,
            "models": numbers(result.max_confidence),
        },
        # Rows without a usable response or whose call failed: counted per model, and how each was treated.
        "outcomes": result.outcomes,
        "outcome_treatment": OUTCOME_TREATMENT,
        "coverage": {
            "min_coverage": result.min_coverage,
            "incomplete": {m: _json_number(v) for m, v in result.incomplete.items()},
            "no_scored_rows": result.unscorable,
        },
        "bootstrap": {
            "n_resamples": result.n_resamples,
            "seed": result.seed,
            "level": 0.95,
            "method": "percentile",
            "standard_error": STANDARD_ERROR_METHOD,
            "breakdown_intervals": BREAKDOWN_INTERVAL_METHOD,
            "unit": UNIT_DESCRIPTION,
            "iid": IID_METHOD,
        },
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
    document: dict[str, Any] = json.loads(content)
    document["models"] = {
        m: {k: _nan_number(v) for k, v in values.items()} for m, values in document.get("models", {}).items()
    }
    document["intervals"] = {
        m: {k: (_nan_number(v[0]), _nan_number(v[1])) for k, v in values.items()}
        for m, values in document.get("intervals", {}).items()
    }
    document["intervals_iid"] = {
        m: {k: (_nan_number(v[0]), _nan_number(v[1])) for k, v in values.items()}
        for m, values in (document.get("intervals_iid") or {}).items()
    }
    if document.get("pairwise"):
        document["pairwise"] = _nan_tree(document["pairwise"])
    for key in ("standard_errors", "standard_errors_iid", "response_distribution"):
        document[key] = {
            m: {k: _nan_number(v) for k, v in values.items()} for m, values in (document.get(key) or {}).items()
        }
    correlation = document.get("frr_mrr_correlation")
    if correlation:
        document["frr_mrr_correlation"] = {k: _nan_number(v) for k, v in correlation.items()}
    return document


def load_score_outputs(files: Mapping[str, bytes]) -> ScoreResult:
    """Rebuild a ScoreResult from :func:`render_score_outputs`-style files (tables optional)."""
    if METRICS_FILE not in files:
        raise InputError(METRICS_FILE, f"{METRICS_FILE} is missing from the run folder")
    document = read_metrics_json(files[METRICS_FILE])
    tables = {}
    for attribute, name in TABLE_FILES.items():
        tables[attribute] = pd.read_parquet(io.BytesIO(files[name])) if name in files else pd.DataFrame()
    bootstrap = document.get("bootstrap", {})
    return ScoreResult(
        metrics=document["models"],
        intervals=document["intervals"],
        standard_errors=document["standard_errors"],
        intervals_iid=document["intervals_iid"],
        standard_errors_iid=document["standard_errors_iid"],
        pairwise=document.get("pairwise") or {},
        frr_mrr_correlation=document.get("frr_mrr_correlation") or {},
        multi_document=document.get("multi_document") or {},
        calibration_source=str((document.get("calibration") or {}).get("source", FROM_RESPONSES)),
        max_confidence={
            m: {k: math.nan if v is None else v for k, v in values.items()}
            for m, values in ((document.get("calibration") or {}).get("models") or {}).items()
        },
        outcomes=document.get("outcomes") or {},
        min_coverage=float((document.get("coverage") or {}).get("min_coverage", DEFAULT_MIN_COVERAGE)),
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
