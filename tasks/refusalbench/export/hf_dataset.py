"""``refusalbench export RUN --format hf --out DIR``: a run's benchmark as a Hugging Face dataset.

The export folder (declared here: it is not a run-folder artifact)::

    DIR/README.md                                        dataset card, YAML metadata (tasks.dataset_card)
    DIR/data/<variant>/test-00000-of-00001.parquet        the benchmark's rows of one variant (single|multi)

One split, ``test`` (a benchmark is evaluation data). The card's ``configs:`` name the
config ``default`` (every row) and, when the benchmark holds both variants, ``single``
and ``multi`` (one variant each; no row is stored twice). ``load_dataset(DIR)`` reads
the card; ``load_dataset("parquet", data_dir=DIR)`` finds the same files by their
``test-`` names. Every file keeps ``benchmark.parquet``'s Arrow schema as it is, so
nested columns (``passages``: a list of structs) survive and all configs share one
schema. A variant with more than ``max_rows`` rows is cut into numbered shards.

Everything is read and checked first (bad input is an :class:`InputError`: one line,
exit 2); the folder is then written under a temporary name and moved into place, so a
failed export leaves nothing half-written. A non-empty ``DIR`` is refused unless
``force``, which replaces only ``README.md`` and ``data/`` (a clone of a Hub dataset
repository keeps its ``.git`` and ``.gitattributes``).
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.runfolder import RunManifest
from refusalbench.tasks.core.store import ArtifactStore, storage_options
from refusalbench.tasks.llm.prompting import all_template_hashes
from refusalbench.tasks.refusalbench.export.card_provenance import RunFacts
from refusalbench.tasks.refusalbench.export.dataset_card import ExportConfig, render_card
from refusalbench.tasks.refusalbench.levers import catalogue_hash, load_catalogue
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark
from refusalbench.tasks.refusalbench.taxonomy import VARIANTS

FORMATS = ("hf",)
SPLIT = "test"
DATA_DIR = "data"
CARD = "README.md"
MAX_ROWS_PER_SHARD = 100_000


def shard_path(variant: str, index: int, total: int) -> str:
    """``data/single/test-00000-of-00001.parquet``: the Hub's ``<split>-NNNNN-of-NNNNN`` naming."""
    return f"{DATA_DIR}/{variant}/{SPLIT}-{index:05d}-of-{total:05d}.parquet"


@dataclass
class ExportResult:
    out: str
    rows: int
    files: list[str]
    configs: list[ExportConfig]
    notes: list[str]


# ---------------------------------------------------------------- reading the run


def _check_run_folder(run_dir: str) -> None:
    # ArtifactStore creates a local folder: a mistyped RUN must fail before it leaves one.
    try:
        fs, path = fsspec.core.url_to_fs(run_dir, **storage_options(run_dir))
        found = fs.isdir(path)
    except Exception as exc:  # unknown protocol, unreachable bucket ...
        raise InputError(run_dir, f"cannot open the run folder ({type(exc).__name__})") from None
    if not found:
        raise InputError(run_dir, "no such run folder")


def _load(store: ArtifactStore, artifact: runfolder.Artifact) -> Any:
    try:
        return store.load(artifact)
    except (ValidationError, ValueError) as exc:
        raise InputError(store.uri(artifact.name), f"not a valid {artifact.name} ({type(exc).__name__})") from None


def _generation_manifest(store: ArtifactStore) -> tuple[RunManifest | None, str | None, bool]:
    """(the generation's manifest, its file, whether the folder also holds an evaluation)."""
    manifest = _load(store, runfolder.MANIFEST) if store.has(runfolder.MANIFEST) else None
    evaluated = store.has(rb_files.JUDGMENTS) or bool(manifest and manifest.kind == "evaluate")
    if store.has(rb_files.GENERATION_MANIFEST):
        return _load(store, rb_files.GENERATION_MANIFEST), rb_files.GENERATION_MANIFEST.name, evaluated
    if manifest is not None and manifest.kind == "generate":
        return manifest, runfolder.MANIFEST.name, evaluated
    return None, None, evaluated


