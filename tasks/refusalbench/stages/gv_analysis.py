"""Stage: generator-verifier analysis, computed from the verification table (seed paper App. E).

- pass-rate matrix generator x verifier (PASS / (PASS + FAIL); errors and skips excluded)
- self-evaluation bias per model that both generates and verifies: the rate at which it
  passes its own candidates minus the rate at which the other verifiers pass them
- pairwise Cohen's kappa between verifiers on the candidates both judged (NaN with a
  reason when a verifier gave one verdict only, since chance agreement is then 1)
- verdict consistency per verifier: how often a stated verdict contradicted the verifier's
  own criteria (such a PASS counts as FAIL, see ``tasks.verify``)
- pass rates by class and by intensity, the pre-check rejections per rule, and the
  acceptance funnel attempted -> parsed -> prechecked -> verified -> accepted -> sampled
- the tables behind the report's generation figures: pass rate per generator x class and
  generator x intensity, self-evaluation bias per class, the benchmark's class x intensity
  counts and each generator's accepted and sampled items per class
- ``matched_set``: the paper's matched-set comparison (§4.2 RQ1, Fig. 3) with pre-check rejects
  counted as failures (``tasks.refusalbench.stages.gv_matched``)
(and a markdown summary of it for the Prefect UI)
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import pandas as pd

from refusalbench.tasks.refusalbench.stages.gv_matched import matched_set, verifier_kappa
from refusalbench.tasks.refusalbench.stages.prechecks import rule_name


def _rate(passes: int, judged: int) -> float:
    return passes / judged if judged else math.nan


def _precheck_failures(parsed: pd.DataFrame) -> pd.Series:
    """Each parsed candidate's failed pre-checks as a list (none recorded: passed, e.g. an older run)."""
    if "precheck_failures" not in parsed.columns:
        return pd.Series([[] for _ in range(len(parsed))], index=parsed.index, dtype=object)
    return parsed["precheck_failures"].map(lambda v: [] if v is None else list(v))


def _self_vs_cross(own: pd.DataFrame, model: str) -> dict[str, Any]:
    """How ``model`` passes its own candidates (``own``: judged rows it generated) against the others."""
    self_rows = own[own["verifier"] == model]
    cross_rows = own[own["verifier"] != model]
    self_rate = _rate(int(self_rows["pass"].sum()), len(self_rows))
    cross_rate = _rate(int(cross_rows["pass"].sum()), len(cross_rows))
    return {
        "self_pass_rate": self_rate,
        "cross_pass_rate": cross_rate,
        "self_evaluation_bias": self_rate - cross_rate,
        "n_self": len(self_rows),
        "n_cross": len(cross_rows),
    }


