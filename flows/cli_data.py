"""``refusalbench data``: check a base set, or build one from the public sources.

``data import kilt-nq`` and ``data import garage`` run the importers of
``refusalbench.tasks.refusalbench.basesets`` (the paper's App. C.1 curation) with a progress bar on stderr,
print one summary line of what was kept and why the rest was not, and write the output only
once everything was read: a malformed source line (exit 2, ``FILE:LINE: field: problem``) or an
interruption leaves no output file behind. ``data import release`` writes the paper authors'
released RefusalBench-NQ or -GaRAGe as a benchmark file for ``evaluate`` (``schema/released.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from refusalbench.tasks.core.errors import InputError

if TYPE_CHECKING:
    from refusalbench.tasks.refusalbench.schema.records import BaseItem

data_app = typer.Typer(help="Base sets: check one, or build one from the public sources.", no_args_is_help=True)
import_app = typer.Typer(
    help="Build a base set from a public source (the paper's App. C.1 curation), or bring in "
    "the KnowOrNot paper's released PolicyBench question sets, or turn RefusalBench's released "
    "benchmarks into a benchmark file.",
    no_args_is_help=True,
)
data_app.add_typer(import_app, name="import")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@data_app.command("validate")
def data_validate(file: Path = typer.Argument(..., help="base set (JSONL, Parquet or CSV)")) -> None:
    """Validate a base set; prints FILE:LINE: field: problem for every problem (exit 2)."""
    from refusalbench.tasks.refusalbench.basesets import validate_base_set

    problems = validate_base_set(file)
    if problems:
        for problem in problems:
            err.print(problem, markup=False, highlight=False)
        raise typer.Exit(2)
    out.print(f"{file}: OK")


@contextmanager
def _byte_bar(title: str) -> Iterator[Callable[[int, int], None]]:
    """An ``on_progress(bytes_read, total)`` callback drawing a bar on stderr (only on a terminal,
    so logs and captured output get the summary line alone)."""
    columns = (TextColumn(title), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(title, total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield on_progress


def _check_out(out_file: Path, *sources: Path) -> None:
    from refusalbench.tasks.refusalbench.basesets import JSONL_SUFFIXES

    if out_file.suffix.lower() not in JSONL_SUFFIXES:
        raise InputError(
            str(out_file), f"the base set is written as JSON lines: name it *{JSONL_SUFFIXES[0]}", field="--out"
        )
    if any(out_file.resolve() == source.resolve() for source in sources):
        raise InputError(str(out_file), "the output would replace a source file", field="--out")


def _summary(counts: Counter[str], order: list[tuple[str, str]]) -> str:
    """``label count`` for the outcomes that occurred, in a fixed order, then any others."""
    labels = dict(order)
    parts = [f"{label} {counts[key]}" for key, label in order if counts.get(key)]
    parts += [
        f"{key.replace('_', ' ')} {value}"
        for key, value in sorted(counts.items())
        if key not in labels and key != "kept" and value
    ]
    return ", ".join(parts)


def _write(
    items: list[BaseItem], out_file: Path, source: Path, counts: Counter[str], order: list[tuple[str, str]]
) -> None:
    from refusalbench.tasks.refusalbench.basesets import write_base_set

    if not items:
        raise InputError(str(source), f"no item passed the curation ({_summary(counts, order) or 'no records'})")
    write_base_set(items, out_file)  # temporary file then rename: never a partial base set
    out.print(f"{out_file}: {len(items)} items ({_summary(counts, order)})", highlight=False)


_KILT_OUTCOMES = [
    ("no_short_answer", "without a short answer"),
    ("answer_not_in_passage", "answer not in the cited passage"),
    ("not_sampled", "not sampled"),
    ("pages_read", "knowledge pages read"),
    ("pages_kept", "cited pages used"),
    ("pages_not_found", "cited pages missing from the dump"),
]


@import_app.command("kilt-nq")
def import_kilt_nq(
    questions: Path = typer.Option(
        ..., "--questions", help="KILT's NQ file (nq-dev-kilt.jsonl or nq-train-kilt.jsonl)"
    ),
    knowledge: Path = typer.Option(
        ...,
        "--knowledge",
        help="KILT's knowledge source (kilt_knowledgesource.json, JSON lines, ~35 GB; streamed once)",
    ),
    out_file: Path = typer.Option(..., "--out", help="base set to write (JSON lines)"),
    n: int | None = typer.Option(None, "--n", min=1, help="draw this many of the items that pass (default: all)"),
    seed: int = typer.Option(0, "--seed", help="seed of the draw"),
) -> None:
    """NaturalQuestions via KILT: single-document items whose cited passage holds a short answer."""
    from refusalbench.tasks.refusalbench.basesets import import_kilt_nq as run_import

    _check_out(out_file, questions, knowledge)
    counts: Counter[str] = Counter()
    with _byte_bar("kilt-nq") as on_progress:
        items = run_import(questions, knowledge, n=n, seed=seed, on_progress=on_progress, stats=counts)
    _write(items, out_file, questions, counts, _KILT_OUTCOMES)


@import_app.command("garage")
def import_garage(
    source: Path = typer.Argument(..., help="GaRAGe's JSON lines (GaRAGe_benchmark.jsonl)"),
    out_file: Path = typer.Option(..., "--out", help="base set to write (JSON lines)"),
    n: int | None = typer.Option(
        None, "--n", min=1, help="draw this many, split evenly over the paper's five domains (default: all that pass)"
    ),
    seed: int = typer.Option(0, "--seed", help="seed of the draw"),
) -> None:
    """GaRAGe: multi-document items (10 passages each) from the paper's five domains."""
    from refusalbench.tasks.refusalbench.basesets import import_garage as run_import

    _check_out(out_file, source)
    counts: Counter[str] = Counter()
    with _byte_bar("garage") as on_progress:
        items = run_import(source, n=n, seed=seed, on_progress=on_progress, stats=counts)
    _write(items, out_file, source, counts, [("not_sampled", "not sampled"), ("domain_shortfall", "domain shortfall")])


