"""Human labels: what to label, where labels are kept, and agreement.

- ``stratified_label_sample``: an even share of responses from every configuration.
- ``LabelStore``: JSONL, one label per line, appended and fsync'ed after every label, so
  a crash loses at most the label being typed; labelling resumes where it stopped.
- ``cohen_kappa``, ``fleiss_kappa``, ``agreement``, ``annotator_agreement``,
  ``evaluator_vs_human``: agreement between annotators and between evaluator and humans.
- ``open_label_session`` and ``write_agreement``: the same over a KnowOrNot run folder
  (what ``refusalbench knowornot label`` and ``... agreement`` do); a run's own specs are
  found in its ``eval_specs.json``, and the agreement is shown in the rebuilt report.

The two ways to give labels (terminal prompt, loopback web page) are in ``labelling_ui``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.knowornot.evaluation import EVAL_SPECS
from refusalbench.tasks.knowornot.records import AgreementReport, EvalSpec, HumanLabel, LabelItem
from refusalbench.tasks.knowornot.report_page import write_knowornot_report
from refusalbench.tasks.core.store import ArtifactStore

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
    groups = [positions for _, positions in sorted(df.groupby(list(by), sort=True, dropna=False).indices.items(), key=lambda kv: str(kv[0]))]
    quotas = _allocate([len(g) for g in groups], n, rng)
    chosen: list[int] = []
    for positions, quota in zip(groups, quotas):
        if quota:
            chosen.extend(rng.choice(np.asarray(positions), size=quota, replace=False).tolist())
    chosen = rng.permutation(np.asarray(chosen, dtype=int)).tolist()
    return df.iloc[chosen]


def label_items_from_frame(df: pd.DataFrame, spec: EvalSpec) -> list[LabelItem]:
    """LabelItems from rows with ``experiment_id``, ``question``, ``response`` (+ optional
    ``expected_answer``, ``context``)."""
    items = []
    for row in df.to_dict(orient="records"):

        def text(name: str) -> str | None:
            value = row.get(name)
            return None if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)

        items.append(
            LabelItem(
                item_id=str(row["experiment_id"]),
                spec=spec.name,
                outcomes=list(spec.outcomes),
                question=text("question") or "",
                response=text("response") or "",
                expected_answer=text("expected_answer"),
                context=text("context"),
            )
        )
    return items


# ----------------------------------------------------------------- storage


class LabelStore:
    """Labels as JSONL at ``path``: appended one per line and fsync'ed before returning."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def load(self) -> list[HumanLabel]:
        """All labels. A torn last line (crash mid-write) is ignored; a bad line elsewhere is an InputError."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").split("\n")
        labels: list[HumanLabel] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                labels.append(HumanLabel.model_validate_json(line))
            except ValidationError as exc:
                if number == len(lines):
                    break  # unterminated last line: a write torn by a crash
                raise InputError(str(self.path), f"not a label record: {exc.errors()[0]['msg']}", line=number) from None
        return labels

    def labelled_ids(self, annotator: str, spec: str | None = None) -> set[str]:
        return {l.item_id for l in self.load() if l.annotator == annotator and (spec is None or l.spec == spec)}

    def append(self, label: HumanLabel) -> None:
        line = label.model_dump_json() + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        # A torn last line was never acknowledged as saved: cut it off
                        # so it cannot become a corrupt line in the middle of the file.
                        handle.seek(0)
                        content = handle.read()
                        handle.truncate(content.rfind(b"\n") + 1)
                handle.write(line.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())

    def pending(self, items: Sequence[LabelItem], annotator: str) -> list[LabelItem]:
        """The items ``annotator`` has not labelled yet, in their order."""
        done = {(l.spec, l.item_id) for l in self.load() if l.annotator == annotator}
        return [item for item in items if (item.spec, item.item_id) not in done]


# ----------------------------------------------------------------- agreement


def cohen_kappa(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> float:
    """Cohen's kappa of two raters over the same items: (p_o - p_e) / (1 - p_e).

    NaN when undefined (no items, or chance agreement is 1 because both raters used one
    and the same label throughout).
    """
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    if not a:
        return float("nan")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    p_e = sum((list(a).count(c) / n) * (list(b).count(c) / n) for c in categories)
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_o - p_e) / (1.0 - p_e))


def fleiss_kappa(matrix: np.ndarray | Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa from an items × categories matrix of rater counts (same raters per item, ≥ 2).

    P_i = (Σ_j n_ij² − n) / (n(n−1)); P̄ = mean P_i; p_j = Σ_i n_ij / (N n); P_e = Σ_j p_j²;
    kappa = (P̄ − P_e) / (1 − P_e), NaN when P_e = 1 (every rating in one category).
    """
    counts = np.asarray(matrix, dtype=float)
    if counts.ndim != 2 or counts.shape[0] == 0:
        raise ValueError("need a non-empty items × categories matrix")
    raters = counts.sum(axis=1)
    if not np.allclose(raters, raters[0]) or raters[0] < 2:
        raise ValueError("every item needs the same number of ratings, at least 2")
    n = raters[0]
    p_items = ((counts**2).sum(axis=1) - n) / (n * (n - 1))
    p_bar = p_items.mean()
    p_categories = counts.sum(axis=0) / (counts.shape[0] * n)
    p_e = float((p_categories**2).sum())
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_bar - p_e) / (1.0 - p_e))


