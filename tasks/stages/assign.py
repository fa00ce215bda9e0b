"""Stage: assign. Read and check the generation inputs, then record the draw.

Everything the generation flow needs is read and checked before any artifact is written
(bad input exits 2 with nothing left behind); the drawn base items and the lever
assignment are then the run's first artifacts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from refusalbench.tasks import runfolder
from refusalbench.tasks.assign import Stratum, assign_levers, parse_strata, sample_base_items
from refusalbench.tasks.basesets import load_base_set
from refusalbench.tasks.config import RunConfig
from refusalbench.tasks.errors import InputError
from refusalbench.tasks.levers import catalogue_hash, load_catalogue
from refusalbench.tasks.prompting import all_template_hashes
from refusalbench.tasks.provenance import ManifestRecorder
from refusalbench.tasks.records import Assignment, BaseItem, Lever


@dataclass
class GenerationInputs:
    """The checked inputs of one generation run."""

    seed: int
    items: list[BaseItem]
    levers: list[Lever]
    assignments: list[Assignment]
    strata: list[Stratum] | None

    @cached_property
    def items_by_id(self) -> dict[str, BaseItem]:
        return {item.id: item for item in self.items}

    @cached_property
    def hashes(self) -> dict[str, object]:
        """Catalogue and template hashes: part of every generation task's content digest."""
        return {"catalogue": catalogue_hash(self.levers), "prompts": all_template_hashes()}


def prepare_inputs(cfg: RunConfig, seed: int) -> GenerationInputs:
    """Read and check everything the flow needs before any artifact is written."""
    gen = cfg.generation
    if gen is None:
        raise InputError(str(cfg.source), "the config has no generation section", field="generation")
    if gen.verification == "short_circuit" and gen.filter != "unanimous":
        raise InputError(str(cfg.source), "verification: short_circuit needs filter: unanimous", field="generation.verification")
    items = sample_base_items(load_base_set(cfg.resolve_path(gen.base_set)), gen.base_sample, seed)
    levers = load_catalogue()
    try:
        strata = parse_strata(gen.strata) if gen.strata else None
    except ValueError as exc:
        raise InputError(str(cfg.source), str(exc), field="generation.strata") from None
    assignments = assign_levers(items, levers, seed=seed, levers_per_stratum=gen.levers_per_stratum, strata=strata)
    return GenerationInputs(seed, items, levers, assignments, strata)


def record_inputs(recorder: ManifestRecorder, inputs: GenerationInputs) -> None:
    """The hashes into the manifest; base items and assignments into the run folder."""
    recorder.hashes(catalogue=inputs.hashes["catalogue"], prompts=inputs.hashes["prompts"])
    with recorder.stage("assign"):
        recorder.store.save(runfolder.BASE_ITEMS, inputs.items)
        recorder.store.save(runfolder.ASSIGNMENTS, inputs.assignments)
        recorder.count(base_items=len(inputs.items), assignments=len(inputs.assignments))
