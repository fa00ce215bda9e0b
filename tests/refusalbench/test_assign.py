"""Lever assignment: even coverage of the catalogue, determinism by seed, strata subsets, sampling."""

from __future__ import annotations

from collections import Counter

import pytest

from refusalbench.tasks.refusalbench.schema.records import BaseItem, Lever, LeverExample, Passage
from refusalbench.tasks.refusalbench.stages.assign import (
    assign_levers,
    assignment_id,
    draw_assignments,
    parse_strata,
    sample_base_items,
)
from refusalbench.tasks.refusalbench.taxonomy import STRATA, expected_behaviour


def make_levers(per_stratum: dict[tuple[str, str], int] | None = None, default: int = 3) -> list[Lever]:
    """A synthetic catalogue: `default` levers per stratum unless overridden."""
    levers = []
    for cls, intensity in STRATA:
        for k in range((per_stratum or {}).get((cls, intensity), default)):
            levers.append(
                Lever(
                    id=f"{cls}-{intensity}-{k}".lower(),
                    name=f"lever {k}",
                    perturbation_class=cls,
                    intensity=intensity,
                    target="query",
                    instruction="Change the question.",
                    example=LeverExample(question="q", context="c", expected=expected_behaviour(cls, intensity)),
                    multi_document="Apply to the signal passages.",
                )
            )
    return levers


def make_items(n: int, multi_every: int = 0) -> list[BaseItem]:
    items = []
    for i in range(n):
        if multi_every and i % multi_every == 0:
            items.append(BaseItem(id=f"b{i}", question="q", answers=["a"], passages=[Passage(text="a", relevant=True)]))
        else:
            items.append(BaseItem(id=f"b{i}", question="q", answers=["a"], context="a"))
    return items


SIZES = {("P-Ambiguity", "LOW"): 7, ("P-Contradiction", "HIGH"): 1, ("P-MissingInfo", "MEDIUM"): 12}


def test_every_item_gets_one_lever_per_stratum_by_default():
    levers = make_levers(SIZES)
    out = assign_levers(make_items(5, multi_every=2), levers, seed=0)
    assert len(out) == 5 * 18
    per_item = Counter((a.base_id, a.perturbation_class, a.intensity) for a in out)
    assert set(per_item.values()) == {1} and len(per_item) == 5 * 18
    by_id = {lever.id: lever for lever in levers}
    for a in out:
        lever = by_id[a.lever_id]
        assert (a.perturbation_class, a.intensity) == (lever.perturbation_class, lever.intensity)
        assert a.assignment_id == assignment_id(a.base_id, a.lever_id)
    assert {a.variant for a in out if a.base_id == "b0"} == {"multi"}
    assert {a.variant for a in out if a.base_id == "b1"} == {"single"}


@pytest.mark.parametrize("n_items", [12, 13, 50])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_coverage_is_even_within_every_stratum(n_items, k):
    levers = make_levers(SIZES, default=4)
    out = assign_levers(make_items(n_items), levers, seed=3, levers_per_stratum=k)
    uses = Counter(a.lever_id for a in out)
    for stratum in STRATA:
        ids = [lever.id for lever in levers if (lever.perturbation_class, lever.intensity) == stratum]
        counts = [uses[i] for i in ids]
        if n_items * min(k, len(ids)) >= len(ids):
            assert min(counts) >= 1, stratum  # enough items: every lever of the stratum is used
        assert max(counts) - min(counts) <= 1, (stratum, counts)
        assert sum(counts) == n_items * min(k, len(ids))


def test_whole_catalogue_of_176_levers_is_covered_with_enough_items():
    # 176 levers spread unevenly over the 18 strata, like the real catalogue
    sizes = {s: 9 + (i % 3) for i, s in enumerate(STRATA)}
    sizes[STRATA[0]] += 176 - sum(sizes.values())
    levers = make_levers(sizes)
    assert len(levers) == 176
    out = assign_levers(make_items(max(sizes.values())), levers, seed=11)
    assert {a.lever_id for a in out} == {lever.id for lever in levers}


def test_levers_per_stratum_gives_distinct_levers_per_item_and_caps_at_stratum_size():
    levers = make_levers(SIZES, default=4)
    out = assign_levers(make_items(9), levers, seed=1, levers_per_stratum=3)
    groups: dict[tuple[str, str, str], list[str]] = {}
    for a in out:
        groups.setdefault((a.base_id, a.perturbation_class, a.intensity), []).append(a.lever_id)
    for (_base_id, cls, intensity), ids in groups.items():
        assert len(ids) == len(set(ids)) == min(3, SIZES.get((cls, intensity), 4))
    assert len({a.assignment_id for a in out}) == len(out)


