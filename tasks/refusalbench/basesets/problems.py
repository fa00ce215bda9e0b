"""The base-set format's field names and limits, and the problems found in one file.

Every problem is collected (not just the first) as an ``InputError`` that prints as
``FILE:LINE: field: problem``; collection stops at ``MAX_PROBLEMS`` so a huge broken file fails fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.errors import InputError, InputErrors

MAX_LINE_BYTES = 10 * 1024 * 1024
MAX_PROBLEMS = 1000

BASE_FIELDS = ("id", "question", "answers", "context", "passages", "domain")
REQUIRED_FIELDS = ("id", "question", "answers")
PASSAGE_FIELDS = ("text", "relevant")


class TooManyProblems(Exception):
    """Raised internally once the problem cap is reached: stop reading a hopeless file."""


class Problems:
    """Collects the problems of one file, in reading order, up to a cap."""

    def __init__(self, file: str, cap: int = MAX_PROBLEMS):
        self.file = file
        self.cap = cap
        self.errors: list[InputError] = []

    def add(self, problem: str, *, line: int | None = None, field: str | None = None) -> None:
        self.errors.append(InputError(self.file, problem, line=line, field=field))
        if len(self.errors) >= self.cap:
            raise TooManyProblems

    def __len__(self) -> int:
        return len(self.errors)

    def raise_if_any(self) -> None:
        if self.errors:
            raise InputErrors(self.errors)


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages users of any format can read."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class Skip:
    """Marks a field whose problem was already reported while decoding it."""


SKIP = Skip()


def open_problems(path: str | os.PathLike[str]) -> tuple[Path, Problems]:
    """Common file checks; raises InputErrors when the file cannot be read at all."""
    file = str(path)
    p = Path(path)
    problems = Problems(file)
    if not p.exists():
        problems.add("file not found")
    elif not p.is_file():
        problems.add("not a regular file")
    elif p.stat().st_size == 0:
        problems.add("empty file: no records")
    problems.raise_if_any()
    return p, problems
