"""Provenance of a run: ``manifest.json`` in the run folder.

It records what produced the artifacts (config hash and content, prompt template and
lever catalogue hashes, package version, seed), how long each stage took, how many
items went in and out of each stage, and the model-call accounting. The manifest is
rewritten after every stage, so an interrupted run still says how far it got.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from refusalbench.tasks import runfolder
from refusalbench.tasks.records import RunManifest
from refusalbench.tasks.store import ArtifactStore


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("refusalbench")
    except Exception:
        from refusalbench.tasks import __version__

        return __version__


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class ManifestRecorder:
    def __init__(self, store: ArtifactStore, kind: str, *, config: Any = None, seed: int | None = None,
                 run_id: str | None = None):
        self.store = store
        config_dump = config.model_dump(mode="json") if config is not None else {}
        self.manifest = RunManifest(
            schema_version=runfolder.SCHEMA_VERSION,
            run_id=run_id or uuid.uuid4().hex[:12],
            kind=kind,
            created_at=now(),
            package_version=package_version(),
            config_hash=config.fingerprint() if config is not None else "",
            config=config_dump,
            seed=seed,
        )

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage that runs inside this block (the manifest is saved after it)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timing(name, time.perf_counter() - started)

    def timing(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to a stage's time, for stages whose span is measured elsewhere
        (e.g. from task completion times when two stages overlap)."""
        self.manifest.timings_s[name] = round(self.manifest.timings_s.get(name, 0.0) + max(seconds, 0.0), 3)
        self.save()

    def count(self, **counts: Any) -> None:
        self.manifest.counts.update(counts)

    def note(self, text: str) -> None:
        if text not in self.manifest.notes:
            self.manifest.notes.append(text)

    def artifact(self, *artifacts: runfolder.Artifact | str) -> None:
        for name in map(str, artifacts):
            if name not in self.manifest.artifacts:
                self.manifest.artifacts.append(name)

    def hashes(self, *, catalogue: str | None = None, prompts: dict[str, str] | None = None) -> None:
        if catalogue:
            self.manifest.catalogue_hash = catalogue
        if prompts:
            self.manifest.prompt_hashes.update(prompts)

    def calls(self, stats: dict[str, Any]) -> None:
        self.manifest.calls = stats

    def save(self) -> str:
        return self.store.save(runfolder.MANIFEST, self.manifest)

    def finish(self, status: str = "completed") -> str:
        self.manifest.status = status  # type: ignore[assignment]
        self.manifest.finished_at = now()
        return self.save()

    @contextmanager
    def run(self) -> Iterator["ManifestRecorder"]:
        """The span of a whole run: the manifest ends ``completed``, or ``failed`` on any exception.

        BaseException, not Exception: a cancelled or interrupted run must not stay ``running``.
        """
        try:
            yield self
        except BaseException:
            self.finish("failed")
            raise
        self.finish("completed")
