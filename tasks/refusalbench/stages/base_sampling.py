"""The base sample stratified by domain (``generation.base_sample_by: domain``; seed paper App. C.1).

RefusalBench-GaRAGe keeps 20 base items in each of five domains. The importer splits its
``--n`` evenly over the domains, but the pre-test then drops items unevenly, so a uniform draw of
``base_sample`` from what it kept would no longer be balanced. Drawn by domain instead, each
domain gets an equal share of ``base_sample`` (the remainder goes to domains drawn by seed);
without ``base_sample`` each gets as many as the poorest domain can give. A domain with fewer
items left than its share gives all it has, and the shortfall is reported
(:func:`domain_draw`), never filled from another domain: the counts stay equal where they can.

The domains are those of the whole base set, so a domain the pre-test emptied is reported too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from refusalbench.tasks.refusalbench.basesets.curation import seeded_subset, stable_rng
from refusalbench.tasks.refusalbench.schema.records import BaseItem


def without_domain(items: Sequence[BaseItem]) -> list[str]:
    """Ids of the items that have no domain (a draw by domain cannot place them)."""
    return [item.id for item in items if not item.domain]


def domain_shares(n: int | None, available: dict[str, int], seed: int) -> dict[str, int]:
    """Items to draw per domain: ``n`` split evenly (remainder to domains drawn by seed); without
    ``n`` the poorest domain's count for every domain."""
    domains = sorted(available)
    if not domains:
        return {}
    if n is None:
        return dict.fromkeys(domains, min(available.values()))
    base, extra = divmod(n, len(domains))
    bonus = set(stable_rng(seed, "base-sample-domain-quota").sample(domains, extra))
    return {domain: base + (domain in bonus) for domain in domains}


def sample_by_domain(
    pool: Sequence[BaseItem], n: int | None, seed: int, domains: Sequence[str] | None = None
) -> list[BaseItem]:
    """Each domain's share of ``n`` items of ``pool`` by seed (see module doc), in pool order.

    ``domains``: the domains to balance over (default: those in ``pool``); an item of another
    domain is not drawn.
    """
    available = _available(pool, domains)
    shares = domain_shares(n, available, seed)
    chosen: list[int] = []
    for domain, share in shares.items():
        indices = [i for i, item in enumerate(pool) if item.domain == domain]
        chosen.extend(seeded_subset(indices, share, stable_rng(seed, "base-sample-domain", domain)))
    return [pool[i] for i in sorted(chosen)]


def domain_draw(
    pool: Sequence[BaseItem], drawn: Sequence[BaseItem], n: int | None, seed: int, domains: Sequence[str] | None = None
) -> dict[str, dict[str, int]]:
    """Per domain: its ``share`` of the sample, the items ``available`` in the pool, the items
    ``sampled`` and the ``shortfall`` (share - sampled)."""
    available = _available(pool, domains)
    shares = domain_shares(n, available, seed)
    sampled = Counter(item.domain for item in drawn)
    return {
        domain: {
            "share": share,
            "available": available[domain],
            "sampled": sampled[domain],
            "shortfall": share - sampled[domain],
        }
        for domain, share in shares.items()
    }


def shortfalls(draw: dict[str, dict[str, int]]) -> dict[str, int]:
    """The domains that gave fewer items than their share, and by how many."""
    return {domain: row["shortfall"] for domain, row in draw.items() if row["shortfall"] > 0}


def _available(pool: Sequence[BaseItem], domains: Sequence[str] | None) -> dict[str, int]:
    counts = Counter(item.domain for item in pool if item.domain)
    names = sorted(set(domains)) if domains is not None else sorted(counts)
    return {domain: counts[domain] for domain in names}
