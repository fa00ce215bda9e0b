"""Bad input: every case exits 2 with one clear ``FILE:LINE: field: problem`` line.

The cases are defined once, here; ``tests/cli/bad_input_cases.md`` is rendered from them
(``python tests/cli/test_bad_input.py`` rewrites it) and a test keeps the two in sync.
Each case is run through the real CLI entry point in-process (fast); a handful also run
as real processes, to prove that nothing else (warnings, tracebacks) reaches stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE_PATH = Path(__file__).resolve().parent / "bad_input_cases.md"
TEN_MIB = 10 * 1024 * 1024

# ----------------------------------------------------------------- input builders


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _base_row(item_id: str = "a", **changes) -> dict:
    row = {
        "id": item_id,
        "question": "When did the bridge open?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not ...}


def _bench_table(rows_changed: Callable[[list[dict]], None] | None = None, drop: str | None = None) -> pa.Table:
    from refusalbench.tasks.core.tables import to_table
    from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

    items = [
        BenchmarkItem(
            item_id=f"item{i}",
            base_id=f"b{i}",
            variant="single",
            perturbation_class="P-MissingInfo",
            intensity="MEDIUM",
            lever_id="lever",
            generator="gen",
            question=f"Question {i}?",
            context="Some context.",
            original_question="q",
            answers=["x"],
            expected="REFUSE_INFO_MISSING_IN_CONTEXT",
        )
        for i in range(3)
    ]
    table = to_table(items, BenchmarkItem)
    if rows_changed is not None:
        rows = table.to_pylist()
        rows_changed(rows)
        # As another tool would write it: any column may hold nulls (the records' schema allows
        # them only where the record does, and pyarrow would drop a null list to []).
        nullable = pa.schema([field.with_nullable(True) for field in table.schema])
        table = pa.Table.from_pylist(rows, schema=nullable)
    if drop is not None:
        table = table.drop([drop])
    return table


def _write_parquet(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path)
    return path


def _judged_row(item_id: str = "i1", **changes) -> dict:
    row = {
        "model": "m",
        "item_id": item_id,
        "expected": "ANSWER_CORRECTLY",
        "decision": "ANSWER",
        "answer_correct": True,
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not ...}


def _qa_row(pair_id: str = "q1", **changes) -> dict:
    row = {"id": pair_id, "question": "What is the refund window?", "answer": "30 days"}
    row.update(changes)
    return {k: v for k, v in row.items() if v is not ...}


def _enormous_line(first: str, second_line_prefix: str) -> bytes:
    """A valid first line, then a line just over 10 MiB (built in one allocation, quickly)."""
    return first.encode() + second_line_prefix.encode() + b"x" * (TEN_MIB + 16) + b'"}\n'


def text_file(name: str, text: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        path = folder / name
        path.write_text(text, encoding="utf-8")
        return path

    return build


def bytes_file(name: str, make: Callable[[], bytes]) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(make())
        return path

    return build


def parquet_file(name: str, make: Callable[[], pa.Table]) -> Callable[[Path], Path]:
    return lambda folder: _write_parquet(make(), folder / name)


def truncated_parquet(name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        whole = _write_parquet(_bench_table(), folder / ("whole-" + name))
        path = folder / name
        data = whole.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        whole.unlink()
        return path

    return build


def huge_random_file(name: str, size: int) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(os.urandom(1024 * 1024) * (size // (1024 * 1024)))
        return path

    return build


GOOD_CONFIG_MODELS = """models:
  gen:
    model: openai/gen
    api_base: {url}
  ver:
    model: openai/ver
    api_base: {url}
"""


def config_text(body: str, url: str = "http://127.0.0.1:9/v1") -> str:
    return GOOD_CONFIG_MODELS.format(url=url) + body


GOOD_GENERATION = """generation:
  base_set: base.jsonl
  generators: [gen]
  verifiers: [ver]
