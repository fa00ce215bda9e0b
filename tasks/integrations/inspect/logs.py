"""inspect_ai eval logs -> the judged-responses frame that ``refusalbench score`` scores.

The refusalbench inspect task (``tasks/integrations/inspect/task.py``) leaves each sample's whole
:class:`Judgment` in its Score's metadata under ``SCORE_KEY`` and the benchmark item in the
sample's metadata under ``ITEM_KEY`` (``sample_metadata``). :func:`read_inspect_logs` reads
them back (inspect's ``read_eval_log``) and builds the frame with ``outputs.judged_frame``, as
``evaluate`` builds judged.parquet. A sample that failed (its target call, after inspect's
retries) is counted and left out, like a failed call in ``evaluate``. :func:`score_inspect_logs`
is ``refusalbench score LOG...``: the frame scored, with its report.

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
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.integrations.inspect.sample_metadata import SCORE_KEY, item_of
from refusalbench.tasks.refusalbench.report.run_outputs import judged_frame, write_report, write_scores
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment

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
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file() and p.suffix.lower() in (".eval", ".json") and is_inspect_log(p)
            )
            if not found:
                raise InputError(str(path), "no inspect eval logs (.eval or .json) in this folder")
            files.extend(found)
        elif not path.is_file():
            raise InputError(str(path), "file not found")
        else:
            files.append(path)
    return files


def _read_log(path: Path) -> Any:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise InputError(str(path), INSTALL_HINT) from None
    try:
        return read_eval_log(str(path))
    except Exception as exc:  # not a zip, truncated JSON, a schema it does not know ...
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise InputError(
            str(path), f"not a readable inspect eval log ({type(exc).__name__}{': ' + detail if detail else ''})"
        ) from None


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
        raise InputError(
            str(path),
            f"{where} has no RefusalBench item in its metadata (was the log written by the refusalbench task?)",
            field="metadata",
        ) from None
    payload = _payload(sample)
    if payload is None:
        if sample.error is None:
            raise InputError(
                str(path),
                f"{where} has no RefusalBench score (was the log scored by the refusalbench scorer?)",
                field="scores",
            )
        # The bridge loads the prompt and judge modules: only a failed sample needs them.
        from refusalbench.tasks.integrations.inspect.bridge import judgment_of, response_of

        message = str(getattr(sample.error, "message", sample.error)).splitlines()[0][:300]
        return judgment_of(item, response_of(item, str(log.eval.model), None, False, error=message)), item
    try:
        return Judgment.model_validate(payload["judgment"]), item
    except (KeyError, TypeError, ValidationError):
        raise InputError(str(path), f"{where}: its RefusalBench score is not a judgment", field="scores") from None


def read_inspect_logs(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, dict[str, int], list[BenchmarkItem]]:
    """Judged-responses frame (as ``evaluate`` writes judged.parquet), per-model counts left out, items."""
    judgments: list[Judgment] = []
    items: dict[str, BenchmarkItem] = {}
    for path in log_files(paths):
        log = _read_log(path)
        samples = log.samples or []
        if not samples:
            raise InputError(str(path), f"no samples in this log (status: {log.status})")
        for sample in samples:
            if sample.epoch != 1:
                raise InputError(
                    str(path), "RefusalBench scores one reply per (model, item): run with --epochs 1", field="epochs"
                )
            judgment, item = _sample_judgment(path, log, sample)
            judgments.append(judgment)
            items.setdefault(item.item_id, item)
    frame, excluded = judged_frame(judgments, items.values())
    return frame, excluded, list(items.values())


def score_inspect_logs(
    files: Iterable[Path | str], out: str, *, bootstrap: int = 1000, seed: int = 0
) -> tuple[str, str, dict[str, int]]:
    """``refusalbench score LOG...``: an inspect_ai run's logs -> judged.parquet, metrics and report.html.

    Returns (metrics uri, report uri, per-model counts of samples left out: failed calls or judgments).
    """
    files = list(files)
    frame, excluded, items = read_inspect_logs(files)  # bad input exits before the run folder is created
    if frame.empty:
        raise InputError(str(files[0]), "no sample could be scored (every target or judge call failed)")
    store = ArtifactStore(out)
    store.save(rb_files.JUDGED, frame)
    result = write_scores(store, frame, bootstrap=bootstrap, seed=seed)
    report = write_report(store, result, title="RefusalBench report (inspect_ai run)")
    return store.uri(rb_files.METRICS.name), report, excluded
