"""The labelling both methods share (``tasks/labelling/``): one label store, one agreement."""

from __future__ import annotations

import datetime as dt

import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.human_labels import HumanLabel
from refusalbench.tasks.labelling.agreement import annotator_agreement
from refusalbench.tasks.labelling.label_store import LabelStore
from refusalbench.tasks.refusalbench.audit.human_audit import AUDIT_SPEC, AuditLabelStore
from refusalbench.tasks.refusalbench.schema.json_files import AuditLabel

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def test_a_method_keeps_its_own_label_record_in_the_shared_store(tmp_path):
    path = tmp_path / "labels" / "audit.jsonl"
    store = AuditLabelStore(path)
    store.append(
        AuditLabel(item_id="i1", annotator="ann", label="FAIL", failed_criteria=["lever_fidelity"], labelled_at=NOW)
    )
    (label,) = store.load()
    assert isinstance(label, AuditLabel) and label.failed_criteria == ["lever_fidelity"]
    assert store.labelled_ids("ann") == {"i1"}
    # A line that is not the store's record: named in the store's own words, with its line.
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"item_id": "i2"}\n')
    store.append(AuditLabel(item_id="i3", annotator="ann", label="PASS", labelled_at=NOW))
    with pytest.raises(InputError, match=r"audit\.jsonl:2: -: not an audit label"):
        store.load()
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"item_id": "i2"}\n{}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"plain\.jsonl:1: -: not a label record"):
        LabelStore(plain).load()


def test_audit_verdicts_are_measured_by_the_shared_agreement():
    labels = [
        AuditLabel(item_id=f"i{n}", annotator=who, label=verdict, labelled_at=NOW)
        for who, verdicts in (("ann", "PPFF"), ("bob", "PPFP"))
        for n, verdict in enumerate({"P": "PASS", "F": "FAIL"}[v] for v in verdicts)
    ]
    agreement = annotator_agreement(labels, AUDIT_SPEC)
    # 3 of 4 agree; p_e = 0.5 * 0.75 + 0.5 * 0.25 = 0.5 -> kappa 0.5
    assert agreement["pairwise"]["ann|bob"]["kappa"] == pytest.approx(0.5)
    assert agreement["fleiss_items"] == 4
    # Plain human labels of another spec are not counted.
    other = HumanLabel(item_id="i0", spec="abstention", annotator="cat", label="yes", labelled_at=NOW)
    assert annotator_agreement([*labels, other], AUDIT_SPEC)["annotators"] == ["ann", "bob"]