"""


def unreachable_config(folder: Path) -> Path:
    from refusalbench.tasks.llm.local_models import free_port

    (folder / "base.jsonl").write_text(_jsonl([_base_row()]))
    path = folder / "run.yaml"
    path.write_text(config_text(GOOD_GENERATION, url=f"http://127.0.0.1:{free_port()}/v1"))
    return path


# ----------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # which command the bad file is given to (see COMMANDS)
    input: str  # what is wrong with it, in words
    build: Callable[[Path], Path]  # writes the bad file into a folder, returns its path
    line: int | None  # expected LINE (None: the problem concerns the whole file)
    field: str  # expected field ("-" when none)
    problem: str  # expected start of the problem text

    def expected(self, file: str) -> str:
        where = file if self.line is None else f"{file}:{self.line}"
        return f"{where}: {self.field}: {self.problem}"


# kind -> (command shown in the table, how the bad file is wired in)
COMMANDS: dict[str, str] = {
    "data": "refusalbench data validate FILE",
    "generate-base": "refusalbench generate --config CFG --out DIR  (CFG: generation.base_set = FILE)",
    "generate-config": "refusalbench generate --config FILE --out DIR",
    "evaluate": "refusalbench evaluate --config CFG --benchmark FILE --out DIR",
    "score": "refusalbench score FILE --out DIR",
    "knowornot-qa": "refusalbench knowornot run --config CFG --out DIR  (CFG: knowornot.qa_pairs = FILE)",
    "knowornot-docs": "refusalbench knowornot run --config CFG --out DIR  (CFG: knowornot.documents = [FILE])",
}

NOT_UTF8_BASE = b'{"id": "a", "question": "q", "answers": ["x"], "context": "c"}\n{"id": "b", "question": "caf\xe9?", "answers": ["x"], "context": "c"}\n'
TRUNCATED_BASE = _jsonl([_base_row()]) + '{"id": "b", "question": "When'


def BASE_ENORMOUS() -> bytes:  # named as the constants beside it; made on demand, the file is large
    return _enormous_line(_jsonl([_base_row()]), '{"id": "b", "question": "q", "answers": ["x"], "context": "')


CASES: list[Case] = [
    # ---- base sets (data validate: every problem, one line each)
    Case(
        "base-empty", "data", "empty file (0 bytes)", text_file("base.jsonl", ""), None, "-", "empty file: no records"
    ),
    Case(
        "base-truncated",
        "data",
        "JSONL cut off inside the second record",
        text_file("base.jsonl", TRUNCATED_BASE),
        2,
        "-",
        "not valid JSON",
    ),
    Case(
        "base-not-utf8",
        "data",
        "Latin-1 byte in line 2",
        bytes_file("base.jsonl", lambda: NOT_UTF8_BASE),
        2,
        "-",
        "not UTF-8 (byte 0xe9 at column 29)",
    ),
    Case(
        "base-wrong-type",
        "data",
        "`answers` is a string, not a list",
        text_file("base.jsonl", _jsonl([_base_row(), _base_row("b", answers="1932")])),
        2,
        "answers",
        "must be a list of strings",
    ),
    Case(
        "base-missing-field",
        "data",
        "record without `question`",
        text_file("base.jsonl", _jsonl([_base_row(), _base_row("b", question=...)])),
        2,
        "question",
        "missing field",
    ),
    Case(
        "base-unknown-field",
        "data",
        "typo `answer` for `answers`",
        text_file("base.jsonl", _jsonl([_base_row(), _base_row("b", answers=..., answer=["x"])])),
        2,
        "answer",
        "unknown field",
    ),
    Case(
        "base-duplicate-id",
        "data",
        "id `a` on lines 1 and 2",
        text_file("base.jsonl", _jsonl([_base_row("a"), _base_row("a")])),
        2,
        "id",
        "duplicate id 'a'",
    ),
    Case(
        "base-enormous-line",
        "data",
        "line 2 is longer than 10 MiB",
        bytes_file("base.jsonl", BASE_ENORMOUS),
        2,
        "-",
        "line is longer than 10 MiB",
    ),
    Case(
        "base-parquet-truncated",
        "data",
        "Parquet file cut in half",
        truncated_parquet("base.parquet"),
        None,
        "-",
        "not a readable Parquet file",
    ),
    Case(
        "base-csv-missing-column",
        "data",
        "CSV header without `answers`",
        text_file("base.csv", "id,question,context\na,When?,The bridge opened in 1932.\n"),
        1,
        "answers",
        "missing column",
    ),
    # ---- base sets given to generate (stops before any model call; one line)
    Case(
        "gen-base-empty",
        "generate-base",
        "empty base set",
        text_file("base.jsonl", ""),
        None,
        "-",
        "empty file: no records",
    ),
    Case(
        "gen-base-not-utf8",
        "generate-base",
        "Latin-1 byte in line 2",
        bytes_file("base.jsonl", lambda: NOT_UTF8_BASE),
        2,
        "-",
        "not UTF-8 (byte 0xe9 at column 29)",
    ),
    Case(
        "gen-base-duplicate-id",
        "generate-base",
        "id `a` on lines 1 and 2",
        text_file("base.jsonl", _jsonl([_base_row("a"), _base_row("a")])),
        2,
        "id",
        "duplicate id 'a'",
    ),
    Case(
        "gen-base-enormous-line",
        "generate-base",
        "line 2 is longer than 10 MiB",
        bytes_file("base.jsonl", BASE_ENORMOUS),
        2,
        "-",
        "line is longer than 10 MiB",
    ),
    # ---- run configs
    Case("cfg-empty", "generate-config", "empty file", text_file("run.yaml", ""), None, "-", "empty config file"),
    Case(
        "cfg-truncated",
        "generate-config",
        "YAML cut off inside a flow list",
        text_file("run.yaml", config_text("generation:\n  base_set: base.jsonl\n  generators: [gen, ")),
        10,
        "-",
        "invalid YAML",
    ),
    Case(
        "cfg-not-utf8",
        "generate-config",
        "Latin-1 byte in line 3",
        bytes_file("run.yaml", lambda: b"models:\n  gen:\n    model: openai/caf\xe9\n"),
        3,
        "-",
        "not UTF-8 (byte 0xe9 at column 22)",
    ),
    Case(
        "cfg-wrong-type",
        "generate-config",
        "`max_concurrency: lots`",
        text_file(
            "run.yaml",
            config_text(GOOD_GENERATION).replace(
                "    model: openai/gen\n", "    model: openai/gen\n    max_concurrency: lots\n"
            ),
        ),
        4,
        "models.gen.max_concurrency",
        "Input should be a valid integer",
    ),
    Case(
        "cfg-missing-field",
        "generate-config",
        "generation without `generators`",
        text_file("run.yaml", config_text("generation:\n  base_set: base.jsonl\n  verifiers: [ver]\n")),
        8,
        "generation.generators",
        "required key missing",
    ),
    Case(
        "cfg-duplicate-key",
        "generate-config",
        "model `gen` defined twice",
        text_file("run.yaml", config_text("  gen:\n    model: openai/other\n" + GOOD_GENERATION)),
        8,
        "models.gen",
        "duplicate key 'gen'",
    ),
    Case(
        "cfg-unknown-key",
        "generate-config",
        "typo `filtre` for `filter`",
        text_file("run.yaml", config_text(GOOD_GENERATION + "  filtre: majority\n")),
        12,
        "generation.filtre",
        "unknown key 'filtre'",
    ),
    Case(
        "cfg-unknown-model",
        "generate-config",
        "verifier not in the registry",
        text_file("run.yaml", config_text(GOOD_GENERATION.replace("[ver]", "[nope]"))),
        11,
        "generation.verifiers",
        "model 'nope' is not in the registry",
    ),
    Case(
        "cfg-literal-key",
        "generate-config",
        "an API key pasted into `api_key_env`",
        text_file(
            "run.yaml",
            config_text(GOOD_GENERATION).replace(
                "    model: openai/gen\n", "    model: openai/gen\n    api_key_env: sk-live-0123\n"
            ),
        ),
        4,
        "models.gen.api_key_env",
        "must be the NAME of an environment variable",
    ),
    Case(
        "cfg-unset-variable",
        "generate-config",
        "`api_base: ${RB_UNSET_MODELS_URL}` with the variable unset",
        text_file("run.yaml", config_text(GOOD_GENERATION, url="${RB_UNSET_MODELS_URL}")),
        4,
        "models.gen.api_base",
        "environment variable RB_UNSET_MODELS_URL is not set",
    ),
    Case(
        "cfg-enormous",
        "generate-config",
        "a config of 11 MiB (one huge line)",
        bytes_file("run.yaml", lambda: b"name: " + b"x" * (11 * 1024 * 1024) + b"\n"),
        None,
        "-",
        "too large for a config",
    ),
    Case(
        "cfg-unreachable-model",
        "generate-config",
        "api_base where nothing listens",
        unreachable_config,
        None,
        "models",
        "cannot run gen",
    ),
    # ---- benchmark files
    Case(
        "bench-missing-file",
        "evaluate",
        "path does not exist",
        lambda folder: folder / "nothere.parquet",
        None,
        "-",
        "benchmark file not found",
    ),
    Case(
        "bench-empty-file",
        "evaluate",
        "empty file (0 bytes)",
        text_file("bench.parquet", ""),
        None,
        "-",
        "not a readable Parquet file",
    ),
    Case(
        "bench-no-rows",
        "evaluate",
        "valid Parquet with zero rows",
        parquet_file("bench.parquet", lambda: _bench_table().slice(0, 0)),
        None,
        "-",
        "the benchmark has no items",
    ),
    Case(
        "bench-truncated",
        "evaluate",
        "Parquet file cut in half",
        truncated_parquet("bench.parquet"),
        None,
        "-",
        "not a readable Parquet file",
    ),
    Case(
        "bench-not-parquet",
        "evaluate",
        "Latin-1 JSONL text named .parquet",
        bytes_file("bench.parquet", lambda: b'{"item_id": "caf\xe9"}\n'),
        None,
        "-",
        "not a readable Parquet file",
    ),
    Case(
        "bench-wrong-type",
        "evaluate",
        "`answers` null in row 2",
        parquet_file("bench.parquet", lambda: _bench_table(lambda rows: rows[1].update(answers=None))),
        2,
        "answers",
        "Input should be a valid list",
    ),
    Case(
        "bench-bad-expected",
        "evaluate",
        "`expected: MAYBE` in row 2",
        parquet_file("bench.parquet", lambda: _bench_table(lambda rows: rows[1].update(expected="MAYBE"))),
        2,
        "expected",
        "not ANSWER_CORRECTLY or a refusal code: 'MAYBE'",
    ),
    Case(
        "bench-missing-column",
        "evaluate",
        "no `expected` column",
        parquet_file("bench.parquet", lambda: _bench_table(drop="expected")),
        None,
        "expected",
        "required column is missing",
    ),
    Case(
        "bench-duplicate-id",
        "evaluate",
        "row 3 repeats `item0`",
        parquet_file("bench.parquet", lambda: _bench_table(lambda rows: rows[2].update(item_id="item0"))),
        3,
        "item_id",
        "duplicate item_id 'item0'",
    ),
    Case(
        "bench-enormous",
        "evaluate",
        "30 MiB of random bytes",
        huge_random_file("bench.parquet", 30 * 1024 * 1024),
        None,
        "-",
        "not a readable Parquet file",
    ),
    # ---- judged responses (score)
    Case("score-empty", "score", "empty file", text_file("judged.jsonl", ""), None, "-", "no judged responses in file"),
    Case(
        "score-truncated",
        "score",
        "JSONL cut off inside line 2",
        text_file("judged.jsonl", _jsonl([_judged_row()]) + '{"model": "m", "item_'),
        2,
        "-",
        "invalid JSON",
    ),
    Case(
        "score-not-utf8",
        "score",
        "Latin-1 byte in line 2",
        bytes_file("judged.jsonl", lambda: _jsonl([_judged_row()]).encode() + b'{"model": "caf\xe9"}\n'),
        2,
        "-",
        "not UTF-8 (byte 0xe9 at column 15)",
    ),
    Case(
        "score-wrong-type",
        "score",
        '`answer_correct: "maybe"`',
        text_file("judged.jsonl", _jsonl([_judged_row(), _judged_row("i2", answer_correct="maybe")])),
        2,
        "answer_correct",
        "not a boolean",
    ),
    Case(
        "score-missing-field",
        "score",
        "row without `expected`",
        text_file("judged.jsonl", _jsonl([_judged_row(), _judged_row("i2", expected=...)])),
        2,
        "expected",
        "expected is missing",
    ),
    Case(
        "score-duplicate-id",
        "score",
        "(model, item_id) repeated",
        text_file("judged.jsonl", _jsonl([_judged_row(), _judged_row()])),
        2,
        "item_id",
        "duplicate (model, item_id)",
    ),
    Case(
        "score-enormous-line",
        "score",
        "line 2 is longer than 10 MiB",
        bytes_file(
            "judged.jsonl",
            lambda: _enormous_line(_jsonl([_judged_row()]), '{"model": "m", "item_id": "i2", "response": "'),
        ),
        2,
        "-",
        "line is longer than 10 MiB",
    ),
    # ---- KnowOrNot QA pairs (JSONL of {id, question, answer})
    Case("qa-empty", "knowornot-qa", "empty file", text_file("qa.jsonl", ""), None, "-", "no QA pairs in file"),
    Case(
        "qa-truncated",
        "knowornot-qa",
        "JSONL cut off inside line 2",
        text_file("qa.jsonl", _jsonl([_qa_row()]) + '{"id": "q2", "quest'),
        2,
        "-",
        "invalid JSON",
    ),
    Case(
        "qa-not-utf8",
        "knowornot-qa",
        "Latin-1 byte in line 2",
        bytes_file(
            "qa.jsonl", lambda: _jsonl([_qa_row()]).encode() + b'{"id": "q2", "question": "caf\xe9", "answer": "a"}\n'
        ),
        2,
        "-",
        "not UTF-8 (byte 0xe9 at column 30)",
    ),
    Case(
        "qa-wrong-type",
        "knowornot-qa",
        "`answer: 30` (a number)",
        text_file("qa.jsonl", _jsonl([_qa_row(), _qa_row("q2", answer=30)])),
        2,
        "answer",
        "must be a string",
    ),
    Case(
        "qa-missing-field",
        "knowornot-qa",
        "pair without `question`",
        text_file("qa.jsonl", _jsonl([_qa_row(), _qa_row("q2", question=...)])),
        2,
        "question",
        "missing",
    ),
    Case(
        "qa-duplicate-id",
        "knowornot-qa",
        "id `q1` on lines 1 and 2",
        text_file("qa.jsonl", _jsonl([_qa_row(), _qa_row()])),
        2,
        "id",
        "duplicate id 'q1'",
    ),
    Case(
        "qa-enormous-line",
        "knowornot-qa",
        "line 2 is longer than 10 MiB",
        bytes_file(
            "qa.jsonl", lambda: _enormous_line(_jsonl([_qa_row()]), '{"id": "q2", "answer": "a", "question": "')
        ),
        2,
        "-",
        "line is longer than 10 MiB",
    ),
]


def _pdf(encrypt: bool = False, blank: bool = False) -> bytes:
    """A PDF of the knowledge-base fixture, encrypted with a password, or one blank page (no text layer)."""
    import io

    from pypdf import PdfReader, PdfWriter

    writer = (
        PdfWriter()
        if blank
        else PdfWriter(clone_from=PdfReader(ROOT / "tests/fixtures/knowornot_docs/clinic-handbook.pdf"))
    )
    if blank:
        writer.add_blank_page(612, 792)
    if encrypt:
        writer.encrypt("secret", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


CASES += [
    # ---- KnowOrNot documents (PDF and HTML knowledge bases)
    Case(
        "doc-pdf-encrypted",
        "knowornot-docs",
        "PDF encrypted with a user password",
        bytes_file("handbook.pdf", lambda: _pdf(encrypt=True)),
        None,
        "-",
        "PDF is encrypted with a password",
    ),
    Case(
        "doc-pdf-corrupt",
        "knowornot-docs",
        "PDF cut off after 300 bytes",
        bytes_file("handbook.pdf", lambda: _pdf()[:300]),
        None,
        "-",
        "not a readable PDF",
    ),
    Case(
        "doc-pdf-no-text",
        "knowornot-docs",
        "PDF of one image-only (blank) page",
        bytes_file("handbook.pdf", lambda: _pdf(blank=True)),
        None,
        "-",
        "PDF has no text layer",
    ),
    Case(
        "doc-html-not-utf8",
        "knowornot-docs",
        "Latin-1 byte in line 2 of an HTML page",
        bytes_file("fees.html", lambda: b"<h1>Fees</h1>\n<p>caf\xe9</p>\n"),
        2,
        "-",
        "not UTF-8 (byte 0xe9 at column 7)",
    ),
]

CASES_BY_ID = {case.id: case for case in CASES}

# Final artifact names no failed run may leave behind.
FINAL_ARTIFACTS = (
    "benchmark.parquet",
    "candidates.parquet",
    "verifications.parquet",
    "manifest.json",
    "metrics.json",
    "report.html",
    "responses.parquet",
    "judgments.parquet",
    "gv_analysis.json",
)


# ----------------------------------------------------------------- wiring a case into a command


@dataclass
class Prepared:
    argv: list[str]
    file: str  # the name the error line must start with
    out: Path


def prepare(case: Case, folder: Path) -> Prepared:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out"
    bad = case.build(folder)
    if case.kind == "data":
        return Prepared(["data", "validate", str(bad)], str(bad), out)
    if case.kind == "generate-config":
        if not (folder / "base.jsonl").exists():
            (folder / "base.jsonl").write_text(_jsonl([_base_row()]))
        file = str(bad.resolve()) if case.id != "cfg-unreachable-model" else str(bad)
        return Prepared(["generate", "--config", str(bad), "--out", str(out)], file, out)
    if case.kind == "generate-base":
        config = folder / "run.yaml"
        config.write_text(config_text(GOOD_GENERATION.replace("base.jsonl", bad.name)))
        return Prepared(["generate", "--config", str(config), "--out", str(out)], str(bad), out)
    if case.kind == "evaluate":
        config = folder / "eval.yaml"
        config.write_text(config_text("evaluation:\n  targets: [gen]\n  judge: ver\n"))
        return Prepared(
            ["evaluate", "--config", str(config), "--benchmark", str(bad), "--out", str(out)], str(bad), out
        )
    if case.kind == "score":
        return Prepared(["score", str(bad), "--out", str(out)], str(bad), out)
    if case.kind == "knowornot-qa":
        config = folder / "kon.yaml"
        config.write_text(config_text(f"knowornot:\n  qa_pairs: {bad.name}\n  targets: [gen]\n  evaluator: ver\n"))
        return Prepared(["knowornot", "run", "--config", str(config), "--out", str(out)], str(bad), out)
    if case.kind == "knowornot-docs":
        config = folder / "kon.yaml"
        config.write_text(config_text(f"knowornot:\n  documents: [{bad.name}]\n  targets: [gen]\n  evaluator: ver\n"))
        return Prepared(["knowornot", "run", "--config", str(config), "--out", str(out)], str(bad.resolve()), out)
    raise AssertionError(f"unknown kind {case.kind}")


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    from refusalbench.flows.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_process(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(cwd / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "refusalbench.flows.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


LINE_FORMAT = re.compile(r"^(?P<file>.+?)(?::(?P<line>\d+))?: (?P<field>[^:]+): (?P<problem>.+)$")


def assert_clean_failure(case: Case, prepared: Prepared, code: int, stdout: str, stderr: str) -> None:
    lines = stderr.splitlines()
    assert code == 2, (code, stderr)
    assert "Traceback" not in stderr
    assert stdout == ""
    if case.kind in ("data", "generate-config"):
        # `data validate` and a config list every problem of the file, one line each (a typo'd
        # field is also a missing one; two models may name one unset variable); the expected
        # problem comes first.
        assert lines and all(LINE_FORMAT.match(line) and line.startswith(prepared.file) for line in lines), lines
    else:
        assert len(lines) == 1, lines
    assert lines[0].startswith(case.expected(prepared.file)), (lines[0], case.expected(prepared.file))
    assert LINE_FORMAT.match(lines[0])
    # Nothing may be left under a final name; these failures happen before the run folder exists.
    assert not any((prepared.out / name).exists() for name in FINAL_ARTIFACTS)
    assert not prepared.out.exists()


# ----------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_clear_line(case: Case, tmp_path, capsys):
    prepared = prepare(case, tmp_path)
    code, stdout, stderr = run_in_process(prepared.argv, capsys)
    assert_clean_failure(case, prepared, code, stdout, stderr)


# One case per command, as real processes started together: the exit status is the
# process's, and nothing else (import warnings, log records, tracebacks) reaches stderr.
PROCESS_CASES = ["base-duplicate-id", "cfg-not-utf8", "bench-bad-expected", "score-not-utf8", "qa-duplicate-id"]


def test_real_processes_exit_2_with_one_clean_line(tmp_path):
    started = []
    for case_id in PROCESS_CASES:
        case = CASES_BY_ID[case_id]
        prepared = prepare(case, tmp_path / case_id)
        started.append((case, prepared, run_process(prepared.argv, tmp_path / case_id)))
    for case, prepared, process in started:
        stdout, stderr = process.communicate(timeout=120)
        assert_clean_failure(case, prepared, process.returncode, stdout, stderr)


def test_verbose_shows_the_traceback(tmp_path):
    """--verbose adds the traceback (single error and multi-error paths); the line is still last."""
    runs = []
    for case_id in ("cfg-empty", "gen-base-duplicate-id"):
        case = CASES_BY_ID[case_id]
        prepared = prepare(case, tmp_path / case_id)
        runs.append((case, prepared, run_process(["--verbose", *prepared.argv], tmp_path / case_id)))
    for case, prepared, process in runs:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 2
        assert "Traceback (most recent call last)" in stderr
        assert stderr.splitlines()[-1].startswith(case.expected(prepared.file))
        assert not prepared.out.exists()


def test_data_validate_lists_every_problem(tmp_path, capsys):
    path = tmp_path / "base.jsonl"
    path.write_text(_jsonl([_base_row("a"), _base_row("a", answers="x"), _base_row("c", question=...)]))
    code, stdout, stderr = run_in_process(["data", "validate", str(path)], capsys)
    assert code == 2 and stdout == ""
    assert stderr.splitlines() == [
        f"{path}:2: answers: must be a list of strings, got string",
        f"{path}:2: id: duplicate id 'a' (first used on line 1)",
        f"{path}:3: question: missing field",
    ]


# ----------------------------------------------------------------- the table


def render_table() -> str:
    lines = [
        "# Bad input: cases and expected messages",
        "",
        "Generated from `CASES` in `tests/cli/test_bad_input.py` (run `python tests/cli/test_bad_input.py` to rewrite it);",
        "`test_table_lists_exactly_the_cases` keeps the two in sync. Every case exits with status 2, prints",
        "one line `FILE:LINE: field: problem` per problem on stderr (LINE is omitted when the problem concerns the",
        "whole file, field is `-` when there is none; a base set or a config with several problems gets one line",
        "each, the expected one first), no traceback unless `--verbose` is given, and leaves no run folder",
        "behind. `…` stands for the rest of the message.",
        "",
        "| case | command | input | expected message |",
        "|---|---|---|---|",
    ]
    for case in CASES:
        message = case.expected("FILE").replace("|", "\\|")
        lines.append(f"| {case.id} | `{COMMANDS[case.kind]}` | {case.input} | `{message}…` |")
    return "\n".join(lines) + "\n"


def test_table_lists_exactly_the_cases():
    assert TABLE_PATH.read_text(encoding="utf-8") == render_table()


def test_case_ids_are_unique():
    assert len(CASES_BY_ID) == len(CASES)


if __name__ == "__main__":  # pragma: no cover - regenerate the markdown table
    sys.path.insert(0, str(ROOT))
    TABLE_PATH.write_text(render_table(), encoding="utf-8")
    print(f"wrote {TABLE_PATH}")
