"""Provenance of a run: ``manifest.json`` in the run folder.

It records what produced the artifacts (config hash and content, prompt template and
lever catalogue hashes, package version, seed), how long each stage took, how many
items went in and out of each stage, and the model-call accounting. The manifest is
rewritten after every stage, so an interrupted run still says how far it got.

The recorder also tells the run's story (``core.narration.story``: in a pipeline run, the
Prefect UI's Logs tab): each stage's start, and its end with its time and the counts
recorded during it; notes as warnings; the model calls and the outcome at the end. The
terminal shows none of it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from refusalbench.tasks.core import clocks, runfolder
from refusalbench.tasks.core.narration import story
from refusalbench.tasks.core.runfolder import RunManifest
from refusalbench.tasks.core.store import ArtifactStore


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("refusalbench")
    except Exception:
        from refusalbench.tasks import __version__

        return __version__


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ManifestRecorder:
    def __init__(
        self, store: ArtifactStore, kind: str, *, config: Any = None, seed: int | None = None, run_id: str | None = None
    ):
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
        self._started = time.perf_counter()
        self._clocks_at_start = clocks.snapshot()  # this run's clocks only: a process may run several flows
        self._stage_counts: dict[str, Any] | None = None  # counts recorded inside the open stage

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage that runs inside this block (the manifest is saved after it)."""
        story("stage %s: started", name)
        outer, self._stage_counts = self._stage_counts, {}
        started = time.perf_counter()
        try:
            with clocks.clock_scope(name), clocks.timed("stage"):  # the flow thread's wall and CPU in it
                yield
        except BaseException as exc:
            seconds = time.perf_counter() - started
            story("stage %s: failed after %.1f s: %s: %s", name, seconds, type(exc).__name__, exc, level=logging.ERROR)
            self._add_time(name, seconds)
            raise
        else:
            seconds = time.perf_counter() - started
            story("stage %s: done in %.1f s%s", name, seconds, counts_text(self._stage_counts))
            self._add_time(name, seconds)
        finally:
            self._stage_counts = outer

    def timing(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to a stage's time, for stages whose span is measured elsewhere
        (e.g. from task completion times when two stages overlap)."""
        story("stage %s: done in %.1f s", name, max(seconds, 0.0))
        self._add_time(name, seconds)

    def _add_time(self, name: str, seconds: float) -> None:
        self.manifest.timings_s[name] = round(self.manifest.timings_s.get(name, 0.0) + max(seconds, 0.0), 3)
        self.save()

    def count(self, **counts: Any) -> None:
        """Record counts; the Logs tab shows them with the end of the open stage (at once outside one)."""
        self.manifest.counts.update(counts)
        if self._stage_counts is not None:
            self._stage_counts.update(counts)
        else:
            story("counts%s", counts_text(counts))

    def note(self, text: str) -> None:
        if text not in self.manifest.notes:
            self.manifest.notes.append(text)
            story("note: %s", text, level=logging.WARNING)

    def artifact(self, *artifacts: runfolder.Artifact | str) -> None:
        for name in map(str, artifacts):
            if name not in self.manifest.artifacts:
                self.manifest.artifacts.append(name)

    def hashes(self, *, catalogue: str | None = None, prompts: dict[str, str] | None = None) -> None:
        if catalogue:
            self.manifest.catalogue_hash = catalogue
        if prompts:
            self.manifest.prompt_hashes.update(prompts)

    def calls(self, stats: dict[str, Any], structured_output_fallbacks: dict[str, str] | None = None) -> None:
        """The run's call accounting per model, and the structured-output mode each model fell back to."""
        self.manifest.calls = stats
        for model, counters in stats.items():
            story("model calls: %s: %s", model, calls_text(counters))
        self.manifest.structured_output_fallbacks = dict(structured_output_fallbacks or {})
        for model, mode in sorted(self.manifest.structured_output_fallbacks.items()):
            hint = (
                " (json_schema: false in its config asks for json_object from the start)"
                if mode == "json_object"
                else ""
            )
            self.note(
                f"{model}: its provider rejected the structured-output mode with a 400; its calls used "
                f"{mode} instead{hint}"
            )

    def costs(self, costs: dict[str, Any]) -> None:
        """The run's tokens and cost per stage and model (``accounting.cost_summary``), with its budget."""
        self.manifest.costs = costs
        total = costs.get("total") or {}
        if total.get("unpriced_calls"):
            unpriced = sorted(m for m, c in (costs.get("by_model") or {}).items() if c.get("unpriced_calls"))
            self.note(
                f"cost unknown (no price in the config or LiteLLM's map) for {total['unpriced_calls']} call(s) "
                f"of {', '.join(unpriced)}: the total counts only the priced calls (priced_cost_usd)"
            )

    def save(self) -> str:
        self.manifest.timings = clocks.since(self._clocks_at_start)
        return self.store.save(runfolder.MANIFEST, self.manifest)

    def finish(self, status: str = "completed") -> str:
        self.manifest.status = status  # type: ignore[assignment]
        self.manifest.finished_at = now()
        uri = self.save()
        story(
            "%s run %s: %s after %.1f s; manifest: %s",
            self.manifest.kind,
            self.manifest.run_id,
            status,
            time.perf_counter() - self._started,
            uri,
            level=logging.INFO if status == "completed" else logging.ERROR,
        )
        return uri

    @contextmanager
    def run(self) -> Iterator[ManifestRecorder]:
        """The span of a whole run: the manifest ends ``completed``, or ``failed`` on any exception.

        BaseException, not Exception: a cancelled or interrupted run must not stay ``running``.
        """
        try:
            yield self
        except BaseException:
            self.finish("failed")
            raise
        self.finish("completed")


def counts_text(counts: dict[str, Any], width: int = 300) -> str:
    """`` · name=value`` per count for a log line; long values cut at ``width`` characters."""
    parts = []
    for name, value in counts.items():
        shown = (
            str(value)
            if isinstance(value, (int, float, str))
            else json.dumps(value, default=str, separators=(", ", ": "))
        )
        parts.append(f" · {name}={shown if len(shown) <= width else shown[: width - 1] + '…'}")
    return "".join(parts)


def calls_text(counters: dict[str, float]) -> str:
    """One model's gateway counters for a log line: http calls, cache hits, retries, errors, tokens, cost."""
    shown = [
        f"{int(counters.get(name, 0))} {label}"
        for name, label in (
            ("http_calls", "http calls"),
            ("cache_hits", "cache hits"),
            ("retries", "retries"),
            ("errors", "errors"),
            ("parse_errors", "parse errors"),
        )
    ]
    tokens = int(counters.get("prompt_tokens", 0) + counters.get("completion_tokens", 0))
    cost = counters.get("cost_usd", 0.0)
    unpriced = int(counters.get("unpriced_calls", 0))
    return (
        ", ".join(shown)
        + f", {tokens} tokens"
        + (f", ${cost:.4f}" if cost else "")
        + (f", cost unknown for {unpriced} call(s)" if unpriced else "")
    )
