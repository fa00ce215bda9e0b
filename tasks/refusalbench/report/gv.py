"""The report's generator × verifier section: funnel and verdict consistency first, then the rest.

The funnel and the verdict-consistency table lead because they say how far to trust the
benchmark's contents; every other part of ``gv_analysis.json`` follows as generic tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.core.html_page import escape, is_nan, mapping_html

_CONSISTENCY_COLUMNS = (
    ("stated", "stated verdicts"),
    ("inconsistent", "inconsistent"),
    ("inconsistency_rate", "inconsistency rate"),
    ("pass_overruled", "PASS overruled (counted as FAIL)"),
    ("fail_with_all_criteria_met", "FAIL with every criterion true"),
)
_LEADING = ("funnel", "verifier_consistency", "precheck_failures")


def _value(value: Any) -> str:
    if is_nan(value):
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else escape(value)


def _funnel_html(funnel: Mapping[str, Any]) -> str:
    steps = " → ".join(f"{escape(step)} <b>{escape(n)}</b>" for step, n in funnel.items())
    return f"<h3>Funnel</h3><p>{steps}</p>"


def _consistency_html(consistency: Mapping[str, Mapping[str, Any]]) -> str:
    head = "<tr><th class='name'>verifier</th>" + "".join(f"<th>{escape(label)}</th>" for _, label in _CONSISTENCY_COLUMNS)
    rows = "".join(
        f"<tr><td class='name'>{escape(verifier)}</td>"
        + "".join(f"<td>{_value(row.get(key))}</td>" for key, _ in _CONSISTENCY_COLUMNS) + "</tr>"
        for verifier, row in consistency.items())
    note = ("<p class='note'>A verdict that contradicts the verifier's own criteria is inconsistent: a PASS with a "
            "criterion false counts as FAIL; a FAIL with every criterion true stays FAIL.</p>")
    return f"<h3>Verdict consistency</h3>{note}<table>{head}</tr>{rows}</table>"


def _precheck_html(rejected: Mapping[str, int]) -> str:
    if not rejected:
        return "<h3>Pre-check rejections</h3><p class='note'>No candidate failed a pre-check.</p>"
    rows = "".join(f"<tr><td class='name'>{escape(rule)}</td><td>{int(n)}</td></tr>" for rule, n in rejected.items())
    return f"<h3>Pre-check rejections</h3><table><tr><th class='name'>rule</th><th>candidates</th></tr>{rows}</table>"


def unverified_note(analysis: Mapping[str, Any] | None) -> str:
    """A warning when the run kept candidates without a verification filter (``filter: none``); else ''."""
    if not analysis or analysis.get("filter") != "none":
        return ""
    return ("<p class='note'><b>Not a verified benchmark</b> (<code>filter: none</code>): every candidate that passed "
            "the pre-checks was kept whatever the verifiers said; their verdicts are recorded and analysed in the "
            "generator × verifier section.</p>")


def gv_section_html(analysis: Mapping[str, Any]) -> str:
    """The body of the report's G-V section (HTML, every data value escaped)."""
    parts = [unverified_note(analysis)]
    if analysis.get("funnel"):
        parts.append(_funnel_html(analysis["funnel"]))
    if analysis.get("verifier_consistency"):
        parts.append(_consistency_html(analysis["verifier_consistency"]))
    if "precheck_failures" in analysis:
        parts.append(_precheck_html(analysis["precheck_failures"] or {}))
    parts.append(mapping_html({k: v for k, v in analysis.items() if k not in _LEADING}))
    return "".join(parts)
