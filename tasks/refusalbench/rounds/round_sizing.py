"""How large a refresh round must be for the error a team accepts (paper §3.1, Theorem 3.1, App. B.4).

Each round scores a fresh i.i.d. sample of n items (Assumption B.1). For a per-item score in
[0, 1] (correct / incorrect, or any bounded score), Hoeffding's inequality bounds one round's
error and a union bound over T rounds bounds them all at once:

    P(max over t <= T of |estimate_t - truth_t| > epsilon) <= 2T exp(-2 n epsilon²),

so n >= ln(2T / delta) / (2 epsilon²) items per round keep every one of the T rounds within
epsilon of the model's true score with probability at least 1 - delta. ``plan --rounds 52
--epsilon 0.05 --delta 0.05`` (a year of weekly rounds): ln(2080) / 0.005 = 1,528.02, so n = 1,529.

Per stratum (epsilon in each of the S strata of a round, all rounds at once), the union bound
runs over T x S events: n per stratum >= ln(2TS / delta) / (2 epsilon²). The bound is per model
and per metric: a metric that averages over a subset of the items (answer accuracy: the
answerable ones) gets the subset's n.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.stats import rounds_epsilon, rounds_sample_size
from refusalbench.tasks.refusalbench.stages.assign import configured_strata
from refusalbench.tasks.refusalbench.stages.select import stratum_quotas
from refusalbench.tasks.refusalbench.taxonomy import STRATA


class RoundSizing(BaseModel):
    """The round size Theorem 3.1 requires, and whether the config's ``target_size`` meets it."""

    rounds: int = Field(description="T: the rounds the guarantee covers at once")
    epsilon: float
    delta: float
    per_round: int = Field(description="items per round: ceil(ln(2T/delta) / (2 epsilon²))")
    strata: int = Field(description="strata the config samples")
    per_stratum: int | None = Field(
        default=None,
        description="items per stratum for epsilon in every stratum: ceil(ln(2TS/delta) / (2 epsilon²)); when asked",
    )
    target_size: int | None = Field(description="the config's generation.target_size (None: not set)")
    meets: bool | None = Field(
        description="target_size >= the requirement (per stratum: every stratum's quota); "
        "None when target_size is not set"
    )
    epsilon_achieved: float | None = Field(description="the epsilon target_size achieves for T and delta")


def round_sizing(cfg: RunConfig, rounds: int, epsilon: float, delta: float, per_stratum: bool = False) -> RoundSizing:
    """The requirement for ``rounds`` rounds at ``epsilon`` and ``delta``, checked against ``cfg``."""
    strata = configured_strata(cfg) if cfg.generation else None
    count = len(strata) if strata else len(STRATA)
    target = cfg.generation.target_size if cfg.generation else None
    need = rounds_sample_size(epsilon, delta, rounds)
    need_stratum = rounds_sample_size(epsilon, delta, rounds * count) if per_stratum else None
    meets = None
    if target is not None:
        if need_stratum is not None:
            meets = min(stratum_quotas(target, list(strata or STRATA)).values()) >= need_stratum
        else:
            meets = target >= need
    return RoundSizing(
        rounds=rounds,
        epsilon=epsilon,
        delta=delta,
        per_round=need,
        strata=count,
        per_stratum=need_stratum,
        target_size=target,
        meets=meets,
        epsilon_achieved=rounds_epsilon(target, delta, rounds) if target else None,
    )


def sizing_text(sizing: RoundSizing) -> str:
    """The requirement in words, as ``plan`` prints it."""
    lines = [
        f"Round size (Theorem 3.1: every one of T = {sizing.rounds} rounds within epsilon = {sizing.epsilon:g} "
        f"with probability 1 - delta = {1 - sizing.delta:g}, per-item scores in [0, 1]):",
        f"  n = {sizing.per_round:,} items per round (ln(2T/delta) / (2 epsilon^2), rounded up)",
    ]
    if sizing.per_stratum is not None:
        lines.append(
            f"  per stratum: n = {sizing.per_stratum:,} items in each of {sizing.strata} strata "
            f"(ln(2TS/delta) / (2 epsilon^2)), {sizing.per_stratum * sizing.strata:,} per round"
        )
    if sizing.target_size is None:
        lines.append("  config: generation.target_size is not set (the round takes whatever the filter accepts)")
    else:
        verdict = "meets it" if sizing.meets else "does NOT meet it"
        lines.append(
            f"  config: target_size {sizing.target_size:,} {verdict}; it achieves epsilon = "
            f"{sizing.epsilon_achieved:.3f} for these T and delta"
        )
    return "\n".join(lines)
