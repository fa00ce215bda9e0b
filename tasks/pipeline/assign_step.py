"""Stage: assign. Read and check the generation inputs, then record the draw.

Everything the generation flow needs is read and checked before any artifact is written
(bad input exits 2 with nothing left behind); the drawn base items and the lever
assignment are then the run's first artifacts.

The draw: ``base_sample`` items by seed from the pool, then the levers for each. The pool is
the whole base set, or, with ``generation.pretest``, the items the pre-test kept
(:meth:`GenerationInputs.drawn_from`): the paper draws its 100 items from those that passed.
A refresh round's assignment avoids the (base item, lever) pairs earlier rounds assigned while
the pool allows (``avoid``); when it must repeat some, the run's log and manifest say so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import cached_property

from refusalbench.tasks.refusalbench import artifacts as rb_files
from refusalbench.tasks.refusalbench.assign import configured_strata, draw_assignments
from refusalbench.tasks.refusalbench.basesets import load_base_set
from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.refusalbench.levers import Stratum, catalogue_hash, load_catalogue
from refusalbench.tasks.llm.prompting import all_template_hashes
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.refusalbench.records import Assignment, BaseItem, Lever
from refusalbench.tasks.pipeline.ui import publish_table, story


@dataclass
class GenerationInputs:
    """The checked inputs of one generation run."""

    seed: int
    items: list[BaseItem]  # the drawn base items
    levers: list[Lever]
    assignments: list[Assignment]
    strata: list[Stratum] | None
    base_set: list[BaseItem]  # every item of the base set as read: what the pre-test sees
    base_sample: int | None = None
    levers_per_stratum: int = 1
    avoid: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # earlier rounds' (base item, lever) pairs

    @cached_property
    def items_by_id(self) -> dict[str, BaseItem]:
        return {item.id: item for item in self.items}

    @cached_property
    def hashes(self) -> dict[str, object]:
        """Catalogue and template hashes: part of every generation task's content digest."""
        return {"catalogue": catalogue_hash(self.levers), "prompts": all_template_hashes()}

    def drawn_from(self, pool: list[BaseItem]) -> "GenerationInputs":
        """The same inputs with the items drawn from ``pool`` (e.g. what the pre-test kept) instead."""
        items, assignments = draw_assignments(pool, self.levers, self.strata, self.base_sample, self.levers_per_stratum,
                                              self.seed, self.avoid)
        return replace(self, items=items, assignments=assignments)


def prepare_inputs(cfg: RunConfig, seed: int, avoid: frozenset[tuple[str, str]] = frozenset()) -> GenerationInputs:
    """Read and check everything the flow needs before any artifact is written (``avoid``: earlier
    rounds' (base item, lever) pairs, assigned again only when the pool is exhausted)."""
    gen = cfg.generation
    if gen is None:
        raise InputError(str(cfg.source), "the config has no generation section", field="generation")
    if gen.verification == "short_circuit" and gen.filter != "unanimous":
        raise InputError(str(cfg.source), "verification: short_circuit needs filter: unanimous", field="generation.verification")
    base_set = load_base_set(cfg.resolve_path(gen.base_set))
    levers = load_catalogue()
    strata = configured_strata(cfg)
    # Drawn from the whole base set now, so every check runs before a call; a pre-test redraws
    # from what it kept (drawn_from), with the same seed and settings.
    items, assignments = draw_assignments(base_set, levers, strata, gen.base_sample, gen.levers_per_stratum, seed,
                                          avoid)
    return GenerationInputs(seed, items, levers, assignments, strata, base_set, gen.base_sample, gen.levers_per_stratum,
                            avoid)


def base_set_funnel(inputs: GenerationInputs, pretest: dict[str, int] | None = None) -> dict[str, int]:
    """imported -> (pretested -> kept ->) sampled: how many base items reached each step."""
    return {"imported": len(inputs.base_set), **(pretest or {}), "sampled": len(inputs.items)}


def record_funnel(recorder: ManifestRecorder, funnel: dict[str, int]) -> None:
    recorder.count(base_set_funnel=funnel)
    publish_table("base-set-funnel", [funnel], " -> ".join(funnel))


def record_inputs(recorder: ManifestRecorder, inputs: GenerationInputs, pretest: dict[str, int] | None = None) -> None:
    """The hashes into the manifest; base items and assignments into the run folder.

    ``pretest``: the pre-test's part of the base-set funnel, when one ran.
    """
    recorder.hashes(catalogue=inputs.hashes["catalogue"], prompts=inputs.hashes["prompts"])
    with recorder.stage("assign"):
        recorder.store.save(rb_files.BASE_ITEMS, inputs.items)
        recorder.store.save(rb_files.ASSIGNMENTS, inputs.assignments)
        recorder.count(base_items=len(inputs.items), assignments=len(inputs.assignments))
        record_funnel(recorder, base_set_funnel(inputs, pretest))
        if inputs.avoid:
            record_repeats(recorder, inputs)


def record_repeats(recorder: ManifestRecorder, inputs: GenerationInputs) -> None:
    """How many of the round's pairs earlier rounds assigned: none unless the pool ran out."""
    repeated = sum((a.base_id, a.lever_id) in inputs.avoid for a in inputs.assignments)
    recorder.count(pairs_repeated=repeated, pool_exhausted=repeated > 0)
    if repeated:
        story("assign: the pool of (base item, lever) pairs is exhausted: %d of %d pairs repeat earlier rounds "
              "(a larger base set gives fresh ones)", repeated, len(inputs.assignments),
              level=logging.WARNING, terminal=True)
    else:
        story("assign: all %d (base item, lever) pairs are new (%d assigned in earlier rounds avoided)",
              len(inputs.assignments), len(inputs.avoid))
