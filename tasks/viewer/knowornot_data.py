"""A KnowOrNot run folder in memory: one row per experiment, queried by page, and each experiment in full.

``results.parquet`` gives each experiment's inputs, reply and the evaluator's outcome per spec;
the QA pairs give the passages placed in its context and the withheld pair (the question's
own, left out of a leave-one-out context); the outputs and evaluations give the reply's
metadata and the evaluator's own words; ``labels/*.jsonl`` the human labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.human_labels import HumanLabel
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.viewer.data import PAGE_SIZE, Keyed, plain

FILTERS = ("target", "retrieval", "prompt", "knowledge_base")
SHOWN = ("experiment_id", "question_id", "question", "target", "retrieval", "prompt", "ookb", "knowledge_base")


@dataclass
class KnowOrNotRun:
    name: str
    uri: str
    manifest: dict[str, Any] | None
    results: pd.DataFrame
    specs: list[str]
    search: pd.Series
    outputs: Keyed | None
    evaluations: Keyed | None
    pairs: dict[str, dict[str, Any]]
    facts: dict[str, dict[str, Any]]
    labels: dict[str, list[dict[str, Any]]]  # experiment_id -> human labels
    row_of: dict[str, int]

    def options(self) -> dict[str, list[str]]:
        out = {c: sorted({str(v) for v in self.results[c].dropna()}) for c in FILTERS if c in self.results}
        for spec in self.specs:
            out[f"spec_{spec}"] = sorted({str(v) for v in self.results[spec].dropna()})
        return {k: v for k, v in out.items() if v}

    def query(self, params: Mapping[str, str]) -> dict[str, Any]:
        """The page of experiments ``params`` asks for (filters by column, ``kind`` loo|ookb, ``q``, ``page``)."""
        frame = self.results
        mask = np.ones(len(frame), dtype=bool)
        for column in FILTERS:
            if params.get(column) and column in frame:
                mask &= frame[column].astype(object).to_numpy() == params[column]
        for spec in self.specs:
            if params.get(f"spec_{spec}"):
                mask &= frame[spec].astype(object).to_numpy() == params[f"spec_{spec}"]
        if params.get("kind") in ("loo", "ookb"):
            mask &= frame["ookb"].to_numpy(dtype=bool) == (params["kind"] == "ookb")
        if params.get("q"):
            mask &= self.search.str.contains(params["q"].strip().lower(), regex=False).to_numpy(dtype=bool)
        positions = np.flatnonzero(mask)
        try:
            page = max(int(params.get("page", 1)), 1)
        except ValueError:
            page = 1
        pages = max(1, math.ceil(len(positions) / PAGE_SIZE))
        page = min(page, pages)
        chosen = positions[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        columns = [c for c in (*SHOWN, *self.specs) if c in frame]
        rows = [{c: plain(frame[c].iat[p]) for c in columns} for p in chosen]
        return {"total": len(positions), "page": page, "pages": pages, "specs": self.specs, "rows": rows}

    def experiment(self, experiment_id: str) -> dict[str, Any] | None:
        position = self.row_of.get(experiment_id)
        if position is None:
            return None
        row = {c: plain(v) for c, v in self.results.iloc[position].to_dict().items()}
        withheld = self.pairs.get(str(row.get("question_id")))
        fact = self.facts.get(str(withheld.get("source"))) if withheld else None
        outputs = self.outputs.rows(experiment_id) if self.outputs else []
        return {
            "row": row,
            "specs": self.specs,
            "passages": [self.pairs.get(str(i), {"id": i}) for i in row.get("context_ids") or []],
            "withheld": withheld,
            "fact": fact,
            "output": outputs[0] if outputs else None,
            "evaluations": self.evaluations.rows(experiment_id) if self.evaluations else [],
            "labels": self.labels.get(experiment_id, []),
        }


def _human_labels(store: ArtifactStore) -> dict[str, list[dict[str, Any]]]:
    """Every human label in ``labels/`` (consensus ones marked), by experiment id; unreadable lines skipped."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in store.list("labels"):
        if not name.endswith(".jsonl"):
            continue
        for line in store.read_text(name).splitlines():
            try:
                label = HumanLabel.model_validate_json(line)
            except ValueError:
                continue  # a torn or foreign line: the labelling tools report those, the viewer shows the rest
            entry = label.model_dump(mode="json") | {"consensus": "/consensus/" in f"/{name}"}
            out.setdefault(label.item_id, []).append(entry)
    return out


def _specs(store: ArtifactStore, results: pd.DataFrame) -> list[str]:
    if store.has(kon_files.RUN_SPECS):
        names = [spec["name"] for spec in store.read_json(kon_files.RUN_SPECS.name)]
    else:
        names = ["abstention", "factuality"]
    return [n for n in names if n in results]


def load_knowornot(name: str, store: ArtifactStore) -> KnowOrNotRun:
    """Read a KnowOrNot run folder once."""
    results = store.read_frame(kon_files.RESULTS.name) if store.has(kon_files.RESULTS) else None
    if results is None:  # a run stopped before its results: the experiments as asked
        results = store.read_frame(kon_files.EXPERIMENT_INPUTS.name)
    results = results.reset_index(drop=True)
    pairs_frame = store.read_frame(kon_files.QA_PAIRS.name) if store.has(kon_files.QA_PAIRS) else None
    if store.has(kon_files.QA_PAIRS_ALL):  # the withheld pair may be one the diversity filter dropped
        every = store.read_frame(kon_files.QA_PAIRS_ALL.name)
        pairs_frame = (
            every if pairs_frame is None else pd.concat([every, pairs_frame]).drop_duplicates("id", keep="last")
        )
    pairs = {
        str(r["id"]): {k: plain(v) for k, v in r.items()}
        for r in (pairs_frame.to_dict(orient="records") if pairs_frame is not None else [])
    }
    facts_frame = store.read_frame(kon_files.FACTS.name) if store.has(kon_files.FACTS) else None
    facts = {
        str(r["fact_id"]): {k: plain(v) for k, v in r.items()}
        for r in (facts_frame.to_dict(orient="records") if facts_frame is not None else [])
    }
    text = results["question"].fillna("").astype(str)
    for column in ("response", "context", "expected_answer"):
        if column in results:
            text = text + "\n" + results[column].fillna("").astype(str)
    outputs = store.read_frame(kon_files.EXPERIMENT_OUTPUTS.name) if store.has(kon_files.EXPERIMENT_OUTPUTS) else None
    evaluations = store.read_frame(kon_files.EVALUATIONS.name) if store.has(kon_files.EVALUATIONS) else None
    return KnowOrNotRun(
        name=name,
        uri=store.root,
        manifest=store.read_json(runfolder.MANIFEST.name) if store.has(runfolder.MANIFEST) else None,
        results=results,
        specs=_specs(store, results),
        search=text.str.lower(),
        outputs=Keyed.of(outputs, "experiment_id"),
        evaluations=Keyed.of(evaluations, "experiment_id"),
        pairs=pairs,
        facts=facts,
        labels=_human_labels(store),
        row_of={str(k): i for i, k in enumerate(results["experiment_id"])},
    )
