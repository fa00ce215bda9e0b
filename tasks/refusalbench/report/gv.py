"""The report's generator × verifier section: funnel and verdict consistency first, then the rest.

The funnel and the verdict-consistency table lead because they say how far to trust the
benchmark's contents; every other part of ``gv_analysis.json`` follows as generic tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.core.html_page import escape, is_nan, mapping_html
from refusalbench.tasks.refusalbench.report.headings import heading

_CONSISTENCY_COLUMNS = (
    ("stated", "stated verdicts"),
    ("inconsistent", "inconsistent"),
    ("inconsistency_rate", "inconsistency rate"),
    ("pass_overruled", "PASS overruled (counted as FAIL)"),
    ("fail_with_all_criteria_met", "FAIL with every criterion true"),
)
_LEADING = ("funnel", "verifier_consistency", "precheck_failures", "matched_set")


def _value(value: Any) -> str:
    if is_nan(value):
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else escape(value)


def _funnel_html(funnel: Mapping[str, Any]) -> str:
    steps = " → ".join(f"{escape(step)} <b>{escape(n)}</b>" for step, n in funnel.items())
    return f"<h3>Funnel</h3><p>{steps}</p>"


def _consistency_html(consistency: Mapping[str, Mapping[str, Any]]) -> str:
    head = "<tr><th class='name'>verifier</th>" + "".join(
        f"<th>{escape(label)}</th>" for _, label in _CONSISTENCY_COLUMNS
    )
    rows = "".join(
        f"<tr><td class='name'>{escape(verifier)}</td>"
        + "".join(f"<td>{_value(row.get(key))}</td>" for key, _ in _CONSISTENCY_COLUMNS)
        + "</tr>"
        for verifier, row in consistency.items()
    )
    note = (
        "<p class='note'>A verdict that contradicts the verifier's own criteria is inconsistent: a PASS with a "
        "criterion false counts as FAIL; a FAIL with every criterion true stays FAIL.</p>"
    )
    return f"<h3>Verdict consistency</h3>{note}<table>{head}</tr>{rows}</table>"


def _precheck_html(rejected: Mapping[str, int]) -> str:
    if not rejected:
        return "<h3>Pre-check rejections</h3><p class='note'>No candidate failed a pre-check.</p>"
    rows = "".join(f"<tr><td class='name'>{escape(rule)}</td><td>{int(n)}</td></tr>" for rule, n in rejected.items())
    return f"<h3>Pre-check rejections</h3><table><tr><th class='name'>rule</th><th>candidates</th></tr>{rows}</table>"


def _percent(value: Any) -> str:
    return "—" if value is None or is_nan(value) else f"{100 * value:.1f}%"


def _interval(bounds: Any) -> str:
    if not bounds or any(b is None or is_nan(b) for b in bounds):
        return ""
    return f" <span class='note'>[{100 * bounds[0]:.1f}, {100 * bounds[1]:.1f}]</span>"


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A table whose first column names the row (``rows``: cells already HTML)."""
    name = " class='name'"
    cells = "".join(
        "<tr>" + "".join(f"<td{name if i == 0 else ''}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return (
        "<table><tr>"
        + "".join(f"<th{name if i == 0 else ''}>{escape(h)}</th>" for i, h in enumerate(head))
        + f"</tr>{cells}</table>"
    )


def matched_set_html(matched: Mapping[str, Any]) -> str:
    """The matched-set comparison (paper §4.2 RQ1): self vs cross per model and averaged, kappa,
    pre-check rejects counted as failures, per-criterion failure rates per verifier."""
    excluded = matched.get("excluded_assignments") or {}
    lead = (
        f"<p>{int(matched['matched_assignments'])} of {int(matched['assignments'])} assignments (base item × lever: "
        "class and intensity) were attempted by every generator "
        f"({int(excluded.get('not_attempted_by_every_generator', 0))} were not, "
        f"{int(excluded.get('call_error', 0))} had a call error). On them every verification outcome counts, and a "
        "candidate that never reached the verifiers (unparsed or rejected by a pre-check) counts as FAIL from "
        f"every verifier. Averaged over the models that generate and verify: self pass rate "
        f"<b>{_percent(matched.get('self_pass_rate'))}</b> vs cross pass rate "
        f"<b>{_percent(matched.get('cross_pass_rate'))}</b> (paper, RefusalBench-NQ: 91.0% vs 82.1%); mean "
        f"verifier kappa <b>{_value(matched.get('mean_kappa'))}</b> over "
        f"{int(matched.get('kappa_pairs_defined', 0))} defined pair(s).</p>"
    )
    bias = matched.get("self_evaluation") or {}
    rows = [
        [
            escape(model),
            _percent(row.get("self_pass_rate")) + _interval(row.get("self_interval")),
            _percent(row.get("cross_pass_rate")) + _interval(row.get("cross_interval")),
            _value(row.get("self_evaluation_bias")),
            escape(row.get("n_self")),
            escape(row.get("n_cross")),
        ]
        for model, row in bias.items()
    ]
    self_table = (
        _table(
            ["model", "self pass rate [95% CI]", "cross pass rate [95% CI]", "self − cross", "n self", "n cross"], rows
        )
        if rows
        else "<p class='note'>No model both generates and verifies.</p>"
    )
    gens = matched.get("by_generator") or {}
    gen_table = _table(
        ["generator", "matched candidates", "unparsed (FAIL)", "pre-check rejects (FAIL)"],
        [
            [escape(g), escape(r.get("candidates")), escape(r.get("unparsed")), escape(r.get("precheck_rejects"))]
            for g, r in gens.items()
        ],
    )
    failures = matched.get("criterion_failure_rates") or {}
    criteria = list(next(iter(failures.values()), {}).keys())
    verdicts = matched.get("criterion_verdicts") or {}
    criteria_table = _table(
        ["verifier", "verdicts", *[c.replace("_", " ") for c in criteria]],
        [[escape(v), escape(verdicts.get(v, 0)), *[_percent(r.get(c)) for c in criteria]] for v, r in failures.items()],
    )
    return (
        "<h3>Matched-set comparison (self vs cross)</h3>"
        + lead
        + self_table
        + gen_table
        + "<h4>Criteria judged false, per verifier (share of its verdicts on the matched set)</h4>"
        + criteria_table
    )


def base_sample_domains_html(counts: Mapping[str, Any]) -> str:
    """The base sample per domain (``base_sample_by: domain``) from the manifest's counts; '' when not drawn so."""
    draw = counts.get("base_sample_by_domain")
    if not draw:
        return ""
    columns = ("share", "available", "sampled", "shortfall")
    head = "<tr><th class='name'>domain</th>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    rows = "".join(
        f"<tr><td class='name'>{escape(domain)}</td>"
        + "".join(f"<td>{_value(row.get(c))}</td>" for c in columns)
        + "</tr>"
        for domain, row in draw.items()
    )
    short = counts.get("base_sample_shortfall") or {}
    note = (
        f"<p class='note'><b>Shortfall</b>: {escape(', '.join(sorted(short)))} had fewer items left after the "
        "pre-test than their share; their items are all in the sample, and no other domain made up for them.</p>"
        if short
        else ""
    )
    return (
        "<h3>Base sample by domain</h3><p>Equal shares per domain (<code>base_sample_by: domain</code>), drawn "
        f"from the items the pre-test kept (available).</p><table>{head}{rows}</table>{note}"
    )


def unverified_note(analysis: Mapping[str, Any] | None) -> str:
    """A warning when the run kept candidates without a verification filter (``filter: none``); else ''."""
    if not analysis or analysis.get("filter") != "none":
        return ""
    return (
        "<p class='note'><b>Not a verified benchmark</b> (<code>filter: none</code>): every candidate that passed "
        "the pre-checks was kept whatever the verifiers said; their verdicts are recorded and analysed in the "
        "generator × verifier section.</p>"
    )


def gv_section_html(analysis: Mapping[str, Any]) -> str:
    """The body of the report's G-V section (HTML, every data value escaped)."""
    parts = [unverified_note(analysis)]
    if analysis.get("funnel"):
        parts.append(_funnel_html(analysis["funnel"]))
    if analysis.get("verifier_consistency"):
        parts.append(_consistency_html(analysis["verifier_consistency"]))
    if "precheck_failures" in analysis:
        parts.append(_precheck_html(analysis["precheck_failures"] or {}))
    if analysis.get("matched_set"):
        parts.append(matched_set_html(analysis["matched_set"]))
    parts.append(mapping_html({k: v for k, v in analysis.items() if k not in _LEADING}, heading=heading))
    return "".join(parts)