def read_run(run_dir: str) -> RunFacts:
    """Everything the export writes, read from ``run_dir`` and checked (InputError on bad input)."""
    _check_run_folder(run_dir)
    store = ArtifactStore(run_dir)
    if not store.has(rb_files.BENCHMARK):
        raise InputError(
            store.uri(rb_files.BENCHMARK.name),
            "no benchmark.parquet in this run folder (refusalbench generate or run writes it)",
        )
    items = read_benchmark(store.uri(rb_files.BENCHMARK.name))  # every row checked; an empty one is refused
    table = store.read_table(rb_files.BENCHMARK.name)
    manifest, source, evaluated = _generation_manifest(store)
    if manifest is not None and manifest.status != "completed":
        assert source is not None, "a manifest comes with the file it was read from"
        raise InputError(
            store.uri(source), f"the generation run did not complete (status {manifest.status}): export a finished run"
        )
    gv = _load(store, rb_files.GV_ANALYSIS) if store.has(rb_files.GV_ANALYSIS) else None
    audit = _load(store, rb_files.AUDIT) if store.has(rb_files.AUDIT) else None
    assigned = None
    if store.has(rb_files.ASSIGNMENTS):
        assigned = [str(v) for v in store.read_table(rb_files.ASSIGNMENTS.name).column("lever_id").to_pylist()]
    catalogue = load_catalogue()
    facts = RunFacts(
        run_uri=store.uri(""),
        benchmark=table,
        manifest=manifest,
        manifest_source=source,
        evaluated=evaluated,
        gv=gv,
        audit=audit,
        assigned_levers=assigned,
        catalogue=catalogue,
        catalogue_hash_now=catalogue_hash(catalogue),
        prompt_hashes_now=all_template_hashes(),
    )
    audited = (
        store.read_table(rb_files.AUDIT_SAMPLE.name).column("item_id").to_pylist()
        if audit is not None and store.has(rb_files.AUDIT_SAMPLE)
        else None
    )
    facts.notes.extend(consistency_notes(facts, len(items), audited))
    return facts


def consistency_notes(facts: RunFacts, rows: int, audited: list[str] | None = None) -> list[str]:
    """Where the run's own records disagree with the benchmark file (it was changed after generation).

    ``audited``: item ids of ``audit_sample.parquet``, when the folder has one.
    """
    notes = []
    if facts.gv is not None and facts.gv.funnel.get("sampled") != rows:
        notes.append(
            f"gv_analysis.json counts {facts.gv.funnel.get('sampled')} sampled items but benchmark.parquet "
            f"holds {rows}: the benchmark was changed after generation, the funnel describes the original"
        )
    if facts.audit is not None and audited is not None:
        ids = set(facts.benchmark.column("item_id").to_pylist())
        outside = sum(item_id not in ids for item_id in audited)
        if outside:
            notes.append(
                f"{outside} of the {len(audited)} audited items are not in benchmark.parquet: the audit "
                "describes an earlier benchmark"
            )
    return notes


# ---------------------------------------------------------------- layout


def split_files(table: pa.Table, max_rows: int = MAX_ROWS_PER_SHARD) -> dict[str, pa.Table]:
    """Relative path -> rows, one folder per variant present, in benchmark order."""
    files: dict[str, pa.Table] = {}
    present = set(table.column("variant").to_pylist())
    for variant in [v for v in VARIANTS if v in present] + sorted(present - set(VARIANTS)):
        rows = table.filter(pc.equal(table.column("variant"), variant))
        total = max(1, math.ceil(rows.num_rows / max_rows))
        for index in range(total):
            files[shard_path(variant, index, total)] = rows.slice(index * max_rows, max_rows)
    return files