def pass_rates_by(judged: pd.DataFrame, dimension: str, generators: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """generator -> value of ``dimension`` -> passed, judged, pass rate (``judged``: PASS/FAIL rows with a
    ``pass`` flag and the candidate's class and intensity)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for gen in generators:
        rows = judged[judged["generator"] == gen]
        out[gen] = {
            str(value): {
                "passed": int(group["pass"].sum()),
                "judged": len(group),
                "pass_rate": _rate(int(group["pass"].sum()), len(group)),
            }
            for value, group in rows.groupby(dimension)
        }
    return out


def self_evaluation_by_class(judged: pd.DataFrame, models: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> perturbation class -> self vs cross pass rate, for models that generate and verify."""
    return {
        model: {
            str(cls): _self_vs_cross(group, model)
            for cls, group in judged[judged["generator"] == model].groupby("perturbation_class")
        }
        for model in models
    }


def counts_by(rows: pd.DataFrame, outer: str, inner: str) -> dict[str, dict[str, int]]:
    """Row counts as ``{outer value: {inner value: n}}`` (only combinations that occur)."""
    return {str(a): {str(b): len(g) for b, g in group.groupby(inner)} for a, group in rows.groupby(outer)}


def verifier_consistency(verifications: pd.DataFrame, verifiers: list[str]) -> dict[str, dict[str, Any]]:
    """Per verifier: stated verdicts, how many contradicted the verifier's own criteria, and which way."""
    out: dict[str, dict[str, Any]] = {}
    has_columns = {"stated_verdict", "consistent"} <= set(verifications.columns)
    for verifier in verifiers:
        rows = verifications[verifications["verifier"] == verifier]
        if has_columns:
            stated = rows[rows["stated_verdict"].notna()]
            inconsistent = stated[stated["consistent"].eq(False)]
        else:  # a run from before verdicts were checked against their criteria
            stated = inconsistent = pd.DataFrame(columns=["stated_verdict"])
        out[verifier] = {
            "stated": len(stated),
            "inconsistent": len(inconsistent),
            "inconsistency_rate": _rate(len(inconsistent), len(stated)),
            "pass_overruled": int((inconsistent["stated_verdict"] == "PASS").sum()),
            "fail_with_all_criteria_met": int((inconsistent["stated_verdict"] == "FAIL").sum()),
        }
    return out


def gv_analysis(
    candidates: pd.DataFrame,
    verifications: pd.DataFrame,
    accepted_ids: set[str],
    sampled_ids: set[str],
    generators: list[str],
    verifiers: list[str],
) -> dict[str, Any]:
    judged = verifications[verifications["verdict"].isin(["PASS", "FAIL"])].copy()
    judged["pass"] = judged["verdict"] == "PASS"

    matrix: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, int]] = {}
    for gen in generators:
        matrix[gen], counts[gen] = {}, {}
        for ver in verifiers:
            rows = judged[(judged["generator"] == gen) & (judged["verifier"] == ver)]
            matrix[gen][ver] = _rate(int(rows["pass"].sum()), len(rows))
            counts[gen][ver] = len(rows)

    both = sorted(set(generators) & set(verifiers))
    bias = {model: _self_vs_cross(judged[judged["generator"] == model], model) for model in both}

    kappas = []
    by_verifier = {v: judged[judged["verifier"] == v].set_index("candidate_id")["verdict"] for v in verifiers}
    for first, second in itertools.combinations(verifiers, 2):
        common = by_verifier[first].index.intersection(by_verifier[second].index)
        kappa, reason = verifier_kappa(list(by_verifier[first].loc[common]), list(by_verifier[second].loc[common]))
        kappas.append({"verifier_a": first, "verifier_b": second, "kappa": kappa, "n": len(common), "reason": reason})

    meta = candidates.set_index("candidate_id")[["perturbation_class", "intensity"]]
    with_meta = judged.join(meta, on="candidate_id")
    by_class = {k: _rate(int(g["pass"].sum()), len(g)) for k, g in with_meta.groupby("perturbation_class")}
    by_intensity = {k: _rate(int(g["pass"].sum()), len(g)) for k, g in with_meta.groupby("intensity")}
    sampled = candidates[candidates["candidate_id"].isin(sampled_ids)]
    accepted = candidates[candidates["candidate_id"].isin(accepted_ids)]
    acceptance_by_stratum = {}
    for (cls, intensity), group in candidates.groupby(["perturbation_class", "intensity"]):
        acceptance_by_stratum[f"{cls}/{intensity}"] = _rate(
            int(group["candidate_id"].isin(accepted_ids).sum()), len(group)
        )

    parsed = candidates[candidates["status"] == "ok"]
    failures = _precheck_failures(parsed)
    prechecked = parsed[failures.map(len) == 0]
    complete = verifications.groupby("candidate_id")["verdict"].agg(lambda v: not (v == "ERROR").any())
    funnel = {
        "attempted": int(len(candidates)),
        "parsed": int(len(parsed)),
        "prechecked": int(len(prechecked)),
        "verified": int(complete.reindex(prechecked["candidate_id"]).fillna(False).sum()) if len(prechecked) else 0,
        "accepted": len(accepted_ids),
        "sampled": len(sampled_ids),
    }
    rejected_by_rule = Counter(rule_name(f) for entries in failures for f in entries)
    return {
        "pass_rate_matrix": matrix,
        "judged_counts": counts,
        "self_evaluation": bias,
        "verifier_kappa": kappas,
        "verifier_consistency": verifier_consistency(verifications, verifiers),
        "pass_rate_by_class": by_class,
        "pass_rate_by_intensity": by_intensity,
        "acceptance_by_stratum": acceptance_by_stratum,
        "funnel": funnel,
        "precheck_failures": dict(sorted(rejected_by_rule.items())),
        "status_counts": candidates["status"].value_counts().to_dict(),
        "verdict_counts": verifications["verdict"].value_counts().to_dict() if len(verifications) else {},
        "pass_rate_by_generator_class": pass_rates_by(with_meta, "perturbation_class", generators),
        "pass_rate_by_generator_intensity": pass_rates_by(with_meta, "intensity", generators),
        "self_evaluation_by_class": self_evaluation_by_class(with_meta, both),
        "benchmark_composition": counts_by(sampled, "perturbation_class", "intensity"),
        "accepted_by_generator_class": counts_by(accepted, "generator", "perturbation_class"),
        "sampled_by_generator_class": counts_by(sampled, "generator", "perturbation_class"),
        **_matched(candidates, verifications, generators, verifiers),
    }


