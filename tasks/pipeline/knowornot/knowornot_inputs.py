"""What a KnowOrNot run checks and settles before its first task: inputs, sources, models, digests.

Every input is checked before anything is written (``check_knowornot_inputs``); the tasks get the
config with the knowledge-base paths resolved against the config's folder
(``with_resolved_sources``), since a task may run in another process or folder; what their cache
key cannot see (file contents, prompt templates, package version) is digested here. The embedder
and the overlap audit's modules are warmed up while the command waits for Prefect.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.core.config_sections import KnowledgeBaseSource, KnowOrNotConfig
from refusalbench.tasks.core.errors import InputError, ModelUnavailable
from refusalbench.tasks.core.provenance import package_version
from refusalbench.tasks.knowornot.document_readers import read_documents
from refusalbench.tasks.knowornot.stages.diversity import load_text_tools
from refusalbench.tasks.knowornot.stages.embeddings import embedder_for, start_loading
from refusalbench.tasks.knowornot.stages.retrieval import (
    pair_text,
)
from refusalbench.tasks.knowornot.stages.sources import POLICYBENCH_FILES, load_qa_pairs, policybench_import_hint
from refusalbench.tasks.pipeline.budget_prices import check_budget_prices
from refusalbench.tasks.pipeline.fanout import (
    content_digest,
)


def knowornot_section(cfg: RunConfig) -> KnowOrNotConfig:
    """The config's knowornot section: a KnowOrNot run's config has one (``check_knowornot_inputs``)."""
    kon = cfg.knowornot
    assert kon is not None, "check_knowornot_inputs refuses a config without a knowornot section"
    return kon


def check_knowornot_inputs(cfg: RunConfig) -> None:
    """Everything a KnowOrNot run needs from its config, checked before anything is written."""
    if cfg.knowornot is None:
        raise InputError(
            str(cfg.source),
            "the config has no knowornot section (configs/knowornot-demo.yaml has one)",
            field="knowornot",
        )
    kon = knowornot_section(with_resolved_sources(cfg))
    written: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = cfg.knowornot.knowledge_bases or [cfg.knowornot]
    sources: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = kon.knowledge_bases or [kon]
    for i, (source, as_written) in enumerate(zip(sources, written)):
        key: tuple[str | int, ...] = ("knowornot", "knowledge_bases", i) if kon.knowledge_bases else ("knowornot",)
        if source.qa_pairs:
            _check_imported(source.qa_pairs, str(as_written.qa_pairs))
            load_qa_pairs(cfg.input_path(str(as_written.qa_pairs), (*key, "qa_pairs")))
        else:
            read_documents(
                [cfg.input_path(d, (*key, "documents", j)) for j, d in enumerate(as_written.documents or [])]
            )
    # The embedding model too: its requests are priced and admitted like the chat models' calls.
    check_budget_prices(cfg, knowornot_models(kon) + kon.evaluator_comparison)


def _check_imported(path: str, as_written: str) -> None:
    """A released PolicyBench file that is not there yet: the one line says how to import it."""
    if Path(path).name in POLICYBENCH_FILES and "://" not in path and not Path(path).exists():
        raise InputError(
            as_written,
            "file not found (beside the config, nor in the working folder): "
            + policybench_import_hint(str(Path(as_written).parent)),
        )


def with_resolved_sources(cfg: RunConfig) -> RunConfig:
    """The config with its QA file and documents resolved against the config's folder (tasks may run elsewhere)."""

    def resolved(source: Any) -> Any:
        return source.model_copy(
            update={
                "documents": [cfg.resolve_path(d) for d in source.documents or []] or None,
                "qa_pairs": cfg.resolve_path(source.qa_pairs) if source.qa_pairs else None,
            }
        )

    kon = resolved(cfg.knowornot)
    if kon.knowledge_bases:
        kon = kon.model_copy(update={"knowledge_bases": [resolved(kb) for kb in kon.knowledge_bases]})
    return cfg.model_copy(update={"knowornot": kon})


def with_targets(cfg: RunConfig, usable: list[str]) -> RunConfig:
    """The config with only the targets that can run (``skip_unavailable`` left the others out)."""
    kon = knowornot_section(cfg)
    targets = [t for t in kon.targets if t in usable]
    if not targets:
        raise ModelUnavailable(f"{cfg.source or 'config'}: knowornot.targets: none of {', '.join(kon.targets)} can run")
    return cfg.model_copy(update={"knowornot": kon.model_copy(update={"targets": targets})})


def knowornot_models(kon: KnowOrNotConfig) -> list[str]:
    """The models a run calls: targets, evaluator, extractor and embedding model, each once."""
    helpers = [m for m in (kon.extractor, kon.embedding_model) if m]
    return list(dict.fromkeys(kon.targets + [kon.evaluator] + helpers))


def input_digest(kon: KnowOrNotConfig, templates: dict[str, str]) -> str:
    """What the stages read that their cache key cannot see: KB file contents, templates, package version."""
    return content_digest(kon.model_dump(mode="json"), source_digest(kon), templates, package_version())


def warm_up_embedder(cfg: RunConfig) -> None:
    """Start loading the embedding model in the background if this run will encode texts its call
    cache does not hold, so the model loads (seconds on 2 cores) while the flow run starts and the
    first stages run; a re-run over cached vectors never loads it. A base built from documents has
    its pairs only after its LLM calls, so it counts as needing the model."""
    kon = knowornot_section(with_resolved_sources(cfg))
    embedder = embedder_for(cfg)
    if not hasattr(getattr(embedder, "inner", embedder), "load_in_background"):
        return  # nothing to load (an API model, the hashing stand-in)
    texts: list[str] = []
    sources: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = kon.knowledge_bases or [kon]
    for source in sources:
        if not source.qa_pairs:
            start_loading(embedder)
            return
        texts += [pair_text(p) for p in load_qa_pairs(source.qa_pairs)]
    missing = getattr(embedder, "missing", None)
    if missing is None or missing(texts):
        start_loading(embedder)


def warm_up_overlap_audit() -> None:
    """Start importing what the overlap audit needs (scikit-learn, NLTK's stemmer, the report's modules)
    on a background thread: the command's start mostly waits on Prefect's API, so the imports cost no
    wall time there, while beside the calls (``audit_beside_calls``) they would compete for the GIL."""

    def load() -> None:
        load_text_tools()
        importlib.import_module("refusalbench.tasks.knowornot.report.page")

    threading.Thread(target=load, name="kon-audit-imports", daemon=True).start()


def source_digest(kon: KnowOrNotConfig) -> str:
    """Content hash of the knowledge-base files (Prefect's cache cannot see file contents)."""
    digest = hashlib.sha256()
    sources: Sequence[KnowledgeBaseSource | KnowOrNotConfig] = kon.knowledge_bases or [kon]
    for path in [p for s in sources for p in ([s.qa_pairs] if s.qa_pairs else []) + list(s.documents or [])]:
        p = Path(path)
        for file in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if file.is_file():
                digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
