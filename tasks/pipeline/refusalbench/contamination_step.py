"""Step of the contamination check (``contamination`` and a refresh round's ``refresh.contamination_static``):
``contamination.json`` and ``contamination.html`` from the static set's and the fresh round's run folders."""

from __future__ import annotations

import dataclasses
from typing import Any

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.pipeline.ui import story
from refusalbench.tasks.refusalbench.report.contamination_section import contamination_page
from refusalbench.tasks.refusalbench.rounds import contamination
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark

DEFAULT_RESAMPLES = 1000  # where evaluation.bootstrap is 0: the check has no figure without resamples


@dataclasses.dataclass(frozen=True)
class Written:
    document: dict[str, Any]
    json_uri: str
    html_uri: str

    @property
    def flagged(self) -> list[str]:
        return sorted(model for model, entry in self.document["models"].items() if entry["flagged"])


def static_strata(static: str) -> list[str]:
    """The strata of the static set (read and checked: exit 2 on a bad file), for the fresh round to generate."""
    strata = contamination.static_strata((i.perturbation_class, i.intensity) for i in read_benchmark(static))
    if not strata:
        raise InputError(static, "no item of a known class x intensity: no fresh round to generate", field="intensity")
    return strata


def _items(store: ArtifactStore) -> int:
    return store.read_table(rb_files.BENCHMARK.name).num_rows if store.has(rb_files.BENCHMARK) else 0


def record_contamination(
    cfg: RunConfig, out: ArtifactStore, static: str, static_run: ArtifactStore, fresh_run: ArtifactStore
) -> Written:
    """Compare the two run folders' judged rows, write both files into ``out`` (atomically), say what it found."""
    evaluation = cfg.evaluation_section()
    document = contamination.contamination_document(
        static_run.read_frame(rb_files.JUDGED.name),
        fresh_run.read_frame(rb_files.JUDGED.name),
        {"path": static, "sha256": contamination.file_sha256(static), "items": _items(static_run),
         "run": static_run.uri("")},
        {"run": fresh_run.uri(""), "items": _items(fresh_run)},
        fdr=cfg.refresh.fdr,
        n_resamples=evaluation.bootstrap or DEFAULT_RESAMPLES,
        seed=evaluation.seed,
    )  # fmt: skip
    html_uri = out.write_text(contamination.HTML_FILE, contamination_page(document))
    json_uri = out.write_json(contamination.FILE, document)  # last: its presence says the check finished
    written = Written(document, json_uri, html_uri)
    story("contamination: %s", f"flagged {', '.join(written.flagged)}" if written.flagged else "no model flagged")
    return written
