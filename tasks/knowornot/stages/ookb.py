"""The synthetic out-of-KB questions' validity: is a generated question really not answerable from the KB?

The paper (App. D.2) had an LLM write out-of-knowledge-base questions and annotated each by
hand: only 30-78% were truly outside the KB, depending on the domain. A run's synthetic
questions (``knowornot.synthetic_ookb``) get the same check here: one label item per
question, showing it with the knowledge-base pairs closest to it, and the annotator says
``out_of_kb`` (valid) or ``in_kb`` (the KB answers it). ``validity_summary`` gives, per
annotator, the share judged valid with a Wilson interval, which the report shows beside the
synthetic questions' abstention rates (their own experiment, never pooled with leave-one-out).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.human_labels import HumanLabel, LabelItem
from refusalbench.tasks.core.stats import wilson_interval
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.schema import artifacts as kon_files

OOKB_VALIDITY = EvalSpec(
    name="ookb_validity",
    tag="validity",
    outcomes=["out_of_kb", "in_kb"],
    prompt="A question was written to lie outside the knowledge base. Decide whether the knowledge base answers it: "
    "out_of_kb if no pair of the knowledge base answers it, in_kb if one does (fully or in substance).",
    input_fields=["question", "context"],
)
VALID = "out_of_kb"

# What the labelling screens show above a validity item, instead of a model's response.
VALIDITY_INSTRUCTION = (
    "Synthetic out-of-KB question: is it really not answerable from the knowledge base? "
    "out_of_kb = no pair answers it (a valid question); in_kb = the knowledge base answers it."
)
VALIDITY_CONTEXT_TITLE = "Knowledge-base pairs closest to the question"


@dataclass(frozen=True)
class ValiditySession:
    """What one annotator labels for validity: one item per synthetic question, and the labels file."""

    items: list[LabelItem]
    labels_path: Path


def validity_items(store: ArtifactStore) -> list[LabelItem]:
    """One item per synthetic question of the run (every base of a multi-base run), with the KB pairs a
    retriever placed closest to it: the smallest non-empty context any of its experiments got (the
    whole KB where long context is the only strategy)."""
    pairs = {p.id: p for p in store.load(kon_files.QA_PAIRS)}
    questions: dict[str, str] = {}
    closest: dict[str, list[str]] = {}
    for row in store.load(kon_files.EXPERIMENT_INPUTS):
        if not row.ookb:
            continue
        questions.setdefault(row.question_id, row.question)
        best = closest.get(row.question_id)
        if row.context_ids and (best is None or len(row.context_ids) < len(best)):
            closest[row.question_id] = list(row.context_ids)
    if not questions:
        raise InputError(
            store.uri(kon_files.EXPERIMENT_INPUTS.name),
            "this run asked no synthetic out-of-KB questions (knowornot.synthetic_ookb: 0)",
            field="--spec",
        )
    items = []
    for question_id, question in questions.items():
        ids = [i for i in closest.get(question_id, []) if i in pairs]
        context = "\n".join(f"{pairs[i].question} {pairs[i].answer}" for i in ids) or None
        items.append(
            LabelItem(
                item_id=question_id,
                spec=OOKB_VALIDITY.name,
                outcomes=list(OOKB_VALIDITY.outcomes),
                question=question,
                response="",
                context=context,
            )
        )
    return items


def open_validity_session(run_dir: str) -> ValiditySession:
    """The run's synthetic questions as validity items, and where their labels are kept."""
    store = ArtifactStore(run_dir)
    return ValiditySession(validity_items(store), Path(store.uri(kon_files.labels_file(OOKB_VALIDITY.name).name)))


def validity_summary(jsonl: str) -> list[dict[str, Any]]:
    """Per annotator: synthetic questions labelled, how many judged truly out of the KB, that share with
    its 95% Wilson interval (the last label of an item counts; a line that does not parse is skipped)."""
    latest: dict[tuple[str, str], str] = {}
    for line in jsonl.splitlines():
        try:
            label = HumanLabel.model_validate_json(line)
        except ValidationError:
            continue
        latest[(label.annotator, label.item_id)] = label.label
    rows = []
    for annotator in sorted({who for who, _ in latest}):
        given = [label for (who, _), label in latest.items() if who == annotator]
        valid = sum(label == VALID for label in given)
        low, high = wilson_interval(valid, len(given))
        rows.append(
            {
                "annotator": annotator,
                "labelled": len(given),
                "out_of_kb": valid,
                "valid_share": valid / len(given),
                "ci_low": low,
                "ci_high": high,
            }
        )
    return rows