def test_deterministic_for_a_seed_and_different_across_seeds():
    levers, items = make_levers(default=5), make_items(20)
    first = assign_levers(items, levers, seed=42)
    assert first == assign_levers(items, list(reversed(levers)), seed=42)  # catalogue order does not matter
    others = {tuple(a.lever_id for a in assign_levers(items, levers, seed=s)) for s in range(5)}
    assert len(others) == 5


def test_strata_subset_in_given_order():
    strata = parse_strata(["P-FalsePremise/HIGH", "p-ambiguity/low"])
    out = assign_levers(make_items(3), make_levers(), seed=0, strata=strata)
    assert [(a.perturbation_class, a.intensity) for a in out[:2]] == [
        ("P-FalsePremise", "HIGH"),
        ("P-Ambiguity", "LOW"),
    ]
    assert len(out) == 6


def test_assignment_errors():
    items = make_items(2)
    with pytest.raises(ValueError, match="no levers in stratum P-Contradiction/HIGH"):
        assign_levers(items, make_levers({("P-Contradiction", "HIGH"): 0}), seed=0)
    with pytest.raises(ValueError, match="duplicate base item ids: b0"):
        assign_levers(items + [items[0]], make_levers(), seed=0)
    with pytest.raises(ValueError, match="levers_per_stratum"):
        assign_levers(items, make_levers(), seed=0, levers_per_stratum=0)
    # a stratum missing from the catalogue is fine when it is not selected
    sparse = [lv for lv in make_levers() if lv.perturbation_class == "P-Ambiguity"]
    assert len(assign_levers(items, sparse, seed=0, strata=parse_strata(["P-Ambiguity/MEDIUM"]))) == 2


def test_parse_strata():
    assert parse_strata(["P-Ambiguity/LOW", "P-EpistemicMismatch/high", "P-Ambiguity/LOW"]) == [
        ("P-Ambiguity", "LOW"),
        ("P-EpistemicMismatch", "HIGH"),
    ]
    for bad in ["P-Ambiguity", "P-Vagueness/LOW", "P-Ambiguity/EXTREME", ""]:
        with pytest.raises(ValueError, match="unknown stratum .*expected CLASS/INTENSITY"):
            parse_strata([bad])
    # As people write them: any case, P- optional, the lever ids' slugs.
    assert parse_strata(["missing-info/low", "MissingInfo/LOW", "AMBIGUITY/High", "granularity/medium"]) == [
        ("P-MissingInfo", "LOW"),
        ("P-Ambiguity", "HIGH"),
        ("P-GranularityMismatch", "MEDIUM"),
    ]
    with pytest.raises(ValueError, match=r"'P-Contradict/LOW'.*did you mean P-Contradiction\?.*P-EpistemicMismatch"):
        parse_strata(["P-Contradict/LOW"])


def test_sample_base_items():
    items = make_items(30)
    sample = sample_base_items(items, 10, seed=5)
    assert len(sample) == 10 == len({i.id for i in sample})
    assert sample == sample_base_items(items, 10, seed=5)
    assert [items.index(i) for i in sample] == sorted(items.index(i) for i in sample)  # original order kept
    assert sample != sample_base_items(items, 10, seed=6)
    assert sample_base_items(items, None, seed=0) == items
    assert sample_base_items(items, 99, seed=0) == items
    with pytest.raises(ValueError):
        sample_base_items(items, -1, seed=0)


def test_assignment_id_is_stable():
    assert assignment_id("b1", "lever-x") == assignment_id("b1", "lever-x")
    assert assignment_id("b1", "lever-x") != assignment_id("b1", "lever-y")
    assert assignment_id("b1", "lever-x") == "c577c7287d90e60d"  # pinned: ids must not change across releases


def test_draw_from_a_smaller_pool_uses_the_same_seed_and_settings():
    levers, items = make_levers(), make_items(10)
    kept = [item for item in items if item.id not in {"b2", "b5"}]
    drawn, assignments = draw_assignments(kept, levers, None, 4, 1, seed=9)
    assert drawn == sample_base_items(kept, 4, seed=9) and {i.id for i in drawn} <= {i.id for i in kept}
    assert assignments == assign_levers(drawn, levers, seed=9)