def _matched(
    candidates: pd.DataFrame, verifications: pd.DataFrame, generators: list[str], verifiers: list[str]
) -> dict[str, Any]:
    """``{"matched_set": ...}``; nothing for tables without assignment ids (hand-built, not a run's)."""
    if "assignment_id" not in candidates.columns:
        return {}
    return {"matched_set": matched_set(candidates, verifications, generators, verifiers)}


def matrix_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """The pass-rate matrix as table rows (for a Prefect table artifact and the report)."""
    rows = []
    for gen, per_verifier in analysis["pass_rate_matrix"].items():
        row: dict[str, Any] = {"generator": gen}
        row.update({f"verified by {ver}": (None if math.isnan(v) else round(v, 3)) for ver, v in per_verifier.items()})
        rows.append(row)
    return rows


def self_evaluation_class_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """Self-evaluation bias per model and class as table rows (Prefect table artifact)."""
    return [
        {"model": model, "perturbation_class": cls, **row}
        for model, by_class in analysis.get("self_evaluation_by_class", {}).items()
        for cls, row in by_class.items()
    ]


def consistency_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict consistency per verifier as table rows (Prefect table artifact)."""
    return [{"verifier": verifier, **row} for verifier, row in analysis.get("verifier_consistency", {}).items()]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"


def summary_markdown(analysis: dict[str, Any]) -> str:
    """The funnel, self-evaluation bias, verdict consistency, pre-check rejections and verifier
    agreement as markdown (Prefect UI)."""
    funnel = analysis["funnel"]
    lines = [
        "# Generation funnel",
        "",
        " -> ".join(f"{k}: **{v}**" for k, v in funnel.items()),
        "",
        "## Self-evaluation bias",
        "",
    ]
    lines += ["| model | self pass rate | cross pass rate | bias |", "|---|---|---|---|"]
    for model, row in analysis["self_evaluation"].items():
        lines.append(
            f"| {model} | {row['self_pass_rate']:.3f} | {row['cross_pass_rate']:.3f} | {row['self_evaluation_bias']:+.3f} |"
        )
    lines += [
        "",
        "## Verdict consistency",
        "",
        "A stated PASS that the verifier's own criteria contradict counts as FAIL; a FAIL with every "
        "criterion true stays FAIL. Both are inconsistent.",
        "",
        "| verifier | stated verdicts | inconsistent | rate | PASS overruled | FAIL with all criteria met |",
        "|---|---|---|---|---|---|",
    ]
    for verifier, row in analysis.get("verifier_consistency", {}).items():
        lines.append(
            f"| {verifier} | {row['stated']} | {row['inconsistent']} | {_fmt(row['inconsistency_rate'])} | "
            f"{row['pass_overruled']} | {row['fail_with_all_criteria_met']} |"
        )
    rejected = analysis.get("precheck_failures") or {}
    lines += ["", "## Pre-check rejections", ""]
    lines += [f"- {rule}: {n}" for rule, n in rejected.items()] or ["none"]
    lines += ["", "## Verifier agreement (Cohen's kappa)", "", "| a | b | kappa | n | note |", "|---|---|---|---|---|"]
    for row in analysis["verifier_kappa"]:
        lines.append(
            f"| {row['verifier_a']} | {row['verifier_b']} | {row['kappa']:.3f} | {row['n']} | {row['reason'] or ''} |"
        )
    matched = analysis.get("matched_set")
    if matched:
        rejects = ", ".join(f"{gen}: {row['precheck_rejects']}" for gen, row in matched["by_generator"].items())
        lines += [
            "",
            "## Matched set (paper §4.2 RQ1)",
            "",
            f"{matched['matched_assignments']} of {matched['assignments']} assignments matched (every generator attempted them, no call error); "
            f"unparsed and pre-check-rejected candidates count as FAIL (pre-check rejects: {rejects or 'none'}).",
            "",
            f"Averaged self pass rate **{_fmt(matched['self_pass_rate'])}** vs cross **{_fmt(matched['cross_pass_rate'])}**; "
            f"mean verifier kappa {_fmt(matched['mean_kappa'])}.",
        ]
    return "\n".join(lines)
