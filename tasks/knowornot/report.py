"""What a finished KnowOrNot run reports: results table, rates, label sample, HTML page.

``write_results`` joins the stage outputs into one row per experiment and computes the
rates per configuration (with bootstrap intervals) and the sample for human labels;
``publish_report`` writes the self-contained ``report.html`` and shows the rates and a
link to the page in the Prefect UI.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks import runfolder
from refusalbench.tasks.config import KnowOrNotConfig
from refusalbench.tasks.knowornot.evaluation import ABSTENTION, FACTUALITY, knowornot_metrics
from refusalbench.tasks.knowornot.labels import stratified_label_sample
from refusalbench.tasks.knowornot.records import EvalOutcome, ExperimentInput, ExperimentOutput, QAPair
from refusalbench.tasks.store import ArtifactStore
from refusalbench.tasks.ui_artifacts import publish_link, publish_table


def results_frame(rows: list[ExperimentInput], outputs: list[ExperimentOutput], outcomes: list[EvalOutcome],
                  pairs: list[QAPair]) -> pd.DataFrame:
    """One row per experiment: inputs, response, and the evaluator's outcomes."""
    base = pd.DataFrame([r.model_dump() for r in rows])
    answers = pd.DataFrame([o.model_dump() for o in outputs])[["experiment_id", "response", "error"]]
    frame = base.merge(answers, on="experiment_id", how="left")
    judged = pd.DataFrame([o.model_dump() for o in outcomes]) if outcomes else pd.DataFrame(columns=["experiment_id", "spec", "outcome"])
    for spec in (ABSTENTION.name, FACTUALITY.name):
        column = judged[judged["spec"] == spec].set_index("experiment_id")["outcome"] if len(judged) else pd.Series(dtype=object)
        frame[spec] = frame["experiment_id"].map(column)
    texts = {p.id: p for p in pairs}
    frame["context"] = frame["context_ids"].map(lambda ids: "\n".join(texts[i].question + " " + texts[i].answer for i in ids))
    return frame


def write_results(store: ArtifactStore, kon: KnowOrNotConfig) -> pd.DataFrame:
    """Results, rates (Parquet and JSON) and the label sample from the stage outputs; returns the rates."""
    frame = results_frame(store.load(runfolder.EXPERIMENT_INPUTS), store.load(runfolder.EXPERIMENT_OUTPUTS),
                          store.load(runfolder.EVALUATIONS), store.load(runfolder.QA_PAIRS))
    store.save(runfolder.RESULTS, frame)
    metrics = knowornot_metrics(frame, seed=kon.seed)
    store.save(runfolder.KON_METRICS_TABLE, metrics)
    store.save(runfolder.KON_METRICS, {"configurations": metrics.to_dict(orient="records"),
                                       "filter_report": store.load(runfolder.FILTER_REPORT).model_dump(mode="json")})
    store.save(runfolder.LABEL_SAMPLE,
               stratified_label_sample(frame[frame["response"].notna()], kon.label_sample, seed=kon.seed))
    return metrics


def publish_report(store: ArtifactStore, metrics: pd.DataFrame, counts: dict[str, Any]) -> str:
    """Write ``report.html``, show the rates and a link to it in the Prefect UI; returns its URI."""
    filter_report = store.load(runfolder.FILTER_REPORT).model_dump(mode="json")
    uri = store.save(runfolder.REPORT, knowornot_report(metrics, filter_report, counts))
    publish_table("knowornot-rates", _records(metrics), "Abstention and factuality per configuration")
    publish_link("knowornot-report", uri if "://" in uri else f"file://{uri}", runfolder.REPORT.name)
    return uri


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


def knowornot_report(metrics: pd.DataFrame, filter_report: dict, counts: dict) -> str:
    """The self-contained HTML page: what the filters kept, the rates per configuration, the run's counts."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "–" if np.isnan(v) else f"{v:.3f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in metrics.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in metrics.itertuples(index=False))
    facts = "".join(f"<li>{html.escape(str(k))}: {cell(v)}</li>" for k, v in counts.items())
    filt = (f"kept {filter_report.get('n_kept')} of {filter_report.get('n_input')} QA pairs; keyword filter removed "
            f"{filter_report.get('removed_keyword')}, semantic filter removed {filter_report.get('removed_semantic')}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>KnowOrNot report</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
            "</style></head><body><h1>KnowOrNot: out-of-knowledge-base robustness</h1>"
            f"<p>{html.escape(filt)}</p><h2>Abstention and factuality per configuration</h2>"
            "<p>abstention rate = abstained / evaluated; factuality rate = (tier_1 + tier_2) / answers evaluated; "
            "95% bootstrap intervals.</p>"
            f"<table><tr>{head}</tr>{body}</table><h2>Counts</h2><ul>{facts}</ul></body></html>")
