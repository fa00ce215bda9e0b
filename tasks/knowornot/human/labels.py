"""Human labels: what to label, where labels are kept, and agreement.

- ``stratified_label_sample``: an even share of responses from every configuration;
  ``label_samples``: one such sample per evaluation spec, drawn from the rows the spec applies
  to (factuality: only responses the evaluator judged answered, never an abstention).
- ``open_label_session`` and ``write_agreement``: a KnowOrNot run folder's label sample and
  agreement (what ``refusalbench knowornot label`` and ``... agreement`` do); a run's own
  specs are found in its ``eval_specs.json``, and the agreement is shown in the rebuilt report.
  ``open_label_session(..., consensus=True)`` is the consensus pass (``label --consensus``):
  only the items the annotators labelled differently, each shown with their labels; the agreed
  label goes to ``labels/consensus/<spec>.jsonl`` (append-only like every label file).

Where labels are kept (``labelling.label_store``) and how agreement is measured
(``labelling.agreement``) are shared with RefusalBench's audit. The two ways to give labels
(terminal prompt, loopback web page) are in ``label_screens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.human_labels import LabelItem
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.human.evaluator_comparison import compare_with_consensus, evaluator_outcomes
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.stages.evaluation import EVAL_SPECS
from refusalbench.tasks.labelling.agreement import (
    annotator_agreement,
    consensus_labels,
    disagreements,
    evaluator_vs_human,
)
from refusalbench.tasks.labelling.label_store import LabelStore

# ----------------------------------------------------------------- sampling


def _allocate(capacities: list[int], n: int, rng: np.random.Generator) -> list[int]:
    """Split n as evenly as the strata allow; leftovers of small strata go to the others."""
    quotas = [0] * len(capacities)
    remaining = n
    while remaining > 0:
        open_strata = [i for i, cap in enumerate(capacities) if quotas[i] < cap]
        if not open_strata:
            break
        share, extra = divmod(remaining, len(open_strata))
        lucky = set(rng.permutation(open_strata)[:extra].tolist()) if extra else set()
        for i in open_strata:
            give = min(share + (1 if i in lucky else 0), capacities[i] - quotas[i])
            quotas[i] += give
            remaining -= give
    return quotas


def stratified_label_sample(
    df: pd.DataFrame, n: int, seed: int = 0, by: Sequence[str] = ("target", "retrieval", "prompt")
) -> pd.DataFrame:
    """``n`` rows drawn evenly across the ``by`` strata (seeded), returned in shuffled order.

    Each stratum gets ``n // strata`` rows (the remainder spread at random); a stratum with
    fewer rows gives all it has and the shortfall is shared by the others. The shuffle
    keeps annotators from seeing one configuration in a block.
    """
    if n < 0:
        raise ValueError("n must be non-negative")
    missing = [c for c in by if c not in df.columns]
    if missing:
        raise ValueError(f"sample needs columns {missing}")
    rng = np.random.default_rng(seed)
    if df.empty or n == 0:
        return df.iloc[0:0]
    groups = [
        positions
        for _, positions in sorted(
            df.groupby(list(by), sort=True, dropna=False).indices.items(), key=lambda kv: str(kv[0])
        )
    ]
    quotas = _allocate([len(g) for g in groups], n, rng)
    chosen: list[int] = []
    for positions, quota in zip(groups, quotas):
        if quota:
            chosen.extend(rng.choice(np.asarray(positions), size=quota, replace=False).tolist())
    chosen = rng.permutation(np.asarray(chosen, dtype=int)).tolist()
    return df.iloc[chosen]


# The label sample's column naming the spec a row was drawn for (a spec may be called "spec").
SAMPLE_SPEC = kon_files.LABEL_SAMPLE_SPEC


def spec_rows(frame: pd.DataFrame, spec: EvalSpec) -> pd.DataFrame:
    """The results rows ``spec`` applies to: a response, every field the spec shows present, and for an
    ``answered`` spec only the responses the abstention spec judged answered."""
    keep = frame["response"].notna()
    for field in spec.input_fields:
        if field in frame.columns:
            keep &= frame[field].notna()
    if spec.applies_to == "answered":
        keep &= frame["abstention"] == "no" if "abstention" in frame.columns else False
    return frame[keep]


def label_samples(frame: pd.DataFrame, specs: Sequence[EvalSpec], n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` rows per spec, each drawn (``stratified_label_sample``) from the rows that spec applies to,
    the spec in the ``label_spec`` column."""
    samples = [
        stratified_label_sample(spec_rows(frame, spec), n, seed=seed).assign(**{SAMPLE_SPEC: spec.name})
        for spec in specs
    ]
    return pd.concat(samples, ignore_index=True) if samples else frame.iloc[0:0].assign(**{SAMPLE_SPEC: []})


def sample_ids_per_spec(sample: pd.DataFrame) -> dict[str, set[str]]:
    """Spec name -> the experiment ids of its label sample."""
    return {str(spec): set(map(str, rows["experiment_id"])) for spec, rows in sample.groupby(SAMPLE_SPEC)}


