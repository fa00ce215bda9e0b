"""Stage: assign. Read and check the generation inputs, then record the draw.

Everything the generation flow needs is read and checked before any artifact is written
(bad input exits 2 with nothing left behind); the drawn base items and the lever
assignment are then the run's first artifacts.

The draw: ``base_sample`` items by seed from the pool, then the levers for each. The pool is
the whole base set, or, with ``generation.pretest``, the items the pre-test kept
(:meth:`GenerationInputs.drawn_from`): the paper draws its 100 items from those that passed.
With ``generation.base_sample_by: domain`` the draw gives each domain an equal share (GaRAGe's
20 per domain, App. C.1); a domain with fewer items left than its share is reported in the
manifest (``base_sample_by_domain``, ``base_sample_shortfall``), the UI and the report.
A refresh round's assignment avoids the (base item, lever) pairs earlier rounds assigned while
the pool allows (``avoid``); when it must repeat some, the run's log and manifest say so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TypedDict

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.provenance import ManifestRecorder
from refusalbench.tasks.llm.prompting import all_template_hashes
from refusalbench.tasks.pipeline.ui import publish_table, story
from refusalbench.tasks.refusalbench.basesets import load_configured_base_set
from refusalbench.tasks.refusalbench.levers import Stratum, catalogue_hash, load_catalogue
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, Lever
from refusalbench.tasks.refusalbench.stages.assign import configured_strata, draw_assignments
from refusalbench.tasks.refusalbench.stages.base_sampling import domain_draw, shortfalls, without_domain


class InputHashes(TypedDict):
    """What the generation's tasks are made from besides their rows: the lever catalogue and the templates."""

    catalogue: str
    prompts: dict[str, str]


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
    base_sample_by: str | None = None  # "domain": equal counts per domain of the base set
    pool: list[BaseItem] | None = None  # what the items were drawn from (None: the base set)

    @cached_property
    def items_by_id(self) -> dict[str, BaseItem]:
        return {item.id: item for item in self.items}

    @cached_property
    def hashes(self) -> InputHashes:
        """Catalogue and template hashes: part of every generation task's content digest."""
        return {"catalogue": catalogue_hash(self.levers), "prompts": all_template_hashes()}

    @property
    def domains(self) -> list[str] | None:
        """The base set's domains, which a draw by domain balances over (None: not drawn by domain)."""
        return sorted({item.domain for item in self.base_set if item.domain}) if self.base_sample_by else None

    def domain_draw(self) -> dict[str, dict[str, int]] | None:
        """Per domain: share, available, sampled, shortfall (None: not drawn by domain)."""
        if self.base_sample_by != "domain":
            return None
        pool = self.base_set if self.pool is None else self.pool  # a pre-test may have kept nothing
        return domain_draw(pool, self.items, self.base_sample, self.seed, self.domains)

    def drawn_from(self, pool: list[BaseItem]) -> GenerationInputs:
        """The same inputs with the items drawn from ``pool`` (e.g. what the pre-test kept) instead."""
        items, assignments = draw_assignments(
            pool,
            self.levers,
            self.strata,
            self.base_sample,
            self.levers_per_stratum,
            self.seed,
            self.avoid,
            self.base_sample_by,
            self.domains,
        )
        return replace(self, items=items, assignments=assignments, pool=pool)


def prepare_inputs(cfg: RunConfig, seed: int, avoid: frozenset[tuple[str, str]] = frozenset()) -> GenerationInputs:
    """Read and check everything the flow needs before any artifact is written (``avoid``: earlier
    rounds' (base item, lever) pairs, assigned again only when the pool is exhausted)."""
    gen = cfg.generation_section()
    if gen.verification == "short_circuit" and gen.filter != "unanimous":
        raise InputError(
            str(cfg.source), "verification: short_circuit needs filter: unanimous", field="generation.verification"
        )
    base_set = load_configured_base_set(cfg)
    levers = load_catalogue()
    strata = configured_strata(cfg)
    if gen.base_sample_by == "domain" and (missing := without_domain(base_set)):
        raise InputError(
            str(cfg.source),
            f"base_sample_by: domain needs a domain on every item of {gen.base_set}; "
            f"{len(missing)} have none (e.g. {missing[0]})",
            field="generation.base_sample_by",
        )
    # Drawn from the whole base set now, so every check runs before a call; a pre-test redraws
    # from what it kept (drawn_from), with the same seed and settings.
    undrawn = GenerationInputs(
        seed, [], levers, [], strata, base_set, gen.base_sample, gen.levers_per_stratum, avoid, gen.base_sample_by
    )
    return undrawn.drawn_from(base_set)


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
        record_domain_draw(recorder, inputs)
        if inputs.avoid:
            record_repeats(recorder, inputs)


def record_domain_draw(recorder: ManifestRecorder, inputs: GenerationInputs) -> None:
    """With ``base_sample_by: domain``: the draw per domain into the manifest and the UI, and a note
    naming each domain that had fewer items left (after the pre-test) than its share."""
    draw = inputs.domain_draw()
    if draw is None:
        return
    short = shortfalls(draw)
    recorder.count(base_sample_by_domain=draw, base_sample_shortfall=short)
    publish_table(
        "base-sample-by-domain",
        [{"domain": domain, **row} for domain, row in draw.items()],
        "Base sample by domain: share, items available (after the pre-test), sampled, shortfall",
    )
    if short:
        recorder.note(
            "base sample by domain: fewer items than the domain's share in "
            + ", ".join(f"{domain} ({draw[domain]['sampled']} of {draw[domain]['share']})" for domain in short)
            + "; import more items per domain"
        )


def record_repeats(recorder: ManifestRecorder, inputs: GenerationInputs) -> None:
    """How many of the round's pairs earlier rounds assigned: none unless the pool ran out."""
    repeated = sum((a.base_id, a.lever_id) in inputs.avoid for a in inputs.assignments)
    recorder.count(pairs_repeated=repeated, pool_exhausted=repeated > 0)
    if repeated:
        story(
            "assign: the pool of (base item, lever) pairs is exhausted: %d of %d pairs repeat earlier rounds "
            "(a larger base set gives fresh ones)",
            repeated,
            len(inputs.assignments),
            level=logging.WARNING,
            terminal=True,
        )
    else:
        story(
            "assign: all %d (base item, lever) pairs are new (%d assigned in earlier rounds avoided)",
            len(inputs.assignments),
            len(inputs.avoid),
        )
