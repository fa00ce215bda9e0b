"""Checks of a config's ``knowornot:`` names against KnowOrNot's registries, run by ``load_config``.

The registries live beside their strategies, which import numpy and FAISS: they are
imported only when a config has a knowornot section, so reading any other config stays
light. Importing this package (``tasks.knowornot``) registers the checks.
"""

from __future__ import annotations

import re

from refusalbench.tasks.core.config import CONFIG_CHECKS, RunConfig


@CONFIG_CHECKS.register("knowornot.retrieval")
def check_retrieval_strategies(config: RunConfig) -> tuple[str, str] | None:
    """Every strategy in ``knowornot.retrieval`` is registered."""
    if config.knowornot is None:
        return None
    from refusalbench.tasks.knowornot.stages.retrieval import RETRIEVERS

    unknown = RETRIEVERS.unknown(config.knowornot.retrieval)
    return ("knowornot.retrieval", RETRIEVERS.unknown_message(unknown)) if unknown else None


@CONFIG_CHECKS.register("knowornot.embedder")
def check_embedder(config: RunConfig) -> tuple[str, str] | None:
    """``knowornot.embedder`` is registered."""
    if config.knowornot is None:
        return None
    from refusalbench.tasks.knowornot.stages.embeddings import EMBEDDERS

    name = config.knowornot.embedder
    return None if name in EMBEDDERS else ("knowornot.embedder", EMBEDDERS.unknown_message([name]))


@CONFIG_CHECKS.register("knowornot.evaluations")
def check_spec_names(config: RunConfig) -> tuple[str, str] | None:
    """The config's own specs have new, simple names.

    A spec's name becomes a results column and a file name (labels/<name>.jsonl).
    """
    if config.knowornot is None:
        return None
    from refusalbench.tasks.knowornot.stages.evaluation import EVAL_SPECS, RESERVED_SPEC_NAMES

    seen: set[str] = set()
    for spec in config.knowornot.evaluations:
        problem = None
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", spec.name):
            problem = f"spec name {spec.name!r} must be a simple name (letters, digits, _ or -)"
        elif spec.name in EVAL_SPECS:
            problem = (
                f"spec name {spec.name!r} is already a registered evaluation spec "
                f"({', '.join(EVAL_SPECS)}): choose another"
            )
        elif spec.name in RESERVED_SPEC_NAMES:
            problem = f"spec name {spec.name!r} is a column of the results table: choose another"
        elif spec.name in seen:
            problem = f"spec name {spec.name!r} is given twice"
        if problem:
            return "knowornot.evaluations", problem
        seen.add(spec.name)
    return None
