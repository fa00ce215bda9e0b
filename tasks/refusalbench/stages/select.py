"""Stage: consensus filter and stratified sampling into the benchmark.

- ``unanimous`` (the paper's rule): every verifier answered and every verdict is PASS;
  a verifier ERROR (no verdict) is not a PASS, so such a candidate is not accepted.
- ``majority``: among the verifiers that answered, more PASS than half of them; a
  candidate no verifier answered is not accepted.
- ``none``: every candidate the pre-checks let through is accepted; the verdicts are
  recorded and analysed but decide nothing. For models too small to verify (the local demo,
  whose 0.5B and 1.5B verifiers pass nothing): the benchmark is then not a verified one, and
  the report, manifest and dataset card say so.

Sampling balances the 18 class x intensity strata and, inside each stratum, the
generators (round robin over each generator's seeded shuffle), deterministic by seed.
``balance: natural`` (default; RefusalBench-GaRAGe) lets a generator with more accepted
candidates fill what another cannot; ``balance: generator`` (RefusalBench-NQ) takes exactly
equal counts per generator in every stratum.
Strata with too few accepted items are reported as shortfalls, never an error: a
naturally imbalanced benchmark (as GaRAGe's is) is a finding, not a failure.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from refusalbench.tasks.refusalbench.schema.json_files import FilterDecision
from refusalbench.tasks.refusalbench.schema.records import BaseItem, BenchmarkItem, Candidate, Verification
from refusalbench.tasks.refusalbench.taxonomy import STRATA


def decide(candidate: Candidate, verdicts: list[str], verifiers: list[str], rule: str) -> FilterDecision:
    passes, fails, errors = verdicts.count("PASS"), verdicts.count("FAIL"), verdicts.count("ERROR")
    missing = len(verifiers) - len(verdicts)
    if candidate.status != "ok":
        return FilterDecision(
            candidate_id=candidate.candidate_id,
            accepted=False,
            passes=0,
            fails=0,
            errors=0,
            reason=f"not parsed ({candidate.status})",
        )
    if candidate.precheck_failures:
        return FilterDecision(
            candidate_id=candidate.candidate_id,
            accepted=False,
            passes=0,
            fails=0,
            errors=0,
            reason="pre-check failed: " + "; ".join(candidate.precheck_failures),
        )
    if rule == "unanimous":
        accepted = passes == len(verifiers) and missing == 0
        if accepted:
            reason = "all verifiers passed"
        elif fails:
            reason = f"{fails} verifier(s) failed it"
        elif "SKIPPED" in verdicts:
            reason = "short-circuited after a FAIL"
        else:
            reason = f"{errors + missing} verifier(s) gave no verdict"
    elif rule == "majority":
        answered = passes + fails
        accepted = answered > 0 and passes * 2 > answered
        reason = f"{passes}/{answered} answered verifiers passed" if answered else "no verifier answered"
    elif rule == "none":
        accepted = True
        reason = f"no filter (verdicts recorded only: {passes} PASS, {fails} FAIL)"
    else:
        raise ValueError(f"unknown filter rule {rule!r}")
    return FilterDecision(
        candidate_id=candidate.candidate_id, accepted=accepted, passes=passes, fails=fails, errors=errors, reason=reason
    )


def filter_candidates(
    candidates: list[Candidate], verifications: list[Verification], verifiers: list[str], rule: str = "unanimous"
) -> list[FilterDecision]:
    verdicts: dict[str, list[str]] = defaultdict(list)
    for row in verifications:
        if row.verifier in verifiers:
            verdicts[row.candidate_id].append(row.verdict)
    return [decide(c, verdicts.get(c.candidate_id, []), verifiers, rule) for c in candidates]


def stratum_quotas(target: int, strata: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """How many of ``target`` items each stratum may give: an even share, the remainder to the first strata."""
    base, extra = divmod(target, len(strata))
    return {stratum: base + (1 if i < extra else 0) for i, stratum in enumerate(strata)}


def _stable_key(seed: int, text: str) -> str:
    return hashlib.sha256(f"{seed}|{text}".encode()).hexdigest()


def stratified_sample(
    accepted: list[Candidate],
    target_size: int | None,
    seed: int,
    strata: Iterable[tuple[str, str]] | None = None,
    *,
    balance: str = "natural",
    generators: Iterable[str] | None = None,
) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
    """Pick up to ``target_size`` candidates balanced over strata and generators.

    Returns the sample and the shortfalls ``{"P-Ambiguity/HIGH": {"wanted": 9, "got": 4}}``.
    Unused quota of a short stratum is not moved elsewhere, so the balance stays visible.
    ``balance="generator"`` takes exactly equal counts per generator in each stratum (see
    :func:`_generator_balanced`); ``generators`` names the run's generators, so one with no
    accepted candidate in a stratum counts as short there.
    """
    by_stratum: dict[tuple[str, str], dict[str, list[Candidate]]] = defaultdict(lambda: defaultdict(list))
    for cand in sorted(accepted, key=lambda c: _stable_key(seed, c.candidate_id)):
        by_stratum[(cand.perturbation_class, cand.intensity)][cand.generator].append(cand)
    chosen_strata = list(strata) if strata is not None else [s for s in STRATA if s in by_stratum] or list(by_stratum)
    if balance == "generator":
        named = list(dict.fromkeys([*(generators or []), *sorted({c.generator for c in accepted})]))
        return _generator_balanced(by_stratum, chosen_strata, named, target_size, seed)
    if balance != "natural":
        raise ValueError(f"unknown balance {balance!r}")
    if target_size is None:
        quotas = {s: sum(len(v) for v in by_stratum.get(s, {}).values()) for s in chosen_strata}
    else:
        quotas = stratum_quotas(target_size, chosen_strata) if chosen_strata else {}
    sample: list[Candidate] = []
    shortfalls: dict[str, dict[str, Any]] = {}
    rng = random.Random(seed)
    for stratum in chosen_strata:
        pools = {g: list(c) for g, c in sorted(by_stratum.get(stratum, {}).items())}
        order = list(pools)
        rng.shuffle(order)  # which generator goes first rotates with the seed
        picked: list[Candidate] = []
        while len(picked) < quotas[stratum] and any(pools.values()):
            for generator in order:
                if pools[generator] and len(picked) < quotas[stratum]:
                    picked.append(pools[generator].pop(0))
        if len(picked) < quotas[stratum] or not picked:
            # With no target size an empty stratum is still a shortfall worth reporting.
            shortfalls[_label(stratum)] = {
                "wanted": quotas[stratum] if target_size is not None else None,
                "got": len(picked),
            }
        sample.extend(picked)
    return sample, shortfalls


def _label(stratum: tuple[str, str]) -> str:
    return f"{stratum[0]}/{stratum[1]}"


def _generator_balanced(
    by_stratum: dict[tuple[str, str], dict[str, list[Candidate]]],
    strata: list[tuple[str, str]],
    generators: list[str],
    target_size: int | None,
    seed: int,
) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
    """Equal counts per generator within each stratum (RefusalBench-NQ: 1,600 = 4 generators x 400).

    Each generator's share of the target, ``target_size // len(generators)``, is spread over
    the strata as the natural quotas are; without a target a stratum's share is what its
    poorest generator has. A stratum where some generator has fewer accepted candidates than
    its share takes only that many from every generator, and is a shortfall that names the
    short generators: ``{"wanted": 8, "got": 4, "generators": {"gen-b": {"wanted": 4, "accepted": 2}}}``.
    """
    if not generators or not strata:
        return [], {}
    if target_size is None:
        shares = {s: min(len(by_stratum.get(s, {}).get(g, [])) for g in generators) for s in strata}
    else:
        shares = stratum_quotas(target_size // len(generators), strata)
    sample: list[Candidate] = []
    shortfalls: dict[str, dict[str, Any]] = {}
    rng = random.Random(seed)
    for stratum in strata:
        pools = {g: by_stratum.get(stratum, {}).get(g, []) for g in generators}
        share = shares[stratum]
        each = min(share, *(len(pool) for pool in pools.values()))
        order = list(generators)
        rng.shuffle(order)  # which generator goes first rotates with the seed
        sample.extend(pools[g][i] for i in range(each) for g in order)
        short = {
            g: {"wanted": share if target_size is not None else None, "accepted": len(pool)}
            for g, pool in pools.items()
            if len(pool) < share or not pool
        }
        if each < share or not each:
            shortfalls[_label(stratum)] = {
                "wanted": share * len(generators) if target_size is not None else None,
                "got": each * len(generators),
                "generators": short,
            }
    return sample, shortfalls


def benchmark_items(sample: list[Candidate], items: dict[str, BaseItem]) -> list[BenchmarkItem]:
    out = []
    for cand in sample:
        base = items[cand.base_id]
        out.append(
            BenchmarkItem(
                item_id=cand.candidate_id,
                base_id=cand.base_id,
                variant=cand.variant,
                perturbation_class=cand.perturbation_class,
                intensity=cand.intensity,
                lever_id=cand.lever_id,
                generator=cand.generator,
                question=cand.question or "",
                context=cand.context,
                passages=cand.passages,
                original_question=base.question,
                original_context=base.context,
                original_passages=base.passages,
                answers=base.answers,
                expected=cand.expected,
                domain=base.domain,
            )
        )
    return out