def fleiss_matrix(ratings: Sequence[Sequence[str]], categories: Sequence[str]) -> np.ndarray:
    """Items × categories counts from one list of ratings per item."""
    index = {c: j for j, c in enumerate(categories)}
    matrix = np.zeros((len(ratings), len(categories)), dtype=int)
    for i, item in enumerate(ratings):
        for rating in item:
            matrix[i, index[rating]] += 1
    return matrix


def agreement(a: Sequence[str], b: Sequence[str], labels: Sequence[str] | None = None) -> AgreementReport:
    """Percent agreement, Cohen's kappa and confusion matrix (rows = ``a``, columns = ``b``)."""
    if len(a) != len(b):
        raise ValueError("both raters must label the same items")
    categories = list(labels) if labels is not None else sorted(set(a) | set(b))
    position = {c: i for i, c in enumerate(categories)}
    confusion = [[0] * len(categories) for _ in categories]
    for x, y in zip(a, b):
        confusion[position[x]][position[y]] += 1
    n = len(a)
    return AgreementReport(
        n=n,
        percent_agreement=(sum(x == y for x, y in zip(a, b)) / n) if n else float("nan"),
        kappa=cohen_kappa(a, b, categories),
        labels=categories,
        confusion=confusion,
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


def evaluator_vs_human(
    labels: Iterable[HumanLabel], evaluator_outcomes: Mapping[str, str | None], spec: EvalSpec
) -> dict[str, AgreementReport]:
    """Agreement of the evaluator with each annotator and with the human consensus.

    ``evaluator_outcomes`` maps item id -> the evaluator's outcome (None = unparsable; such
    items are skipped). Rows of each confusion matrix are the humans, columns the evaluator.
    "consensus" uses the items on which every annotator who labelled them agrees.
    """
    by_annotator = _labels_by_annotator(labels, spec.name)
    reports: dict[str, AgreementReport] = {}
    for annotator, given in sorted(by_annotator.items()):
        items = sorted(i for i in given if evaluator_outcomes.get(i) is not None)
        reports[annotator] = agreement([given[i] for i in items], [evaluator_outcomes[i] for i in items], spec.outcomes)  # type: ignore[misc]
    votes: dict[str, set[str]] = {}
    for given in by_annotator.values():
        for item_id, label in given.items():
            votes.setdefault(item_id, set()).add(label)
    agreed = sorted(i for i, v in votes.items() if len(v) == 1 and evaluator_outcomes.get(i) is not None)
    reports["consensus"] = agreement([next(iter(votes[i])) for i in agreed], [evaluator_outcomes[i] for i in agreed], spec.outcomes)  # type: ignore[misc]
    return reports


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
    if store.has(runfolder.RUN_SPECS):
        specs.update({spec.name: spec for spec in store.load(runfolder.RUN_SPECS).root})
    return specs


def open_label_session(run_dir: str, spec_name: str) -> LabelSession:
    """The run's label sample as items of ``spec_name``, and where their labels are kept."""
    store = ArtifactStore(run_dir)
    if not store.has(runfolder.LABEL_SAMPLE):
        raise InputError(store.uri(runfolder.LABEL_SAMPLE.name), "no label sample in this run folder (run knowornot first)")
    specs = run_eval_specs(store)
    if spec_name not in specs:
        raise InputError(spec_name, f"unknown evaluation spec (known: {', '.join(specs)})", field="--spec")
    spec = specs[spec_name]
    labels_path = Path(store.uri(runfolder.labels_file(spec.name).name))
    return LabelSession(store, spec, label_items_from_frame(store.load(runfolder.LABEL_SAMPLE), spec), labels_path)


def write_agreement(run_dir: str, spec_name: str) -> dict[str, Any]:
    """Agreement between the run's annotators and with its evaluator, saved as ``agreement-<spec>.json``;
    the run's ``report.html`` is rebuilt to show it."""
    session = open_label_session(run_dir, spec_name)
    labels = LabelStore(session.labels_path).load()
    results = session.store.load(runfolder.RESULTS)
    evaluator = {row["experiment_id"]: (row[spec_name] if isinstance(row.get(spec_name), str) else None)
                 for _, row in results.iterrows()}
    report = {"annotators": annotator_agreement(labels, session.spec),
              "evaluator_vs_human": {k: v.model_dump() for k, v in evaluator_vs_human(labels, evaluator, session.spec).items()}}
    session.store.save(runfolder.agreement_file(spec_name), report)
    if session.store.has(runfolder.KON_METRICS) and session.store.has(runfolder.KON_METRICS_TABLE):
        write_knowornot_report(session.store)
    return report
