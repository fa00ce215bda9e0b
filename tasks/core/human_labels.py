"""Human labels, the records both methods' labelling shares.

An annotator sees a :class:`LabelItem`, gives a :class:`HumanLabel` (one JSON line in
``labels/<spec>.jsonl``), and two raters' labels over the same items give an
:class:`AgreementReport`. KnowOrNot labels its evaluation specs with them; RefusalBench's
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

    @model_validator(mode="after")
    def _square(self) -> AgreementReport:
        if len(self.confusion) != len(self.labels) or any(len(r) != len(self.labels) for r in self.confusion):
            raise ValueError("confusion matrix must be len(labels) x len(labels)")
        return self
