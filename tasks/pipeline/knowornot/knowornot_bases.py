"""Several knowledge bases in one KnowOrNot run (``knowornot.knowledge_bases``).

The paper's PolicyBench has four bases; a team evaluating its models on all of them wants
one run, one report and one process, with every target's calls for all bases sharing its
concurrency. Each base still goes through the knowledge-base, filter + index and
experiment stages on its own, in the run folder's ``kb/<name>/``: its own pairs, diversity
filter and FAISS index, so leave-one-out and retrieval stay within the base. A stage runs
for all bases at once (one Prefect task per base); the bases' grids are then merged into
the run folder's files with every id prefixed by the base's name (``<name>/<id>``), and
answering and evaluation run over the merged grid as over any other. A run with one base
(``documents`` or ``qa_pairs``) works in the run folder itself, exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import Task

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.config_sections import KnowOrNotConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.knowornot.schema.records import BASE_FILTER_FIELDS, ExperimentInput, FilterReport, QAPair
from refusalbench.tasks.pipeline.fanout import task_parameter


@dataclass(frozen=True)
class KnowledgeBaseSlice:
    """One base of a run: the config narrowed to its sources, the folder its stage files go to,
    and the digest of what its stages read (the stage tasks' cache key)."""

    name: str | None  # None: the run's only base, worked on in the run folder itself
    cfg: RunConfig
    out: str
    digest: str


def knowledge_bases(cfg: RunConfig, out: str, digest_of: Callable[[KnowOrNotConfig], str]) -> list[KnowledgeBaseSlice]:
    """The run's bases; ``digest_of(kon)`` gives a narrowed knowornot section's input digest."""
    kon = cfg.knowornot
    assert kon is not None, "a KnowOrNot run's config has a knowornot section (check_knowornot_inputs)"
    if not kon.knowledge_bases:
        return [KnowledgeBaseSlice(None, cfg, out, digest_of(kon))]
    bases = []
    for source in kon.knowledge_bases:
        narrowed = kon.model_copy(
            update={
                "documents": source.documents,
                "qa_pairs": source.qa_pairs,
                "knowledge_bases": None,
                **source.filtering(kon),
            }
        )
        bases.append(
            KnowledgeBaseSlice(
                source.name,
                cfg.model_copy(update={"knowornot": narrowed}),
                ArtifactStore(out).uri(f"kb/{source.name}"),
                digest_of(narrowed),
            )
        )
    return bases


def each_base(stage: Task[..., Any], bases: list[KnowledgeBaseSlice], *args: Any) -> list[Any]:
    """One stage for every base, all at once; the results in the bases' order."""
    if len(bases) == 1:
        only = bases[0]
        return [stage(task_parameter(only.cfg), only.out, only.digest, *args)]
    futures = [stage.submit(task_parameter(base.cfg), base.out, base.digest, *args) for base in bases]
    return [future.result() for future in futures]


def each_base_then(
    first: Task[..., Any], then: Task[..., Any], bases: list[KnowledgeBaseSlice], *then_args: Any
) -> tuple[list[Any], Callable[[], list[Any]]]:
    """``first`` for every base, and ``then`` for each base as soon as its own ``first`` is done (the
    bases' encodes take turns on the one embedding model, so one base's HyDE calls are in flight while
    the next base encodes): the results of ``first`` in the bases' order, and a function that waits
    for those of ``then``."""
    if len(bases) == 1:
        only = bases[0]
        done = first(task_parameter(only.cfg), only.out, only.digest)
        return [done], lambda: [then(task_parameter(only.cfg), only.out, only.digest, *then_args)]
    firsts = [first.submit(task_parameter(base.cfg), base.out, base.digest) for base in bases]
    thens = [
        then.submit(task_parameter(base.cfg), base.out, base.digest, *then_args, wait_for=[future])
        for base, future in zip(bases, firsts)
    ]
    return [future.result() for future in firsts], lambda: [future.result() for future in thens]


def prefixed(name: str, identifier: str) -> str:
    return f"{name}/{identifier}"


def _pairs(name: str, pairs: list[QAPair]) -> list[QAPair]:
    return [p.model_copy(update={"id": prefixed(name, p.id)}) for p in pairs]


def _inputs(name: str, rows: list[ExperimentInput]) -> list[ExperimentInput]:
    return [
        r.model_copy(
            update={
                "experiment_id": prefixed(name, r.experiment_id),
                "question_id": prefixed(name, r.question_id),
                "context_ids": [prefixed(name, i) for i in r.context_ids],
                "knowledge_base": name,
            }
        )
        for r in rows
    ]


def merged_filter_report(reports: list[tuple[str, FilterReport]]) -> FilterReport:
    """The bases' filter reports as one: counts summed, ids prefixed; each base's own method and thresholds
    kept beside (``by_knowledge_base``), and the merged ones only where every base used the same."""

    def shared(field: str) -> Any:
        values = {getattr(r, field) for _, r in reports}
        return values.pop() if len(values) == 1 else None

    return FilterReport(
        method=shared("method") or "per_knowledge_base",
        keyword_threshold=shared("keyword_threshold"),
        semantic_threshold=shared("semantic_threshold"),
        by_knowledge_base=[{"knowledge_base": n, **r.model_dump(include=set(BASE_FILTER_FIELDS))} for n, r in reports],
        n_input=sum(r.n_input for _, r in reports),
        n_kept=sum(r.n_kept for _, r in reports),
        removed_keyword=sum(r.removed_keyword for _, r in reports),
        removed_semantic=sum(r.removed_semantic for _, r in reports),
        kept_ids=[prefixed(n, i) for n, r in reports for i in r.kept_ids],
        removed_keyword_ids=[prefixed(n, i) for n, r in reports for i in r.removed_keyword_ids],
        removed_semantic_ids=[prefixed(n, i) for n, r in reports for i in r.removed_semantic_ids],
    )


def merge_bases(store: ArtifactStore, bases: list[KnowledgeBaseSlice]) -> None:
    """Write the run folder's pairs, filter report and grid from the bases' own (multi-base runs only)."""
    if bases[0].name is None:
        return  # the only base's stages wrote the run folder's files themselves
    pairs_all: list[QAPair] = []
    pairs: list[QAPair] = []
    rows: list[ExperimentInput] = []
    reports: list[tuple[str, FilterReport]] = []
    for base in bases:
        part, name = ArtifactStore(base.out), str(base.name)
        pairs_all += _pairs(name, part.load(kon_files.QA_PAIRS_ALL))
        pairs += _pairs(name, part.load(kon_files.QA_PAIRS))
        rows += _inputs(name, part.load(kon_files.EXPERIMENT_INPUTS))
        reports.append((name, part.load(kon_files.FILTER_REPORT)))
    store.save(kon_files.QA_PAIRS_ALL, pairs_all)
    store.save(kon_files.QA_PAIRS, pairs)
    store.save(kon_files.FILTER_REPORT, merged_filter_report(reports))
    store.save(kon_files.EXPERIMENT_INPUTS, rows)


def summed(counts: list[dict[str, int]]) -> dict[str, int]:
    """Per-base counts added up, key by key (for the manifest)."""
    total: dict[str, int] = {}
    for part in counts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total


def failures_of(bases: list[KnowledgeBaseSlice], summaries: list[Any]) -> list[dict[str, Any]]:
    """The stage failures the bases' summaries carry, each naming its base in a multi-base run."""
    return [
        {**failure, "knowledge_base": base.name} if base.name else failure
        for base, summary in zip(bases, summaries)
        for failure in summary.failures
    ]