@import_app.command("policybench")
def import_policybench(
    source: Path = typer.Argument(
        ...,
        help="folder with the released PolicyBench files (BTT_QA.json, "
        "CPF_filtered_qa.json, ICA_filtered_qa.json, medishield_QA.json)",
    ),
    out_dir: Path = typer.Option(
        Path("data/policybench"), "--out", help="where configs/paper-policybench.yaml reads them"
    ),
) -> None:
    """KnowOrNot's PolicyBench: check the four released QA files and copy them, unchanged, for the paper's config."""
    from refusalbench.tasks.knowornot.stages.sources import POLICYBENCH_FILES
    from refusalbench.tasks.knowornot.stages.sources import import_policybench as run_import

    counts = run_import(source, out_dir)
    for name, n in counts.items():
        if n != POLICYBENCH_FILES[name]:
            err.print(
                f"note: {name} has {n} questions; the paper's release has {POLICYBENCH_FILES[name]}",
                markup=False,
                highlight=False,
            )
    listed = ", ".join(f"{name} {n}" for name, n in counts.items())
    out.print(f"{out_dir}: {sum(counts.values())} questions in {len(counts)} files ({listed})", highlight=False)


@import_app.command("release")
def import_release(
    source: Path = typer.Argument(
        ..., help="a released RefusalBench benchmark (RefusalBench-NQ or -GaRAGe: JSON lines, JSON list or Parquet)"
    ),
    out_file: Path = typer.Option(..., "--out", help="benchmark file to write (Parquet), for evaluate --benchmark"),
    license: str | None = typer.Option(
        None,
        "--license",
        help="the dataset's license, recorded in the file (default: Apache-2.0 for single-passage "
        "items as in RefusalBench-NQ, CC-BY-NC-4.0 when any item has a list of passages as in -GaRAGe)",
    ),
) -> None:
    """The paper authors' released benchmark as a benchmark file evaluate takes, item for item."""
    from refusalbench.tasks.refusalbench.schema.released import read_release, release_table

    if out_file.suffix.lower() != ".parquet":
        raise InputError(str(out_file), "the benchmark is written as Parquet: name it *.parquet", field="--out")
    if out_file.resolve() == source.resolve():
        raise InputError(str(out_file), "the output would replace the source file", field="--out")
    release = read_release(str(source), license)
    import pyarrow.parquet as pq

    out_file.parent.mkdir(parents=True, exist_ok=True)
    partial = out_file.with_name(out_file.name + ".partial")
    pq.write_table(release_table(release), partial)
    partial.replace(out_file)  # never a half-written benchmark under the final name
    facts = release.provenance
    out.print(
        f"{out_file}: {facts['items']} items (single {facts['single']}, multi {facts['multi']}), "
        f"license {facts['license']}, source sha256 {facts['sha256'][:12]}",
        highlight=False,
    )