def spec_sample(sample: pd.DataFrame, spec: EvalSpec, specs: Sequence[EvalSpec] = ()) -> pd.DataFrame:
    """The rows of the label sample drawn for ``spec``; a sample from before per-spec samples is shared by all.

    A spec the run did not apply (registered since) gets the sample of the first of ``specs`` that
    applies to the same rows (``applies_to``).
    """
    if SAMPLE_SPEC not in sample.columns:
        return sample
    drawn = set(sample[SAMPLE_SPEC])
    alike = [s.name for s in specs if s.name in drawn and s.applies_to == spec.applies_to]
    return sample[sample[SAMPLE_SPEC] == (spec.name if spec.name in drawn or not alike else alike[0])]


def label_items_from_frame(df: pd.DataFrame, spec: EvalSpec, shown: dict[str, str] | None = None) -> list[LabelItem]:
    """LabelItems from rows with ``experiment_id``, ``question``, ``response`` (+ optional
    ``expected_answer``, ``context``); ``shown``: item id -> the annotators' labels to show (consensus pass)."""

    def text(row: dict[str, Any], name: str) -> str | None:
        value = row.get(name)
        return None if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)

    items = []
    for row in df.to_dict(orient="records"):
        items.append(
            LabelItem(
                item_id=str(row["experiment_id"]),
                spec=spec.name,
                outcomes=list(spec.outcomes),
                question=text(row, "question") or "",
                response=text(row, "response") or "",
                expected_answer=text(row, "expected_answer"),
                context=text(row, "context"),
                shown_labels=shown.get(str(row["experiment_id"])) if shown else None,
            )
        )
    return items


# ----------------------------------------------------------------- a run folder's labels


@dataclass(frozen=True)
class LabelSession:
    """What one annotator labels for one spec of a run: the items and the labels file."""

    store: ArtifactStore
    spec: EvalSpec
    items: list[LabelItem]
    labels_path: Path


def run_eval_specs(store: ArtifactStore) -> dict[str, EvalSpec]:
    """The specs a run can be labelled on: those it applied (``eval_specs.json``, its config's own
    included), then any other registered spec."""
    specs = dict(EVAL_SPECS)
    if store.has(kon_files.RUN_SPECS):
        specs.update({spec.name: spec for spec in store.load(kon_files.RUN_SPECS).root})
    return specs


def open_label_session(run_dir: str, spec_name: str, consensus: bool = False) -> LabelSession:
    """The run's label sample for ``spec_name`` as items, and where their labels are kept.

    ``consensus``: only the items the annotators labelled differently and no consensus pass has
    settled yet, each showing the labels given; their labels go to the consensus file.
    """
    store = ArtifactStore(run_dir)
    if not store.has(kon_files.LABEL_SAMPLE):
        raise InputError(
            store.uri(kon_files.LABEL_SAMPLE.name), "no label sample in this run folder (run knowornot first)"
        )
    specs = run_eval_specs(store)
    if spec_name not in specs:
        raise InputError(spec_name, f"unknown evaluation spec (known: {', '.join(specs)})", field="--spec")
    spec = specs[spec_name]
    labels_path = Path(store.uri(kon_files.labels_file(spec.name).name))
    sample = spec_sample(store.load(kon_files.LABEL_SAMPLE), spec, list(specs.values()))
    if not consensus:
        return LabelSession(store, spec, label_items_from_frame(sample, spec), labels_path)
    consensus_path = Path(store.uri(kon_files.consensus_file(spec.name).name))
    settled = {label.item_id for label in LabelStore(consensus_path).load() if label.spec == spec.name}
    open_items = {
        item: " · ".join(f"{who}: {label}" for who, label in given.items())
        for item, given in disagreements(LabelStore(labels_path).load(), spec.name).items()
        if item not in settled
    }
    pending = sample[sample["experiment_id"].astype(str).isin(open_items)]
    return LabelSession(store, spec, label_items_from_frame(pending, spec, shown=open_items), consensus_path)


def write_agreement(run_dir: str, spec_name: str) -> dict[str, Any]:
    """Agreement between the run's annotators and with its evaluator(s), saved as ``agreement-<spec>.json``;
    the run's ``report.html`` is rebuilt to show it.

    Besides kappas with intervals: the disagreements still open for a consensus pass, and every
    evaluator the run has outcomes from (its evaluator and ``evaluator_comparison``) against the
    human consensus (App. D.3).
    """
    session = open_label_session(run_dir, spec_name)
    labels = LabelStore(session.labels_path).load()
    settled = LabelStore(session.store.uri(kon_files.consensus_file(spec_name).name)).load()
    consensus = consensus_labels(labels, settled, spec_name)
    results = session.store.load(kon_files.RESULTS)
    evaluator = {
        row["experiment_id"]: (row[spec_name] if isinstance(row.get(spec_name), str) else None)
        for _, row in results.iterrows()
    }
    open_items = [item for item in disagreements(labels, spec_name) if item not in consensus]
    report = {
        "annotators": annotator_agreement(labels, session.spec),
        "evaluator_vs_human": {
            k: v.model_dump() for k, v in evaluator_vs_human(labels, evaluator, session.spec, settled).items()
        },
        "disagreements_open": open_items,
        "evaluator_comparison": compare_with_consensus(
            evaluator_outcomes(session.store, spec_name), consensus, session.spec
        ),
    }
    session.store.save(kon_files.agreement_file(spec_name), report)
    if session.store.has(kon_files.KON_METRICS) and session.store.has(kon_files.KON_METRICS_TABLE):
        # Imported here: the report package, which a run's start-up does not need.
        from refusalbench.tasks.knowornot.report.page import write_knowornot_report

        write_knowornot_report(session.store)
    return report
