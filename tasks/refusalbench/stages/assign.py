"""Lever assignment: which levers each base item is perturbed with (seed paper §3).

For every selected class × intensity stratum the stratum's levers are put in a seeded random
order, and the items walk that order as a cycle: item 0 takes positions 0..k-1, item 1 takes
k..2k-1, and so on (k = levers per stratum). Consecutive positions of one cycle mean that over
enough items every lever is used, use counts within a stratum differ by at most one, and the k
levers of one item are distinct. The order depends only on the seed and the stratum, so a run is
reproducible and a new seed gives a new, equally balanced assignment.

A refresh round passes the (base item, lever) pairs earlier rounds assigned (``avoid``): an item
then walks on along the cycle past its avoided levers and takes the next ones it has not had,
repeating an earlier pair only when its stratum has no other lever left for it (the pool is
exhausted). Without ``avoid`` the assignment is exactly the cycle's.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Iterable, Sequence

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.refusalbench.levers import Stratum, levers_by_stratum
from refusalbench.tasks.refusalbench.schema.records import Assignment, BaseItem, Lever
from refusalbench.tasks.refusalbench.stages.base_sampling import sample_by_domain
from refusalbench.tasks.refusalbench.taxonomy import STRATA, parse_stratum


def assignment_id(base_id: str, lever_id: str) -> str:
    """Stable id of a (base item, lever) pair: the same pair has the same id in every run."""
    return hashlib.sha256(f"{base_id}\x1f{lever_id}".encode()).hexdigest()[:16]


def _rng(seed: int, *parts: str) -> random.Random:
    # Derived through SHA-256 rather than hash(): identical across processes (PYTHONHASHSEED) and builds.
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def parse_strata(specs: Iterable[str]) -> list[Stratum]:
    """Parse ``["P-Ambiguity/LOW", ...]`` into (class, intensity) pairs, in order, without duplicates.

    Class and intensity are read by ``taxonomy.parse_stratum`` (any case, ``P-`` optional) and returned
    in canonical spelling. Raises ValueError (``UnknownName``) naming the first unknown spec and the valid choices.
    """
    out: list[Stratum] = []
    for spec in specs:
        cls, intensity = parse_stratum(spec)
        if (cls, intensity) not in out:
            out.append((cls, intensity))
    return out


def sample_base_items(items: Sequence[BaseItem], n: int | None, seed: int) -> list[BaseItem]:
    """n items drawn without replacement by seed, in their original order; all when n is None or ≥ len."""
    if n is None or n >= len(items):
        return list(items)
    if n < 0:
        raise ValueError(f"sample size must be ≥ 0, got {n}")
    picked = sorted(_rng(seed, "base-sample").sample(range(len(items)), n))
    return [items[i] for i in picked]


def assign_levers(
    items: Sequence[BaseItem],
    levers: Sequence[Lever],
    *,
    seed: int,
    levers_per_stratum: int = 1,
    strata: Sequence[Stratum] | None = None,
    avoid: Collection[tuple[str, str]] = (),
) -> list[Assignment]:
    """Assignments for every item × selected stratum × ``levers_per_stratum`` levers (see module doc).

    Output order: item by item (input order), stratum by stratum (the given order, default the
    taxonomy's), levers in cycle order. A stratum with fewer levers than asked gives each item all of
    them. ``avoid``: (base id, lever id) pairs taken only when the stratum has no other lever left
    for the item (see module doc). Raises ValueError on duplicate item ids, an unknown stratum or a
    stratum without levers.
    """
    if levers_per_stratum < 1:
        raise ValueError(f"levers_per_stratum must be ≥ 1, got {levers_per_stratum}")
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"duplicate base item ids: {', '.join(duplicates[:5])}")
    selected = list(STRATA) if strata is None else list(dict.fromkeys(tuple(s) for s in strata))
    groups = levers_by_stratum(levers)

    # Keyed by the strata as given, made tuples (a config's lists become tuples; a wrong length fails the check below).
    cycles: dict[tuple[str, ...], list[Lever]] = {}
    for stratum in selected:
        if stratum not in STRATA:
            raise ValueError(f"unknown stratum {stratum[0]}/{stratum[1]}")
        group = groups.get(stratum)
        if not group:
            raise ValueError(f"no levers in stratum {stratum[0]}/{stratum[1]}")
        cycle = list(group)
        _rng(seed, "levers", *stratum).shuffle(cycle)
        cycles[stratum] = cycle

    out: list[Assignment] = []
    for position, item in enumerate(items):
        for stratum in selected:
            cycle = cycles[stratum]
            k = min(levers_per_stratum, len(cycle))
            walk = [cycle[(position * k + offset) % len(cycle)] for offset in range(len(cycle))]
            if avoid:  # the item's unused levers first, in cycle order; earlier pairs only to fill up
                walk = sorted(walk, key=lambda lever: (item.id, lever.id) in avoid)
            for lever in walk[:k]:
                out.append(
                    Assignment(
                        assignment_id=assignment_id(item.id, lever.id),
                        base_id=item.id,
                        lever_id=lever.id,
                        perturbation_class=lever.perturbation_class,
                        intensity=lever.intensity,
                        variant=item.variant,
                    )
                )
    return out


def configured_strata(cfg: RunConfig) -> list[Stratum] | None:
    """The config's ``generation.strata`` parsed (None: every stratum); an unknown one is an InputError."""
    assert cfg.generation is not None, "callers ask only for a config with a generation section"
    specs = cfg.generation.strata
    try:
        return parse_strata(specs) if specs else None
    except ValueError as exc:
        raise InputError(str(cfg.source), str(exc), field="generation.strata") from None


def draw_assignments(
    pool: Sequence[BaseItem],
    levers: Sequence[Lever],
    strata: Sequence[Stratum] | None,
    base_sample: int | None,
    levers_per_stratum: int,
    seed: int,
    avoid: Collection[tuple[str, str]] = (),
    by: str | None = None,
    domains: Sequence[str] | None = None,
) -> tuple[list[BaseItem], list[Assignment]]:
    """The generation's draw: ``base_sample`` items of ``pool`` by seed, and their lever assignment
    (avoiding earlier rounds' pairs ``avoid`` while the pool allows). ``by="domain"``: equal counts
    per domain of ``domains`` (default: the pool's; see ``tasks.refusalbench.stages.base_sampling``)."""
    items = (
        sample_by_domain(pool, base_sample, seed, domains)
        if by == "domain"
        else sample_base_items(pool, base_sample, seed)
    )
    return items, assign_levers(
        items, levers, seed=seed, levers_per_stratum=levers_per_stratum, strata=strata, avoid=avoid
    )
