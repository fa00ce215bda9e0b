"""Several evaluator models over the same responses, each against the human consensus (App. D.3).

The paper picked its evaluator by scoring candidates against two annotators' consensus:
TP/TN/FP/FN for abstention detection (Table 3), accuracy, precision, recall and F1 for
factuality (Table 4). A run names the candidates in ``knowornot.evaluator_comparison``; they
judge the label sample (each spec on its own sample's rows, through ``model_steps.evaluate_outputs``
like the run's evaluator) in their own stage, into ``evaluator_comparison.parquet``. Labels come
from people after the run, so the scores are computed when agreement is (``knowornot agreement``)
and shown in the rebuilt report: the run's evaluator (``evaluations.parquet``) and each candidate,
per spec, on the outcome the spec counts as positive (``EvalSpec.positive_outcome``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.html_page import escape, frame_table
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.labelling.agreement import binary_scores

# The columns of the comparison table, in the paper's order.
COMPARISON_COLUMNS = (
    "evaluator",
    "role",
    "n",
    "tp",
    "tn",
    "fp",
    "fn",
    "errors",
    "accuracy",
    "precision",
    "recall",
    "f1",
)


def evaluator_outcomes(store: ArtifactStore, spec: str) -> dict[str, tuple[str, dict[str, str | None]]]:
    """Evaluator name -> (its role: ``run`` or ``comparison``, item id -> its outcome of ``spec``; None when
    its reply did not parse). The run's own evaluator first; a candidate that is also the run's
    evaluator is the same calls (cached), shown once."""
    out: dict[str, tuple[str, dict[str, str | None]]] = {}
    for artifact, role in ((kon_files.EVALUATIONS, "run"), (kon_files.EVALUATOR_COMPARISON, "comparison")):
        if not store.has(artifact):
            continue
        for outcome in store.load(artifact):
            if outcome.spec == spec and (outcome.evaluator not in out or out[outcome.evaluator][0] == role):
                out.setdefault(outcome.evaluator, (role, {}))[1][outcome.experiment_id] = outcome.outcome
    return out


def compare_with_consensus(
    outcomes: Mapping[str, tuple[str, Mapping[str, str | None]]], consensus: Mapping[str, str], spec: EvalSpec
) -> list[dict[str, Any]]:
    """One row per evaluator: its confusion counts and scores against the human consensus of ``spec``.

    ``errors``: consensus items the evaluator gave no parsable outcome for (left out of ``n``).
    """
    rows = []
    for name, (role, given) in outcomes.items():
        judged = {item: given.get(item) for item in consensus}
        scores = binary_scores(consensus, judged, spec.positive_outcome)
        rows.append(
            {"evaluator": name, "role": role, **scores.model_dump(), "errors": sum(v is None for v in judged.values())}
        )
    return rows


def comparison_html(rows: Sequence[Mapping[str, Any]], open_items: Sequence[str] = ()) -> str:
    """The report's table of one spec: each evaluator against the human consensus, and the open disagreements."""
    parts = []
    if open_items:
        parts.append(
            f"<p>{len(open_items)} item(s) the annotators labelled differently wait for a consensus pass "
            "(<code>knowornot label RUN --spec SPEC --annotator NAME --consensus</code>); until then they "
            "are left out of the consensus.</p>"
        )
    if not rows:
        return "".join(parts)
    positive = rows[0].get("positive")
    table = pd.DataFrame(
        [{column: row.get(column) for column in COMPARISON_COLUMNS} for row in rows], columns=list(COMPARISON_COLUMNS)
    )
    parts.append(
        f"<p>Evaluators against the human consensus (App. D.3), positive = <b>{escape(positive)}</b>; "
        "n = consensus items with a parsable verdict, errors = consensus items without one:</p>" + frame_table(table)
    )
    return "".join(parts)
