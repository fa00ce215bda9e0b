"""The report's "Answer vs refusal decision" section: who decided, and the code parser's agreement with the judge.

With ``evaluation.decision: judge`` (the paper's protocol, App. D) the judge classifies each reply as
an answer attempt or a refusal with its category; the refusal-code parser is the cheap first pass.
The table shows, per model, how often the parser would have decided the same on the replies the
judge classified, and how it goes wrong: prose refusals it takes for answers, codes quoted inside
an answer it takes for refusals. Read from the manifest's ``counts`` (``decision``,
``parser_agreement``, written by the score stage).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from refusalbench.tasks.core.html_page import escape, section

_COLUMNS = (
    ("judge_decided", "judge-decided replies", "scored replies the judge classified"),
    ("agreement", "parser agrees", "share of those where the code parser's decision is the judge's"),
    ("prose_refusals_missed", "prose refusals missed", "the judge saw a refusal, the parser an answer (no code)"),
    (
        "quoted_codes_as_refusals",
        "quoted codes taken as refusals",
        "the judge saw an answer, the parser a refusal (a code quoted in the answer)",
    ),
    ("other_code", "other code", "both saw a refusal, with different codes"),
    ("parser_decided", "parser-decided replies", "replies that were only a refusal code (no judge call needed)"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.1f}%" if isinstance(value, float) else str(value)


def decision_section(manifest: Mapping[str, Any] | None, order: Sequence[str]) -> str | None:
    """The section, or None when the run folder does not say how decisions were made (e.g. ``score FILE``)."""
    counts = (manifest or {}).get("counts") or {}
    decision = counts.get("decision")
    if decision is None:
        return None
    if decision == "codes":
        return section(
            "Answer vs refusal decision",
            "<p>Decided by the refusal-code parser (<code>decision: codes"
            "</code>, judge-free): a reply containing a refusal code is a refusal with that code, any other "
            "reply an answer attempt; the judge graded answers to answerable items only.</p>",
        )
    agreement: Mapping[str, Mapping[str, Any]] = counts.get("parser_agreement") or {}
    head = (
        "<tr><th class='name'>Model</th>"
        + "".join(f"<th title='{escape(tip)}'>{escape(label)}</th>" for _, label, tip in _COLUMNS)
        + "</tr>"
    )
    models = [m for m in order if m in agreement] + sorted(set(agreement) - set(order))
    rows = "".join(
        f"<tr><td class='name'>{escape(m)}</td>"
        + "".join(f"<td>{_cell(agreement[m].get(key))}</td>" for key, _, _ in _COLUMNS)
        + "</tr>"
        for m in models
    )
    lead = (
        "<p>Decided by the judge (<code>decision: judge</code>, the paper's protocol): it classified each reply "
        "as an answer attempt or a refusal with its category, in the same call that graded answers to answerable "
        "items. A reply that is nothing but one refusal code (markup and a final CONFIDENCE line allowed) is "
        "unambiguous and was decided by the refusal-code parser without a call. The table compares the parser, "
        "the judge-free decision, with the judge on the replies the judge classified.</p>"
    )
    return section("Answer vs refusal decision", lead + (f"<table>{head}{rows}</table>" if rows else ""))
