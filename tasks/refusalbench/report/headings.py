"""Readable headings for the keys of RefusalBench's data files, wherever the report shows them.

The report shows parts of ``gv_analysis.json`` and ``manifest.json`` as tables under one
heading per key. A key is written for code (``pass_rate_matrix``); a reader gets
:data:`HEADINGS`' title for it, or the key's words (``core.html_page.readable_heading``) for a
key not listed here (a plugin's, a newer file's).
"""

from __future__ import annotations

from refusalbench.tasks.core.html_page import readable_heading

HEADINGS: dict[str, str] = {
    # gv_analysis.json
    "pass_rate_matrix": "Pass rate per generator × verifier",
    "judged_counts": "Candidates judged per generator × verifier",
    "self_evaluation": "Self-evaluation bias per model",
    "verifier_kappa": "Agreement between verifiers (Cohen's kappa)",
    "verifier_consistency": "Verdict consistency of each verifier",
    "pass_rate_by_class": "Pass rate by perturbation class",
    "pass_rate_by_intensity": "Pass rate by intensity",
    "acceptance_by_stratum": "Acceptance by stratum (class / intensity)",
    "funnel": "Candidate funnel",
    "precheck_failures": "Pre-check failures",
    "status_counts": "Candidates by status",
    "verdict_counts": "Verdicts by value",
    "filter": "Verification filter",
    "shortfalls": "Strata short of their target",
    "matched_set": "Matched-set comparison (self vs cross)",
    "pass_rate_by_generator_class": "Pass rate by generator × class",
    "pass_rate_by_generator_intensity": "Pass rate by generator × intensity",
    "self_evaluation_by_class": "Self-evaluation bias by class",
    "benchmark_composition": "Benchmark composition",
    "accepted_by_generator_class": "Accepted candidates by generator × class",
    "sampled_by_generator_class": "Sampled items by generator × class",
    # manifest.json
    "config": "Configuration",
    "models": "Models",
    "generation": "Generation settings",
    "evaluation": "Evaluation settings",
    "prompt_hashes": "Prompt template hashes",
    "timings_s": "Stage wall times (s)",
    "timings": "Clocks (wall and CPU time)",
    "counts": "Counts",
    "calls": "Model calls",
    "costs": "Tokens and cost",
    "structured_output_fallbacks": "Structured-output fallbacks",
    "notes": "Notes",
    "artifacts": "Files written",
    "respond_outcomes": "Reply outcomes per target",
    "response_errors": "Failed replies per target",
    "excluded_from_metrics": "Rows left out of the metrics",
    "judged_by_model": "Judged rows per target",
    "outcomes_by_model": "Outcomes per target",
    "incomplete": "Incomplete targets",
    "base_set_funnel": "Base-set funnel",
    "pretest_by_model": "Pre-test answers per model",
    "by_stage": "By stage",
    "by_model": "By model",
    "total": "Total",
}


def heading(key: str) -> str:
    """The reader's heading of a data key (:data:`HEADINGS`, else its words)."""
    return readable_heading(key, HEADINGS)
