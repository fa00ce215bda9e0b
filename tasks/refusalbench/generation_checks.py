"""Checks of a config's ``generation:`` names against RefusalBench's taxonomy, run by ``load_config``.

A stratum spelled wrong is reported with the config's other problems, at its line and with the
closest strata, before a flow starts. Importing this package (``tasks.refusalbench``) registers it.
"""

from __future__ import annotations

from refusalbench.tasks.core.config import CONFIG_CHECKS, RunConfig
from refusalbench.tasks.core.config_problems import did_you_mean
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, STRATA


def _spelled(spec: str) -> str:
    """CLASS/INTENSITY as ``stages.assign.parse_strata`` reads it: blanks around either part ignored."""
    cls, sep, intensity = spec.partition("/")
    return f"{cls.strip()}/{intensity.strip()}" if sep else spec


@CONFIG_CHECKS.register("generation.strata")
def check_strata(config: RunConfig) -> list[tuple[str, str]] | None:
    """Every entry of ``generation.strata`` is CLASS/INTENSITY of the taxonomy (case aside): one problem
    per entry that is not, at its line, with the closest stratum."""
    if config.generation is None or not config.generation.strata:
        return None
    known = {f"{c}/{i}".casefold() for c, i in STRATA}
    choices = [f"{c}/{i}" for c, i in STRATA]
    rule = f"CLASS/INTENSITY with CLASS one of {', '.join(PERTURBATION_CLASSES)} and INTENSITY one of {', '.join(INTENSITIES)}"
    return [
        (
            f"generation.strata.{i}",
            f"unknown stratum {spec!r}" + (did_you_mean(spec, choices, n=1) or f": expected {rule}"),
        )
        for i, spec in enumerate(config.generation.strata)
        if _spelled(spec).casefold() not in known
    ] or None
