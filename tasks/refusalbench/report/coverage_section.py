"""The report's "Rows not scored" section: what became of each model's rows.

A row is scored only when the model gave a usable response and, for an answer, the judge
scored it. The rest — truncated at the output limit, blocked by the provider's filter, too
long for the model's window, empty, or whose call or judging failed — are left out of every
accuracy metric and counted here, per model, with the share that was scored (coverage). A
model below ``min_coverage`` is marked incomplete, as on the leaderboard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from refusalbench.tasks.core.html_page import escape, section
from refusalbench.tasks.llm.reply_outcomes import DESCRIPTIONS, OK, ROW_OUTCOMES
from refusalbench.tasks.refusalbench.report.leaderboard import format_value, incomplete_models, incomplete_note


def coverage_section(
    metrics: Mapping[str, Mapping[str, float]],
    outcomes: Mapping[str, Mapping[str, int]] | None,
    min_coverage: float,
    order: Sequence[str],
) -> str | None:
    """The section, or None when every row of every model was scored (or outcomes are unknown)."""
    if not outcomes or all(counts.get(o, 0) == 0 for counts in outcomes.values() for o in ROW_OUTCOMES if o != OK):
        return None
    shown = [o for o in ROW_OUTCOMES if any(counts.get(o, 0) for counts in outcomes.values())]
    incomplete = incomplete_models(metrics, min_coverage)
    head = (
        "<tr><th class='name'>Model</th><th>rows</th><th>coverage</th>"
        + "".join(f"<th title='{escape(DESCRIPTIONS[o])}'>{escape(o)}</th>" for o in shown)
        + "<th>status</th></tr>"
    )
    rows = []
    for model in [m for m in order if m in outcomes] + sorted(set(outcomes) - set(order)):
        counts = outcomes[model]
        status = escape(incomplete_note(incomplete[model])) if model in incomplete else "complete"
        rows.append(
            f"<tr><td class='name'>{escape(model)}</td><td>{sum(counts.values())}</td>"
            f"<td>{format_value(metrics.get(model, {}).get('coverage'), 'coverage')}</td>"
            + "".join(f"<td>{int(counts.get(o, 0))}</td>" for o in shown)
            + f"<td>{status}</td></tr>"
        )
    unscored = [m for m, counts in outcomes.items() if not counts.get(OK, 0)]
    lead = (
        "<p>Rows without a usable response (truncated, blocked by the provider, too long, empty) or whose "
        "call or judging failed are left out of every accuracy metric; the first kind is counted in the "
        f"non-response rate. A model with less than {100 * min_coverage:.0f}% of its rows scored is "
        "incomplete: the leaderboard lists it after the ranked models, without a rank.</p>"
    )
    if unscored:
        lead += f"<p class='note'>No row could be scored for: {escape(', '.join(sorted(unscored)))}.</p>"
    return section("Rows not scored", lead + f"<table>{head}{''.join(rows)}</table>")
