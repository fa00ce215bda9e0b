"""Agreement of human labels: between annotators, and between an evaluator and the humans.

Both methods measure it the same way: KnowOrNot for its evaluation specs, RefusalBench's
audit for PASS/FAIL verdicts against the verifiers. The kappas are ``core.stats``'.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.human_labels import AgreementReport, HumanLabel
from refusalbench.tasks.core.stats import cohens_kappa, fleiss_kappa, fleiss_matrix


def agreement(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> AgreementReport:
    """Percent agreement, Cohen's kappa and confusion matrix (rows = ``a``, columns = ``b``)."""
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    position = {c: i for i, c in enumerate(categories)}
    confusion = [[0] * len(categories) for _ in categories]
    for x, y in zip(a, b):
        confusion[position[x]][position[y]] += 1
    n = len(a)
    return AgreementReport(
        n=n,
        percent_agreement=(sum(x == y for x, y in zip(a, b)) / n) if n else float("nan"),
        kappa=cohens_kappa(a, b, categories),
        labels=categories,
        confusion=confusion,
    )


def _labels_by_annotator(labels: Iterable[HumanLabel], spec: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for label in labels:
        if label.spec == spec:
            out.setdefault(label.annotator, {})[label.item_id] = label.label  # the latest label wins
    return out


def annotator_agreement(labels: Iterable[HumanLabel], spec: EvalSpec) -> dict[str, Any]:
    """Pairwise Cohen's kappa on shared items, and Fleiss' kappa over items every annotator labelled."""
    by_annotator = _labels_by_annotator(labels, spec.name)
    annotators = sorted(by_annotator)
    pairwise = {}
    for x, y in itertools.combinations(annotators, 2):
        shared = sorted(set(by_annotator[x]) & set(by_annotator[y]))
        pairwise[f"{x}|{y}"] = agreement(
            [by_annotator[x][i] for i in shared], [by_annotator[y][i] for i in shared], spec.outcomes
        ).model_dump()
    common = sorted(set.intersection(*(set(v) for v in by_annotator.values()))) if len(annotators) >= 2 else []
    fleiss = (
        fleiss_kappa(fleiss_matrix([[by_annotator[a][i] for a in annotators] for i in common], spec.outcomes))
        if common
        else float("nan")
    )
    return {"annotators": annotators, "pairwise": pairwise, "fleiss_kappa": fleiss, "fleiss_items": len(common)}


def evaluator_vs_human(
    labels: Iterable[HumanLabel], evaluator_outcomes: Mapping[str, str | None], spec: EvalSpec
) -> dict[str, AgreementReport]:
    """Agreement of the evaluator with each annotator and with the human consensus.

    ``evaluator_outcomes`` maps item id -> the evaluator's outcome (None = unparsable; such
    items are skipped). Rows of each confusion matrix are the humans, columns the evaluator.
    "consensus" uses the items on which every annotator who labelled them agrees.
    """
    by_annotator = _labels_by_annotator(labels, spec.name)
    reports: dict[str, AgreementReport] = {}
    for annotator, given in sorted(by_annotator.items()):
        items = sorted(i for i in given if evaluator_outcomes.get(i) is not None)
        reports[annotator] = agreement([given[i] for i in items], [evaluator_outcomes[i] for i in items], spec.outcomes)  # type: ignore[misc]
    votes: dict[str, set[str]] = {}
    for given in by_annotator.values():
        for item_id, label in given.items():
            votes.setdefault(item_id, set()).add(label)
    agreed = sorted(i for i, v in votes.items() if len(v) == 1 and evaluator_outcomes.get(i) is not None)
    reports["consensus"] = agreement([next(iter(votes[i])) for i in agreed], [evaluator_outcomes[i] for i in agreed], spec.outcomes)  # type: ignore[misc]
    return reports
