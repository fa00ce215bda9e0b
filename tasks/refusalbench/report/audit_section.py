"""The report's human-audit section: ``audit.json`` in the form of the seed paper's Table 2.

Pass rate per perturbation class (then per intensity, then all items) with 95% intervals,
kappa between annotators, and how often the humans agree with the verifier consensus.
Takes the audit as a plain mapping (``AuditDocument.model_dump(mode="json")``), as the
page takes the G-V analysis; every value that comes from data is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from refusalbench.tasks.core.html_page import escape, is_nan
from refusalbench.tasks.refusalbench.report.leaderboard import format_interval, format_value


def _rate_cells(rate: Mapping[str, Any]) -> str:
    interval = format_interval((rate.get("ci_low"), rate.get("ci_high")), "pass_rate")  # type: ignore[arg-type]
    ci = f"<br><span class='ci'>{escape(interval)}</span>" if interval else ""
    return f"<td>{int(rate.get('n', 0))}</td><td>{escape(format_value(rate.get('pass_rate'), 'pass_rate'))}{ci}</td>"


def _rates_table(heading: str, rates: Sequence[Mapping[str, Any]], total: Mapping[str, Any] | None = None) -> str:
    rows = [f"<tr><td class='name'>{escape(r['value'])}</td>{_rate_cells(r)}</tr>" for r in rates]
    if total is not None:
        rows.append(f"<tr><th class='name'>All items</th>{_rate_cells(total)}</tr>")
    head = f"<tr><th class='name'>{escape(heading)}</th><th>n</th><th>human pass rate</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _kappa(value: Any) -> str:
    return "undefined" if is_nan(value) else f"{float(value):.3f}"


def _agreement_table(
    first_column: str, reports: Mapping[str, Mapping[str, Any]], axes: str, names: Mapping[str, str] | None = None
) -> str:
    head = (
        f"<tr><th class='name'>{escape(first_column)}</th><th>n</th><th>agreement</th><th>Cohen's kappa</th>"
        f"<th class='name'>confusion ({escape(axes)})</th></tr>"
    )
    rows = []
    for key, report in reports.items():
        name = (names or {}).get(key, key)
        labels = report.get("labels", [])
        confusion = "; ".join(
            f"{a}: " + " / ".join(f"{b} {count}" for b, count in zip(labels, row))
            for a, row in zip(labels, report.get("confusion", []))
        )
        rows.append(
            f"<tr><td class='name'>{escape(name)}</td><td>{int(report.get('n', 0))}</td>"
            f"<td>{escape(format_value(report.get('percent_agreement'), 'agreement'))}</td>"
            f"<td>{escape(_kappa(report.get('kappa')))}</td><td class='name'>{escape(confusion)}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def audit_html(audit: Mapping[str, Any]) -> str:
    """The section's body (HTML, escaped)."""
    per_stratum = audit.get("sampled_per_stratum", {})
    labels = audit.get("labels_per_annotator", {})
    lead = (
        f"<p>{int(audit.get('sample_size', 0))} benchmark items sampled over {len(per_stratum)} "
        f"class × intensity strata; {sum(labels.values())} verdicts by {len(labels)} annotator(s) "
        f"({escape(', '.join(labels))}). An item's verdict: {escape(audit.get('item_rule', ''))}. "
        f"Brackets: {escape(audit.get('interval', ''))}.</p>"
    )
    parts = [
        lead,
        "<h3>Pass rate by perturbation class (Table 2 form)</h3>",
        _rates_table("Perturbation class", audit.get("by_class", []), audit.get("overall")),
        "<h3>Pass rate by intensity</h3>",
        _rates_table("Intensity", audit.get("by_intensity", [])),
    ]

    agreement = audit.get("annotator_agreement", {})
    if len(agreement.get("annotators", [])) >= 2:
        kind = {"cohen": "Cohen's", "fleiss": "Fleiss'"}.get(agreement.get("kappa_kind") or "", "")
        parts.append(
            f"<h3>Agreement between annotators</h3><p>{escape(kind)} kappa "
            f"{escape(_kappa(agreement.get('kappa')))} over {int(agreement.get('kappa_items') or 0)} items "
            f"(Fleiss' kappa over all annotators: {escape(_kappa(agreement.get('fleiss_kappa')))}).</p>"
        )
        parts.append(
            _agreement_table("annotator pair", agreement.get("pairwise", {}), "rows: first annotator, columns: second")
        )

    versus = audit.get("verifier_agreement", {})
    parts.append("<h3>Humans vs verifier consensus</h3>")
    if versus:
        parts.append(
            f"<p class='note'>{escape(audit.get('verifier_rule', ''))}. Kappa is undefined when one side "
            "gave a single verdict throughout (the usual case for items that passed a unanimous filter).</p>"
        )
        parts.append(
            _agreement_table(
                "annotator",
                versus,
                "rows: humans, columns: verifier consensus",
                {"consensus": "all annotators, on the items they agree on"},
            )
        )
    else:
        parts.append(f"<p class='note'>{escape(audit.get('verifier_rule', 'no verifier verdicts'))}.</p>")

    failed = audit.get("failed_criteria", {})
    if failed:
        rows = "".join(
            f"<tr><td class='name'>{escape(name)}</td><td>{int(count)}</td></tr>" for name, count in failed.items()
        )
        parts.append(
            "<h3>Criteria the annotators found broken</h3>"
            f"<table><tr><th class='name'>criterion</th><th>FAIL verdicts naming it</th></tr>{rows}</table>"
        )
    by_annotator = audit.get("by_annotator", [])
    if len(by_annotator) > 1:
        parts.append("<h3>Pass rate per annotator</h3>" + _rates_table("Annotator", by_annotator))
    return "".join(parts)
