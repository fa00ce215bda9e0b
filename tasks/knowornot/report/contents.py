"""What a finished KnowOrNot run reports: results table, rates, audit, label sample, HTML page.

``write_results`` joins the stage outputs into one row per experiment (one column per
evaluation spec the run applied), computes the rates per configuration (abstention and
factuality, and the share of every outcome of every spec, with bootstrap intervals) of the
leave-one-out questions, the synthetic out-of-KB questions' rates apart (App. D.2), the
duplicate-overlap audit of the kept questions and the samples for human labels (one per spec);
``publish_report`` writes the self-contained ``report.html`` (``report_page``) and shows
the rates, a summary (the rates, the viewer command, the report's link) and a link to the page
in the Prefect UI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.config_sections import KnowOrNotConfig
from refusalbench.tasks.core.narration import publish_link, publish_markdown, publish_table, story
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.core.where_to_look import report_link, summary_markdown
from refusalbench.tasks.knowornot.human.labels import label_samples
from refusalbench.tasks.knowornot.report.terminal_rates import rates_markdown
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.json_files import OverlapAudit
from refusalbench.tasks.knowornot.schema.records import EvalOutcome, ExperimentInput, ExperimentOutput, QAPair
from refusalbench.tasks.knowornot.stages.embeddings import Embedder, make_embedder
from refusalbench.tasks.knowornot.stages.evaluation import (
    BUILT_IN_SPECS,
    LEAVE_ONE_OUT,
    METRIC_KEYS,
    SYNTHETIC_OOKB,
    knowornot_metrics,
    outcome_rates,
    run_specs,
    split_experiments,
)
from refusalbench.tasks.knowornot.stages.overlap import overlap_audit

_BUILT_IN_SPEC_NAMES = tuple(spec.name for spec in BUILT_IN_SPECS)


def results_frame(
    rows: list[ExperimentInput],
    outputs: list[ExperimentOutput],
    outcomes: list[EvalOutcome],
    pairs: list[QAPair],
    spec_names: Sequence[str] = _BUILT_IN_SPEC_NAMES,
) -> pd.DataFrame:
    """One row per experiment: inputs, response, and one column per spec with the evaluator's outcome."""
    base = pd.DataFrame([r.model_dump() for r in rows])
    answers = pd.DataFrame([o.model_dump() for o in outputs])[["experiment_id", "response", "error"]]
    frame = base.merge(answers, on="experiment_id", how="left")
    judged = (
        pd.DataFrame([o.model_dump() for o in outcomes])
        if outcomes
        else pd.DataFrame(columns=["experiment_id", "spec", "outcome"])
    )
    for spec in spec_names:
        column = (
            judged[judged["spec"] == spec].set_index("experiment_id")["outcome"]
            if len(judged)
            else pd.Series(dtype=object)
        )
        frame[spec] = frame["experiment_id"].map(column)
    texts = {p.id: p for p in pairs}
    frame["context"] = frame["context_ids"].map(
        lambda ids: "\n".join(texts[i].question + " " + texts[i].answer for i in ids)
    )
    return frame


def write_results(
    store: ArtifactStore, kon: KnowOrNotConfig, embedder: Embedder | None = None, audit: OverlapAudit | None = None
) -> pd.DataFrame:
    """Results, rates (Parquet and JSON), the overlap audit and the label sample from the stage outputs; returns the rates.
    ``audit``: the overlap audit computed already (``run_overlap_audit``, while the calls ran); else it is computed here."""
    specs = run_specs(kon.evaluations)
    pairs = store.load(kon_files.QA_PAIRS)
    frame = results_frame(
        store.load(kon_files.EXPERIMENT_INPUTS),
        store.load(kon_files.EXPERIMENT_OUTPUTS),
        store.load(kon_files.EVALUATIONS),
        pairs,
        [s.name for s in specs],
    )
    store.save(kon_files.RESULTS, frame)
    # Leave-one-out is the run's experiment; synthetic out-of-KB questions are their own (App. D.2), never pooled.
    experiments = split_experiments(frame)
    loo, synthetic = experiments[LEAVE_ONE_OUT], experiments[SYNTHETIC_OOKB]
    metrics = knowornot_metrics(loo, seed=kon.seed)
    store.save(kon_files.KON_METRICS_TABLE, metrics)
    synthetic_metrics = knowornot_metrics(synthetic, seed=kon.seed)
    rates = outcome_rates(loo, specs, seed=kon.seed)
    store.save(kon_files.SPEC_RATES, rates)
    filter_report = store.load(kon_files.FILTER_REPORT)
    audit = audit or overlap_audit(pairs, embedder or make_embedder(kon.embedder), filter_report)
    # Several bases: the configurations pool them (the figures' view); each base's own rates come beside.
    by_base = (
        knowornot_metrics(loo, by=("knowledge_base", *METRIC_KEYS), seed=kon.seed) if kon.knowledge_bases else None
    )
    store.save(
        kon_files.KON_METRICS,
        {
            "configurations": metrics.to_dict(orient="records"),
            "filter_report": filter_report.model_dump(mode="json"),
            "spec_rates": rates.to_dict(orient="records"),
            "overlap_audit": audit.model_dump(mode="json"),
            "configurations_by_knowledge_base": [] if by_base is None else by_base.to_dict(orient="records"),
            "synthetic_ookb": synthetic_metrics.to_dict(orient="records"),
        },
    )
    store.save(kon_files.LABEL_SAMPLE, label_samples(frame, specs, kon.label_sample, seed=kon.seed))
    return metrics


def run_overlap_audit(store: ArtifactStore, embedder: Embedder) -> OverlapAudit:
    """The overlap audit of the run folder's kept questions, with the filters' report: it reads only what the
    experiment stage left (the pairs, and the questions' vectors the grid cached), so it can run beside the
    answers and evaluations."""
    return overlap_audit(store.load(kon_files.QA_PAIRS), embedder, store.load(kon_files.FILTER_REPORT))


def publish_report(store: ArtifactStore, metrics: pd.DataFrame, counts: dict[str, Any]) -> str:
    """Write ``report.html``, show the rates and a link to it in the Prefect UI; returns its URI."""
    # Imported here: the report package, which a run's start-up does not need.
    from refusalbench.tasks.knowornot.report.page import write_knowornot_report

    uri = write_knowornot_report(store, counts)
    publish_table("knowornot-rates", _records(metrics), "Abstention and factuality per configuration")
    summary = summary_markdown(
        "KnowOrNot run summary", rates_markdown({"configurations": _records(metrics)}), uri, store.root
    )
    publish_markdown("knowornot-summary", summary, "Rates, the command that explores the experiments, the report")
    link = report_link(uri)
    publish_link("knowornot-report", link, runfolder.REPORT.name)
    story("report: %s", link)
    return uri


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]
