"""The report's pairwise section: every pair of models, their paired differences and corrected p-values.

One row per pair (``scoring.pairwise``), the better-ranked model first: the difference in CRS,
answer and refusal accuracy with its 95% paired cluster-bootstrap interval and Holm-adjusted
p-value; a significant difference is marked. Where fewer than ``core.stats.MIN_CLUSTERS`` base
items support a pair's difference (:mod:`.support`), the cell shows the difference and
"insufficient data (n = K)": no interval, no p-value, no mark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from refusalbench.tasks.core.html_page import escape, insufficient_data, is_nan, section
from refusalbench.tasks.core.stats import enough_clusters
from refusalbench.tasks.refusalbench.report.support import ClusterSupport
from refusalbench.tasks.refusalbench.scoring.specs import metric_spec


def _cell(entry: Mapping[str, Any] | None, sign: float, n_clusters: int | None = None) -> str:
    """A signed difference in points with its interval and adjusted p; "—" if undefined; with
    ``n_clusters`` below the minimum, the difference and the guardrail's note."""
    if not entry or is_nan(entry.get("difference")):
        return "<td>—</td>"
    if n_clusters is not None and not enough_clusters(n_clusters):
        return f"<td>{100 * sign * entry['difference']:+.1f}<br><span class='ci'>{insufficient_data(n_clusters)}</span></td>"
    low, high = entry["ci"]
    low, high = (low, high) if sign > 0 else (-high if not is_nan(high) else high, -low if not is_nan(low) else low)
    interval = "" if is_nan(low) or is_nan(high) else f"[{100 * low:+.1f}, {100 * high:+.1f}]"
    p_value = entry.get("p_adjusted")
    p_text = "" if is_nan(p_value) else f"p = {p_value:.3g}"
    mark = " <b>*</b>" if entry.get("significant") else ""
    return (
        f"<td>{100 * sign * entry['difference']:+.1f}{mark}<br><span class='ci'>{escape(interval)} "
        f"{escape(p_text)}</span></td>"
    )


def pairwise_section(
    pairwise: Mapping[str, Any] | None, order: Sequence[str], support: ClusterSupport | None = None
) -> str | None:
    """The pairwise comparisons as a table (pairs in leaderboard order); None without any. With
    ``support``, a pair's cell follows the small-sample guardrail."""
    comparisons = (pairwise or {}).get("comparisons") or []
    if not comparisons or pairwise is None:
        return None
    metrics = list(pairwise.get("metrics") or [])
    position = {model: i for i, model in enumerate(order)}
    rows = []
    for comparison in sorted(
        comparisons,
        key=lambda c: sorted((position.get(c["model_a"], len(order)), position.get(c["model_b"], len(order)))),
    ):
        a, b = comparison["model_a"], comparison["model_b"]
        sign = 1.0
        if position.get(b, len(order)) < position.get(a, len(order)):
            a, b, sign = b, a, -1.0  # the better-ranked model first: differences read "first minus second"
        cells = [
            f"<td class='name'>{escape(a)}</td>",
            f"<td class='name'>{escape(b)}</td>",
            f"<td>{int(comparison.get('n_items', 0))}</td>",
        ]
        cells += [
            _cell(comparison["metrics"].get(name), sign, support.pair(a, b, name) if support else None)
            for name in metrics
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = (
        "<tr><th class='name'>Model</th><th class='name'>vs model</th><th>items</th>"
        + "".join(
            f"<th>{escape(metric_spec(name).title)}<br><span class='ci'>difference (points)</span></th>"
            for name in metrics
        )
        + "</tr>"
    )
    correction = str(pairwise.get("correction", "holm")).capitalize()
    alpha = float(pairwise.get("alpha", 0.05))
    lead = (
        f"<p>Every pair of models evaluated on the same items: the first model's score minus the second's, "
        f"with a 95% paired cluster-bootstrap interval (both models scored on the same resampled base items) "
        f"and the p-value corrected with {escape(correction)}'s method over the pairs of each metric "
        f"(family-wise error rate {alpha:g}: the chance that any difference marked * is not real stays "
        f"below {alpha:g}; chosen over a false-discovery-rate correction because each row is read as a claim "
        f"of its own). * = significant after the correction.</p>"
    )
    return section("Pairwise comparisons", lead + f"<table>{head}{''.join(rows)}</table>")
