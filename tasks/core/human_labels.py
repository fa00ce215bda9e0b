"""Human labels, the records both methods' labelling shares.

An annotator sees a :class:`LabelItem`, gives a :class:`HumanLabel` (one JSON line in
``labels/<spec>.jsonl``), and two raters' labels over the same items give an
:class:`AgreementReport`. Where annotators disagree, a consensus pass records one more
``HumanLabel`` per item (``labels/consensus/<spec>.jsonl``); an evaluator against that consensus
gives :class:`BinaryScores`. KnowOrNot labels its evaluation specs with them; RefusalBench's
audit label extends ``HumanLabel``.
"""

from __future__ import annotations

import datetime as dt

from pydantic import Field, model_validator

from refusalbench.tasks.core.tables import Record


class LabelItem(Record):
    """What an annotator sees for one response."""

    item_id: str = Field(description="the experiment_id of the labelled response")
    spec: str
    outcomes: list[str]
    question: str
    response: str
    expected_answer: str | None = None
    context: str | None = None
    shown_labels: str | None = Field(
        default=None, description="the annotators' labels, shown in a consensus pass (e.g. 'ann: yes · bob: no')"
    )


class HumanLabel(Record):
    item_id: str
    spec: str
    annotator: str
    label: str
    labelled_at: dt.datetime
    note: str | None = None


class AgreementReport(Record):
    """Agreement between two label sequences over the same items (rows of ``confusion`` = first rater)."""

    n: int
    percent_agreement: float
    kappa: float
    labels: list[str]
    confusion: list[list[int]]
    percent_agreement_ci: list[float] | None = Field(default=None, description="95% Wilson interval")
    kappa_ci: list[float] | None = Field(
        default=None, description="95% percentile-bootstrap interval (items resampled)"
    )

    @model_validator(mode="after")
    def _square(self) -> AgreementReport:
        if len(self.confusion) != len(self.labels) or any(len(r) != len(self.labels) for r in self.confusion):
            raise ValueError("confusion matrix must be len(labels) x len(labels)")
        return self


class BinaryScores(Record):
    """An evaluator against human labels on one outcome taken as positive (KnowOrNot App. D.3, Tables 3-4).

    Accuracy, precision and recall carry 95% Wilson intervals; a share with no items
    (e.g. precision when the evaluator never said positive) is NaN.
    """

    positive: str
    n: int
    tp: int
    tn: int
    fp: int
    fn: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    accuracy_ci: list[float]
    precision_ci: list[float]
    recall_ci: list[float]
