"""Checks of a config's ``generation:`` names against RefusalBench's taxonomy, run by ``load_config``.

A stratum spelled wrong is reported with the config's other problems, at its line and with the
closest strata, before a flow starts. Importing this package (``tasks.refusalbench``) registers it.
"""

from __future__ import annotations

from refusalbench.tasks.core.config import CONFIG_CHECKS, RunConfig
from refusalbench.tasks.refusalbench.taxonomy import UnknownName, parse_stratum


def _stratum_problem(spec: str) -> str | None:
    """Why ``spec`` is not a stratum, as the assign stage reads strata (any case, with or without ``P-``)."""
    try:
        parse_stratum(spec)
    except UnknownName as exc:
        return str(exc)
    return None


@CONFIG_CHECKS.register("generation.strata")
def check_strata(config: RunConfig) -> list[tuple[str, str]] | None:
    """Every entry of ``generation.strata`` is CLASS/INTENSITY of the taxonomy: one problem per entry that
    is not, at its line, with the closest names and the valid ones."""
    if config.generation is None or not config.generation.strata:
        return None
    problems = [(f"generation.strata.{i}", _stratum_problem(spec)) for i, spec in enumerate(config.generation.strata)]
    return [(key, problem) for key, problem in problems if problem] or None
