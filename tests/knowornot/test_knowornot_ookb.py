"""Synthetic out-of-KB questions as their own experiment (KnowOrNot App. D.2) and per-base filtering
(issue 27, items 6-7): pure parts, no flow (the flow's separated rates are asserted in test_knowornot_flow)."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest
from pydantic import ValidationError

from refusalbench.tasks.core.human_labels import HumanLabel
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.human import label_screens
from refusalbench.tasks.knowornot.report.ookb_section import synthetic_ookb_html
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.records import ExperimentInput, FilterReport, QAPair
from refusalbench.tasks.knowornot.stages.evaluation import (
    LEAVE_ONE_OUT,
    SYNTHETIC_OOKB,
    knowornot_metrics,
    split_experiments,
)
from refusalbench.tasks.knowornot.stages.ookb import OOKB_VALIDITY, validity_items, validity_summary


def _row(i: int, question_id: str, ookb: bool, retrieval: str, context: list[str]) -> ExperimentInput:
    return ExperimentInput(
        experiment_id=f"e{i}",
        question_id=question_id,
        target="t",
        retrieval=retrieval,
        prompt="basic",
        context_ids=context,
        question=f"{question_id}?",
        expected_answer=None if ookb else "A.",
        ookb=ookb,
    )


def test_leave_one_out_and_synthetic_rates_are_never_pooled():
    frame = pd.DataFrame(
        {
            "target": "t",
            "retrieval": "long_context",
            "prompt": "basic",
            "ookb": [False, False, False, True],
            "abstention": ["yes", "no", "no", "yes"],
        }
    )
    parts = split_experiments(frame)
    loo, synthetic = (knowornot_metrics(parts[name], n_boot=50) for name in (LEAVE_ONE_OUT, SYNTHETIC_OOKB))
    assert loo.loc[0, "n"] == 3 and loo.loc[0, "abstention_rate"] == pytest.approx(1 / 3)
    assert synthetic.loc[0, "n"] == 1 and synthetic.loc[0, "abstention_rate"] == 1.0
    html = synthetic_ookb_html(synthetic, validity_summary(""))
    assert "their own experiment: the rates above are leave-one-out only" in html and "--spec ookb_validity" in html
    assert "<td>1.000 [1.000, 1.000]</td>" in html and "No validity labels yet." in html
    assert "no synthetic out-of-KB questions" in synthetic_ookb_html(
        knowornot_metrics(parts[SYNTHETIC_OOKB].iloc[0:0]), []
    )


def test_validity_items_show_each_synthetic_question_with_its_closest_pairs(tmp_path):
    store = ArtifactStore(tmp_path)
    store.save(kon_files.QA_PAIRS, [QAPair(id=f"p{i}", question=f"Q{i}?", answer=f"A{i}.") for i in range(3)])
    store.save(
        kon_files.EXPERIMENT_INPUTS,
        [
            _row(0, "p0", False, "basic_rag", ["p1"]),
            _row(1, "ookb-a", True, "long_context", ["p0", "p1", "p2"]),
            _row(2, "ookb-a", True, "basic_rag", ["p2"]),
            _row(3, "ookb-b", True, "direct", []),
        ],
    )
    items = validity_items(store)
    assert [(i.item_id, i.question, i.context, i.spec) for i in items] == [
        ("ookb-a", "ookb-a?", "Q2? A2.", "ookb_validity"),
        ("ookb-b", "ookb-b?", None, "ookb_validity"),
    ]
    assert items[0].outcomes == ["out_of_kb", "in_kb"]

    shown: list[str] = []
    answers = iter(["1", "2"])
    labels_path = tmp_path / "labels" / "ookb_validity.jsonl"
    label_screens.label_in_terminal(items, labels_path, "ann", input_fn=lambda _: next(answers), output_fn=shown.append)
    assert any(line.startswith("Synthetic out-of-KB question: is it really not answerable") for line in shown)
    assert "Knowledge-base pairs closest to the question:\nQ2? A2." in shown
    assert not any(line.startswith("Response:") for line in shown)  # a question, not a reply, is judged
    page = label_screens._item_html(items[0], "token")
    assert "really not answerable" in page and "Model response" not in page

    labels = (
        labels_path.read_text()
        + HumanLabel(
            item_id="ookb-a",
            spec=OOKB_VALIDITY.name,
            annotator="bob",
            label="in_kb",
            labelled_at=dt.datetime.now(dt.UTC),
        ).model_dump_json()
        + "\n"
    )
    summary = {row["annotator"]: row for row in validity_summary(labels)}
    assert (summary["ann"]["labelled"], summary["ann"]["out_of_kb"], summary["ann"]["valid_share"]) == (2, 1, 0.5)
    assert summary["bob"]["valid_share"] == 0.0 and summary["ann"]["ci_low"] < 0.5 < summary["ann"]["ci_high"]


def test_a_run_without_synthetic_questions_has_nothing_to_label_for_validity(tmp_path):
    from refusalbench.tasks.core.errors import InputError

    store = ArtifactStore(tmp_path)
    store.save(kon_files.QA_PAIRS, [QAPair(id="p0", question="Q?", answer="A.")])
    store.save(kon_files.EXPERIMENT_INPUTS, [_row(0, "p0", False, "direct", [])])
    with pytest.raises(InputError, match="synthetic_ookb: 0"):
        validity_items(store)


# ---------------------------------------------------------------- each knowledge base filters on its own


def test_each_base_carries_its_own_filters_and_thresholds():
    from refusalbench.tasks.core.config import RunConfig
    from refusalbench.tasks.pipeline.knowornot.knowornot_bases import knowledge_bases, merged_filter_report

    cfg = RunConfig.model_validate(
        {
            "models": {"m": {"model": "openai/m"}},
            "knowornot": {
                "targets": ["m"],
                "evaluator": "m",
                "keyword_threshold": 0.3,
                "knowledge_bases": [
                    {"name": "released", "qa_pairs": "a.json", "filters": []},
                    {"name": "cpf", "qa_pairs": "b.jsonl", "keyword_threshold": 0.4, "semantic_threshold": 0.4},
                    {"name": "plain", "qa_pairs": "c.jsonl"},
                ],
            },
        }
    )
    slices = {b.name: b.cfg.knowornot for b in knowledge_bases(cfg, "/tmp/run", lambda kon: "digest")}
    assert [(k.filters, k.keyword_threshold, k.semantic_threshold) for k in slices.values()] == [
        ([], 0.3, 0.3),
        (["keyword", "semantic"], 0.4, 0.4),
        (["keyword", "semantic"], 0.3, 0.3),
    ]
    with pytest.raises(ValidationError):
        RunConfig.model_validate(
            {
                "models": {"m": {"model": "openai/m"}},
                "knowornot": {
                    "targets": ["m"],
                    "evaluator": "m",
                    "knowledge_bases": [{"name": "a", "qa_pairs": "a.json", "keyword_threshold": 1.5}],
                },
            }
        )

    def report(method, n_input, n_kept, threshold):
        return FilterReport(
            method=method,
            n_input=n_input,
            n_kept=n_kept,
            removed_keyword=n_input - n_kept,
            removed_semantic=0,
            kept_ids=[f"q{i}" for i in range(n_kept)],
            keyword_threshold=threshold,
            semantic_threshold=threshold,
        )

    merged = merged_filter_report([("released", report("none", 3, 3, None)), ("cpf", report("both", 4, 2, 0.4))])
    assert (merged.method, merged.n_input, merged.n_kept, merged.keyword_threshold) == (
        "per_knowledge_base",
        7,
        5,
        None,
    )
    assert [
        (b["knowledge_base"], b["method"], b["keyword_threshold"], b["n_kept"]) for b in merged.by_knowledge_base
    ] == [("released", "none", None, 3), ("cpf", "both", 0.4, 2)]
