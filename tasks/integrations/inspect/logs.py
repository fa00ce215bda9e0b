"""inspect_ai eval logs -> the judged-responses frame that ``refusalbench score`` scores.

The refusalbench inspect task (``tasks/integrations/inspect/task.py``) leaves each sample's whole
:class:`Judgment` in its Score's metadata under :data:`SCORE_KEY` and the benchmark item in
the sample's metadata under :data:`ITEM_KEY`. :func:`read_inspect_logs` reads them back
(inspect's ``read_eval_log``) and builds the frame with ``outputs.judged_frame``, as
``evaluate`` builds judged.parquet. A sample that failed (its target call, after inspect's
retries) is counted and left out, like a failed call in ``evaluate``.

Light on purpose: ``refusalbench score`` asks :func:`is_inspect_log` about every input, and
``inspect_ai`` (and the prompt and judge modules) are only imported when a log is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.records import BenchmarkItem, Judgment

SCORE_KEY = "refusalbench"  # Score.metadata[SCORE_KEY] = {"judgment": ..., "variant": ..., "response_error": ...}
ITEM_KEY = "item"  # Sample.metadata[ITEM_KEY] = the BenchmarkItem
INSTALL_HINT = "reading inspect eval logs needs inspect_ai: pip install 'refusalbench[inspect]'"
# An inspect JSON log is an EvalLog dumped field by field: it opens with "version", then "status".
_JSON_LOG_HEAD = re.compile(rb'^\s*\{\s*"version"\s*:\s*\d+\s*,\s*"status"\s*:')


def is_inspect_log(path: str | Path) -> bool:
    """An ``.eval`` file, a folder (of logs), or a ``.json`` file that opens like an inspect JSON log."""
    path = Path(path)
    if path.is_dir() or path.suffix.lower() == ".eval":
        return True
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    with path.open("rb") as handle:
        return bool(_JSON_LOG_HEAD.match(handle.read(512)))


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """The log files named, a folder standing for the inspect logs directly inside it."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in (".eval", ".json")
                           and is_inspect_log(p))
            if not found:
                raise InputError(str(path), "no inspect eval logs (.eval or .json) in this folder")
            files.extend(found)
        elif not path.is_file():
            raise InputError(str(path), "file not found")
        else:
            files.append(path)
    return files


def item_of(metadata: dict[str, Any] | None) -> BenchmarkItem:
    return BenchmarkItem.model_validate((metadata or {})[ITEM_KEY])


def _read_log(path: Path) -> Any:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise InputError(str(path), INSTALL_HINT) from None
    try:
        return read_eval_log(str(path))
    except Exception as exc:  # not a zip, truncated JSON, a schema it does not know ...
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise InputError(str(path), f"not a readable inspect eval log ({type(exc).__name__}"
                                    f"{': ' + detail if detail else ''})") from None


def _payload(sample: Any) -> dict[str, Any] | None:
    for score in (sample.scores or {}).values():
        payload = (score.metadata or {}).get(SCORE_KEY)
        if isinstance(payload, dict):
            return payload
    return None


def _sample_judgment(path: Path, log: Any, sample: Any) -> tuple[Judgment, BenchmarkItem]:
    where = f"sample {sample.id!r}"
    try:
        item = item_of(sample.metadata)
    except (KeyError, TypeError, ValidationError):
        raise InputError(str(path), f"{where} has no RefusalBench item in its metadata "
                                    "(was the log written by the refusalbench task?)", field="metadata") from None
    payload = _payload(sample)
    if payload is None:
        if sample.error is None:
            raise InputError(str(path), f"{where} has no RefusalBench score (was the log scored by the "
                                        "refusalbench scorer?)", field="scores")
        from refusalbench.tasks.integrations.inspect.bridge import judgment_of, response_of

        message = str(getattr(sample.error, "message", sample.error)).splitlines()[0][:300]
        return judgment_of(item, response_of(item, str(log.eval.model), None, False, error=message)), item
    try:
        return Judgment.model_validate(payload["judgment"]), item
    except (KeyError, TypeError, ValidationError):
        raise InputError(str(path), f"{where}: its RefusalBench score is not a judgment", field="scores") from None


def read_inspect_logs(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, dict[str, int], list[BenchmarkItem]]:
    """Judged-responses frame (as ``evaluate`` writes judged.parquet), per-model counts left out, items."""
    from refusalbench.tasks.refusalbench.outputs import judged_frame  # outputs imports this module lazily

    judgments: list[Judgment] = []
    items: dict[str, BenchmarkItem] = {}
    for path in log_files(paths):
        log = _read_log(path)
        samples = log.samples or []
        if not samples:
            raise InputError(str(path), f"no samples in this log (status: {log.status})")
        for sample in samples:
            if sample.epoch != 1:
                raise InputError(str(path), "RefusalBench scores one reply per (model, item): run with --epochs 1",
                                 field="epochs")
            judgment, item = _sample_judgment(path, log, sample)
            judgments.append(judgment)
            items.setdefault(item.item_id, item)
    frame, excluded = judged_frame(judgments, items.values())
    return frame, excluded, list(items.values())
