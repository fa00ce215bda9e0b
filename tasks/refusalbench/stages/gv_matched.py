"""The matched-set generator-verifier comparison (seed paper §4.2 RQ1, Fig. 3): ``gv_analysis.json``'s
``matched_set``.

The paper compares generators "on perturbations matched across generators by source question,
class, intensity and context, preserving all verification outcomes without filtering". Here:

- the matched set is the assignments (base item x lever, hence class and intensity) that every
  generator attempted and got a reply for; an assignment some generator never attempted, or whose
  call failed for one of them (a call error says nothing of the generator), is left out and counted;
- a matched candidate that never reached the verifiers (a parse error or a pre-check reject, e.g. the
  item returned unchanged) counts as FAIL from every verifier. The run-wide tables drop those, which
  flatters a generator that returns items unchanged; here they count against it, and the rejects
  per generator are reported;
- per model that generates and verifies: its self pass rate (its own verdicts on its candidates)
  and cross pass rate (the other verifiers' verdicts on them), with Wilson intervals; their means
  over those models are the paper's headline pair (RefusalBench-NQ: 91.0% self vs 82.1% cross);
- verifier agreement: pairwise Cohen's kappa on the matched candidates both verifiers judged, and
  its mean over the defined pairs (the off-diagonal of the paper's Fig. 14); failures counted as FAIL
  without a verifier's verdict are left out of it, as they would inflate agreement;
- per verifier, how often it judged each criterion false, over its verdicts on the matched set.

A verifier's ERROR or SKIPPED verdict leaves that one cell out (counted as ``unjudged``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pandas as pd

from refusalbench.tasks.core.stats import cohens_kappa, wilson_interval
from refusalbench.tasks.llm.structured_outputs import VERIFIER_CRITERIA

CRITERIA = (*VERIFIER_CRITERIA, "strategy_compliance")  # strategy compliance: multi-document items only


def _rate(passes: int, judged: int) -> float:
    return passes / judged if judged else math.nan


def _interval(passes: int, judged: int) -> list[float]:
    return list(wilson_interval(passes, judged))


def verifier_kappa(a: list[str], b: list[str]) -> tuple[float, str | None]:
    """Cohen's kappa of two verifiers over the candidates both judged; (nan, reason) when not informative."""
    if not a:
        return math.nan, "no candidate judged by both"
    constant = [name for name, ratings in (("first", a), ("second", b)) if len(set(ratings)) == 1]
    if constant:
        # With a constant rater kappa is 0 or undefined whatever the other does: not informative.
        return math.nan, f"no variance: {' and '.join(constant)} verifier gave a single verdict"
    return cohens_kappa(a, b), None


def matched_assignments(candidates: pd.DataFrame, generators: list[str]) -> tuple[set[str], dict[str, int]]:
    """The assignments every generator attempted without a call error, and why the others are left out."""
    rows = candidates[candidates["generator"].isin(generators)]
    attempted = rows.groupby("assignment_id")["generator"].agg(lambda g: set(g) >= set(generators))
    call_failed = rows[rows["status"] == "call_error"].groupby("assignment_id").size()
    every = set(attempted[attempted].index)
    matched = every - set(call_failed.index)
    excluded = {
        "not_attempted_by_every_generator": int(len(attempted) - len(every)),
        "call_error": int(len(every) - len(matched)),
    }
    return matched, excluded


def _cells(candidates: pd.DataFrame, verifications: pd.DataFrame, verifiers: list[str]) -> pd.DataFrame:
    """One row per (matched candidate, verifier) that counts: the verifier's PASS or FAIL, or FAIL for a
    candidate that never reached the verifiers (``auto``)."""
    reached = candidates["status"].eq("ok") & candidates["precheck_failures"].map(lambda f: f is None or len(f) == 0)
    auto = pd.DataFrame(
        [
            {"candidate_id": c, "generator": g, "verifier": v, "pass": False, "auto": True}
            for c, g in zip(candidates.loc[~reached, "candidate_id"], candidates.loc[~reached, "generator"])
            for v in verifiers
        ],
        columns=["candidate_id", "generator", "verifier", "pass", "auto"],
    )
    judged = verifications[
        verifications["candidate_id"].isin(candidates.loc[reached, "candidate_id"])
        & verifications["verifier"].isin(verifiers)
        & verifications["verdict"].isin(["PASS", "FAIL"])
    ]
    given = judged[["candidate_id", "generator", "verifier"]].assign(
        **{"pass": judged["verdict"].eq("PASS"), "auto": False}
    )
    return pd.concat([given, auto], ignore_index=True) if len(auto) else given


def _self_vs_cross(cells: pd.DataFrame, model: str) -> dict[str, Any]:
    own = cells[cells["generator"] == model]
    self_rows, cross_rows = own[own["verifier"] == model], own[own["verifier"] != model]
    self_pass, cross_pass = int(self_rows["pass"].sum()), int(cross_rows["pass"].sum())
    self_rate, cross_rate = _rate(self_pass, len(self_rows)), _rate(cross_pass, len(cross_rows))
    return {
        "self_pass_rate": self_rate,
        "cross_pass_rate": cross_rate,
        "self_evaluation_bias": self_rate - cross_rate,
        "n_self": len(self_rows),
        "n_cross": len(cross_rows),
        "self_interval": _interval(self_pass, len(self_rows)),
        "cross_interval": _interval(cross_pass, len(cross_rows)),
    }


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _mean(values: list[float]) -> float:
    defined = [v for v in values if not math.isnan(v)]
    return sum(defined) / len(defined) if defined else math.nan


