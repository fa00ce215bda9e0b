"""The top of the KnowOrNot report: the summary card, read from the run's manifest and metrics.

The card names the configuration, the models of each role (targets, evaluator, extractor,
the evaluators compared against the humans), the questions and knowledge bases, the cost,
the diversity filters and the warnings: a run that did not complete, configurations with
too few judged responses for an interval (``core.stats.MIN_CLUSTERS``: each response is
one unit of KnowOrNot's bootstrap).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from refusalbench.tasks.core.html_page import escape, run_kind_and_status, summary_card
from refusalbench.tasks.core.stats import MIN_CLUSTERS, enough_clusters

# (role, key of the config's knowornot section)
ROLES: tuple[tuple[str, str], ...] = (
    ("Targets", "targets"),
    ("Evaluator", "evaluator"),
    ("Extractor (facts, questions, HyDE)", "extractor"),
    ("Evaluators compared with the humans", "evaluator_comparison"),
)


def _names(value: Any) -> str:
    if not value:
        return ""
    return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _cost(costs: Mapping[str, Any]) -> str:
    total = costs.get("total") or {}
    if not total:
        return ""
    unpriced = int(total.get("unpriced_calls") or 0)
    line = f"${float(total.get('priced_cost_usd') or 0):,.4f} on {int(total.get('http_calls') or 0)} calls"
    return line + (f" (and {unpriced} calls with no known price, not counted)" if unpriced else "")


def thin_configurations(metrics: pd.DataFrame) -> list[str]:
    """Configurations whose abstention rate rests on fewer judged responses than the minimum."""
    if metrics.empty or "n_abstention_judged" not in metrics.columns:
        return []
    keys = [c for c in ("knowledge_base", "target", "retrieval", "prompt") if c in metrics.columns]
    judged = pd.to_numeric(metrics["n_abstention_judged"], errors="coerce").fillna(0)
    thin = metrics[~judged.map(enough_clusters).astype(bool)]
    return [" / ".join(str(row[k]) for k in keys) for row in thin.to_dict("records")]


def summary_html(
    manifest: Mapping[str, Any] | None,
    metrics: pd.DataFrame,
    counts: Mapping[str, Any],
    filter_report: Mapping[str, Any],
    bases: int,
) -> str:
    """The summary card of a KnowOrNot run."""
    manifest = manifest or {}
    config = manifest.get("config") or {}
    section = config.get("knowornot") or {}
    rows: list[tuple[str, str]] = []
    if config or manifest.get("config_hash"):
        rows.append(
            (
                "Configuration",
                f"{escape(config.get('name', '—'))} <span class='ci'>(hash {escape(manifest.get('config_hash') or '—')})</span>",
            )
        )
    if manifest.get("run_id"):
        rows.append(("Run", escape(f"{manifest['run_id']} ({run_kind_and_status(manifest)})")))
    for role, key in ROLES:
        value = section.get(key) or (section.get("evaluator") if key == "extractor" else None)
        if value:
            rows.append((role, escape(_names(value))))
    if "Targets" not in [r[0] for r in rows] and not metrics.empty and "target" in metrics.columns:
        rows.append(("Targets", escape(", ".join(sorted(metrics["target"].astype(str).unique())))))
    used = counts.get("qa_pairs", filter_report.get("n_kept"))
    rows.append(("Questions (leave-one-out)", "—" if used is None else escape(used)))
    rows.append(("Knowledge bases", str(bases)))
    if cost := _cost(manifest.get("costs") or {}):
        rows.append(("Total cost", escape(cost)))
    rows.append(("Diversity filters", escape(filter_report.get("method", "—"))))
    warnings = []
    status = manifest.get("status")
    # "running": the report is written by the run's last stage, before the run records its end.
    if status and status not in ("completed", "running"):
        warnings.append(f"The run's status is {status}.")
    thin = thin_configurations(metrics)
    if thin:
        warnings.append(
            f"{len(thin)} configuration(s) with fewer than {MIN_CLUSTERS} judged responses: their intervals are "
            f"not shown ({'; '.join(thin[:5])}{' …' if len(thin) > 5 else ''})."
        )
    return summary_card(rows, warnings)
