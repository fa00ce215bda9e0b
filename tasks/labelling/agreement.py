"""Agreement of human labels: between annotators, and between an evaluator and the humans.

Both methods measure it the same way: KnowOrNot for its evaluation specs, RefusalBench's
audit for PASS/FAIL verdicts against the verifiers. The kappas and intervals are ``core.stats``'
(Wilson for shares, a seeded percentile bootstrap over items for kappa).

Where annotators disagree, ``disagreements`` lists the items for a consensus pass; the labels it
records (kept apart, one per item, the latest winning) and the items every annotator agreed on
make the human consensus (``consensus_labels``) that an evaluator is scored against
(``binary_scores``: TP/TN/FP/FN, accuracy, precision, recall, F1 on one positive outcome).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.human_labels import AgreementReport, BinaryScores, HumanLabel
from refusalbench.tasks.core.stats import (
    cohens_kappa,
    fleiss_kappa,
    fleiss_matrix,
    percentile_interval,
    seeded_rng,
    wilson_interval,
)

# Resamples of the kappa interval: items are few (the paper labelled 200-340), about 0.5 s per interval.
KAPPA_RESAMPLES = 1000


def kappa_interval(
    a: Sequence[str], b: Sequence[str], labels: Sequence[str], seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile-bootstrap interval of Cohen's kappa, the items resampled (seeded: the same labels give
    the same interval)."""
    if not a:
        return float("nan"), float("nan")
    rng = seeded_rng(seed, "|".join(map(str, labels)) + f"|{len(a)}")
    draws = rng.integers(0, len(a), size=(KAPPA_RESAMPLES, len(a)))
    first, second = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    kappas = np.array([cohens_kappa(list(first[d]), list(second[d]), labels) for d in draws])
    return percentile_interval(kappas, level)


def agreement(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> AgreementReport:
    """Percent agreement (Wilson interval), Cohen's kappa (bootstrap interval) and confusion matrix
    (rows = ``a``, columns = ``b``)."""
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    position = {c: i for i, c in enumerate(categories)}
    confusion = [[0] * len(categories) for _ in categories]
    for x, y in zip(a, b):
        confusion[position[x]][position[y]] += 1
    n = len(a)
    matches = sum(x == y for x, y in zip(a, b))
    return AgreementReport(
        n=n,
        percent_agreement=(matches / n) if n else float("nan"),
        kappa=cohens_kappa(a, b, categories),
        labels=categories,
        confusion=confusion,
        percent_agreement_ci=list(wilson_interval(matches, n)),
        kappa_ci=list(kappa_interval(a, b, categories)),
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


def disagreements(labels: Iterable[HumanLabel], spec: str) -> dict[str, dict[str, str]]:
    """Items two or more annotators labelled differently: item id -> {annotator: label}."""
    votes: dict[str, dict[str, str]] = {}
    for annotator, given in _labels_by_annotator(labels, spec).items():
        for item_id, label in given.items():
            votes.setdefault(item_id, {})[annotator] = label
    return {item: dict(sorted(v.items())) for item, v in sorted(votes.items()) if len(set(v.values())) > 1}


def consensus_labels(labels: Iterable[HumanLabel], consensus: Iterable[HumanLabel], spec: str) -> dict[str, str]:
    """The human consensus: item id -> label where every annotator who labelled it agrees, or where a
    consensus pass recorded a label for a disagreement (the latest recorded wins). Disagreements
    without one are left out."""
    labels = list(labels)
    agreed: dict[str, set[str]] = {}
    for given in _labels_by_annotator(labels, spec).values():
        for item_id, label in given.items():
            agreed.setdefault(item_id, set()).add(label)
    out = {item: next(iter(v)) for item, v in agreed.items() if len(v) == 1}
    open_items = set(disagreements(labels, spec))
    for record in consensus:
        if record.spec == spec and record.item_id in open_items:
            out[record.item_id] = record.label
    return dict(sorted(out.items()))


def evaluator_vs_human(
    labels: Iterable[HumanLabel],
    evaluator_outcomes: Mapping[str, str | None],
    spec: EvalSpec,
    consensus: Iterable[HumanLabel] = (),
) -> dict[str, AgreementReport]:
    """Agreement of the evaluator with each annotator and with the human consensus.

    ``evaluator_outcomes`` maps item id -> the evaluator's outcome (None = unparsable; such
    items are skipped). Rows of each confusion matrix are the humans, columns the evaluator.
    "consensus" uses the items on which every annotator who labelled them agrees, and the
    disagreements a consensus pass resolved (``consensus``).
    """
    labels = list(labels)
    by_annotator = _labels_by_annotator(labels, spec.name)
    reports: dict[str, AgreementReport] = {}
    for annotator, given in sorted(by_annotator.items()):
        items = sorted(i for i in given if evaluator_outcomes.get(i) is not None)
        reports[annotator] = agreement([given[i] for i in items], [evaluator_outcomes[i] for i in items], spec.outcomes)  # type: ignore[misc]
    agreed = {
        i: label
        for i, label in consensus_labels(labels, consensus, spec.name).items()
        if evaluator_outcomes.get(i) is not None
    }
    reports["consensus"] = agreement(list(agreed.values()), [evaluator_outcomes[i] for i in agreed], spec.outcomes)  # type: ignore[misc]
    return reports


def binary_scores(human: Mapping[str, str], evaluator: Mapping[str, str | None], positive: str) -> BinaryScores:
    """An evaluator against human labels (item id -> outcome) with ``positive`` as the positive class.

    Scored on the items both have (an unparsable evaluator reply, None, is left out, as in the
    paper's sample counts). Precision = TP / (TP + FP), recall = TP / (TP + FN), F1 their harmonic
    mean, 2TP / (2TP + FP + FN).
    """
    items = [i for i in human if evaluator.get(i) is not None]
    said = [(human[i] == positive, evaluator[i] == positive) for i in items]
    tp = sum(h and e for h, e in said)
    tn = sum(not h and not e for h, e in said)
    fp = sum(e and not h for h, e in said)
    fn = sum(h and not e for h, e in said)

    def share(k: int, n: int) -> float:
        return k / n if n else math.nan

    precision, recall = share(tp, tp + fp), share(tp, tp + fn)
    return BinaryScores(
        positive=positive,
        n=len(items),
        tp=tp,
        tn=tn,
        fp=fp,
        fn=fn,
        accuracy=share(tp + tn, len(items)),
        precision=precision,
        recall=recall,
        f1=share(2 * tp, 2 * tp + fp + fn),
        accuracy_ci=list(wilson_interval(tp + tn, len(items))),
        precision_ci=list(wilson_interval(tp, tp + fp)),
        recall_ci=list(wilson_interval(tp, tp + fn)),
    )