def criterion_failure_rates(verdicts: pd.DataFrame, verifiers: list[str]) -> dict[str, dict[str, float]]:
    """verifier -> criterion -> share of its verdicts that judged the criterion false (NaN: never judged)."""
    out: dict[str, dict[str, float]] = {}
    for verifier in verifiers:
        rows = verdicts[verdicts["verifier"] == verifier]
        out[verifier] = {}
        for criterion in CRITERIA:
            given = rows[criterion].dropna() if criterion in rows.columns else pd.Series(dtype=bool)
            out[verifier][criterion] = _rate(int((~given.astype(bool)).sum()), len(given))
    return out


def matched_set(
    candidates: pd.DataFrame, verifications: pd.DataFrame, generators: list[str], verifiers: list[str]
) -> dict[str, Any]:
    """The ``matched_set`` section of ``gv_analysis.json`` (see the module doc)."""
    assignments, excluded = matched_assignments(candidates, generators)
    chosen = candidates[candidates["assignment_id"].isin(assignments) & candidates["generator"].isin(generators)]
    cells = _cells(chosen, verifications, verifiers)
    per_generator = {}
    for gen in generators:
        own = chosen[chosen["generator"] == gen]
        rejected = own["status"].eq("ok") & own["precheck_failures"].map(lambda f: f is not None and len(f) > 0)
        per_generator[gen] = {
            "candidates": len(own),
            "unparsed": int(own["status"].ne("ok").sum()),
            "precheck_rejects": int(rejected.sum()),
        }
    matrix = {
        gen: {
            ver: _rate(int(g["pass"].sum()), len(g))
            for ver in verifiers
            for g in [cells[(cells["generator"] == gen) & (cells["verifier"] == ver)]]
        }
        for gen in generators
    }
    counts = {
        gen: {ver: int(((cells["generator"] == gen) & (cells["verifier"] == ver)).sum()) for ver in verifiers}
        for gen in generators
    }
    both = sorted(set(generators) & set(verifiers))
    bias = {model: _self_vs_cross(cells, model) for model in both}

    given = cells[~cells["auto"]]
    by_verifier = {v: given[given["verifier"] == v].set_index("candidate_id")["pass"] for v in verifiers}
    kappas: list[dict[str, Any]] = []
    for first, second in itertools.combinations(verifiers, 2):
        common = by_verifier[first].index.intersection(by_verifier[second].index)
        kappa, reason = verifier_kappa(
            [_verdict(x) for x in by_verifier[first].loc[common]],
            [_verdict(x) for x in by_verifier[second].loc[common]],
        )
        kappas.append({"verifier_a": first, "verifier_b": second, "kappa": kappa, "n": len(common), "reason": reason})

    reached = verifications[verifications["candidate_id"].isin(given["candidate_id"])]
    verdicts = reached[reached["verdict"].isin(["PASS", "FAIL"])]
    expected_cells = len(chosen) * len(verifiers)
    return {
        "assignments": int(candidates["assignment_id"].nunique()),
        "matched_assignments": len(assignments),
        "excluded_assignments": excluded,
        "by_generator": per_generator,
        "unjudged": int(expected_cells - len(cells)),
        "pass_rate_matrix": matrix,
        "judged_counts": counts,
        "self_evaluation": bias,
        "self_pass_rate": _mean([row["self_pass_rate"] for row in bias.values()]),
        "cross_pass_rate": _mean([row["cross_pass_rate"] for row in bias.values()]),
        "verifier_kappa": kappas,
        "mean_kappa": _mean([row["kappa"] for row in kappas]),
        "kappa_pairs_defined": sum(not math.isnan(row["kappa"]) for row in kappas),
        "criterion_failure_rates": criterion_failure_rates(verdicts, verifiers),
        "criterion_verdicts": {v: int((verdicts["verifier"] == v).sum()) for v in verifiers},
    }


def matched_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """Self vs cross pass rate per model on the matched set, then their mean, as table rows (Prefect table)."""
    matched = analysis.get("matched_set") or {}
    rows = [
        {
            "model": model,
            "self_pass_rate": row["self_pass_rate"],
            "cross_pass_rate": row["cross_pass_rate"],
            "n_self": row["n_self"],
            "n_cross": row["n_cross"],
        }
        for model, row in (matched.get("self_evaluation") or {}).items()
    ]
    if rows:
        rows.append(
            {
                "model": "mean",
                "self_pass_rate": matched["self_pass_rate"],
                "cross_pass_rate": matched["cross_pass_rate"],
                "n_self": None,
                "n_cross": None,
            }
        )
    return [
        {
            k: (None if isinstance(v, float) and math.isnan(v) else round(v, 3) if isinstance(v, float) else v)
            for k, v in row.items()
        }
        for row in rows
    ]
