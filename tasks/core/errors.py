"""Errors the CLI turns into one clean line: exit code 2 for bad input, 1 for a run that
finished without the result it was asked for."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(Exception):
    """Bad input: rendered as ``FILE:LINE: field: problem`` (line omitted when unknown)."""

    def __init__(self, file: str, problem: str, *, line: int | None = None, field: str | None = None):
        self.file = str(file)
        self.line = line
        self.field = field
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        field = self.field if self.field else "-"
        return f"{where}: {field}: {self.problem}"


class OptionError(InputError):
    """A bad command-line value: rendered as ``--option: problem``."""

    def __init__(self, option: str, problem: str):
        super().__init__(option, problem)

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"


class InputErrors(InputError):
    """Several input problems found in one pass; str() is the first, ``.errors`` holds all."""

    def __init__(self, errors: list[InputError]):
        if not errors:
            raise ValueError("InputErrors needs at least one error")
        self.errors = errors
        first = errors[0]
        super().__init__(first.file, first.problem, line=first.line, field=first.field)

    @staticmethod
    def of(errors: list[InputError]) -> InputError:
        """The one error itself, or several as InputErrors (``errors`` must not be empty)."""
        return errors[0] if len(errors) == 1 else InputErrors(errors)

    def lines(self) -> list[str]:
        return [str(e) for e in self.errors]


class ModelUnavailable(Exception):
    """A model a run names cannot be used (no key, endpoint down, weights absent)."""


class RunIncomplete(Exception):
    """A run that ended without the result asked for: an empty benchmark because model calls
    failed, or (``--strict``) a target scored on too few of its rows. One line, exit code 1."""


class BudgetExceeded(RunIncomplete):
    """A run stopped before the shard that would take its spend past ``budget_usd``: what was done is
    cached, and a re-run with a larger budget goes on from there. One line, exit code 1."""


def closest_names(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The ``choices`` closest to a mistyped ``word``, best first, at most ``n`` (none when nothing is
    close): what every "did you mean" in an input error offers, so they all agree on what is close."""
    return difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