def export_configs(files: dict[str, pa.Table]) -> list[ExportConfig]:
    """``default`` over every file; one config per variant when there are several."""
    variants = list(dict.fromkeys(path.split("/")[1] for path in files))
    rows = {v: sum(t.num_rows for p, t in files.items() if p.split("/")[1] == v) for v in variants}
    configs = [ExportConfig("default", SPLIT, f"{DATA_DIR}/*/{SPLIT}-*.parquet", sum(rows.values()), default=True)]
    if len(variants) > 1:
        configs += [ExportConfig(v, SPLIT, f"{DATA_DIR}/{v}/{SPLIT}-*.parquet", rows[v]) for v in variants]
    return configs


# ---------------------------------------------------------------- writing


def _check_out(out: Path, force: bool) -> None:
    if "://" in str(out):
        raise InputError(str(out), "the export is written to a local folder (upload it from there)", field="--out")
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "exists and is not a folder", field="--out")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise InputError(
            str(out), "the folder is not empty; pass --force to replace its README.md and data/", field="--out"
        )
    data = out / DATA_DIR
    if data.exists() and (not data.is_dir() or any(p.is_file() and p.suffix != ".parquet" for p in data.rglob("*"))):
        # --force replaces a dataset's data folder, never one that holds anything else (a project's data/).
        raise InputError(
            str(data),
            "holds files other than Parquet: not an export's data folder, choose another --out",
            field="--out",
        )


def _write_tree(folder: Path, files: dict[str, pa.Table], card: str) -> None:
    for relative, table in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target, compression="zstd")
    (folder / CARD).write_text(card, encoding="utf-8")


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished tree into ``out``: whole when ``out`` is new or empty, else README.md and data/ only."""
    if not out.exists() or not any(out.iterdir()):
        os.replace(tmp, out)  # an empty folder is replaced atomically
        return
    stale = out / f".{DATA_DIR}.old-{uuid.uuid4().hex[:8]}"
    if (out / DATA_DIR).exists():
        os.replace(out / DATA_DIR, stale)
    try:
        os.replace(tmp / DATA_DIR, out / DATA_DIR)
    except BaseException:
        if stale.exists():
            os.replace(stale, out / DATA_DIR)
        raise
    os.replace(tmp / CARD, out / CARD)
    shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)


def export_run(
    run_dir: str,
    out_dir: str | Path,
    *,
    fmt: str = "hf",
    force: bool = False,
    pretty_name: str | None = None,
    languages: Sequence[str] = ("en",),
    max_rows: int = MAX_ROWS_PER_SHARD,
) -> ExportResult:
    """Export the benchmark of ``run_dir`` to ``out_dir`` (see the module docstring)."""
    if fmt not in FORMATS:
        raise InputError(fmt, f"unknown export format (known: {', '.join(FORMATS)})", field="--format")
    if max_rows < 1:
        raise ValueError("max_rows must be at least 1")
    out = Path(out_dir)
    _check_out(out, force)
    if "://" not in run_dir and out.exists() and out.resolve() == Path(run_dir).resolve():
        raise InputError(str(out), "is the run folder itself: export to a folder of its own", field="--out")
    facts = read_run(run_dir)
    files = split_files(facts.benchmark, max_rows)
    configs = export_configs(files)
    name = pretty_name or (
        f"RefusalBench benchmark {facts.manifest.run_id}"
        if facts.manifest
        else f"RefusalBench benchmark ({Path(str(run_dir).rstrip('/')).name})"
    )
    card = render_card(facts, configs, pretty_name=name, languages=list(languages) or ["en"])

    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Beside the target (same filesystem: the moves are renames); inside it when it already has content.
    home = out if out.is_dir() and any(out.iterdir()) else out.parent
    tmp = home / f".{out.name}.export-{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.mkdir()
        _write_tree(tmp, files, card)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(
        out=str(out), rows=facts.benchmark.num_rows, files=sorted([*files, CARD]), configs=configs, notes=facts.notes
    )
