"""``refusalbench export RUN --format hf --out DIR`` (issue 18 part 1).

One real generation run on the scripted server (the generation-flow test's setting: three
base items, one of them multi-document, two strata, two generators, two verifiers, one
verifier failing some candidates) is exported; the export is then read the way the
``datasets`` library reads it (the card's YAML ``configs`` -> ``data_files`` globs ->
Parquet) and compared with ``benchmark.parquet``, the card's figures with the run's own
files, and, when ``datasets`` is installed, loaded with ``datasets.load_dataset`` offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.scripted import by_model, generator_reply, intensity_of, verifier_reply

ROOT = Path(__file__).resolve().parents[2]

BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
        "domain": "history",
    },
    {
        "id": "s2",
        "question": "Who founded the firm?",
        "answers": ["Ada Lee"],
        "context": "Ada Lee founded the firm.",
        "domain": "business",
    },
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "domain": "health",
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
]


def _scripted(server) -> None:
    def ver_b(request):  # fails gen-a's HIGH candidates: a pass-rate matrix that is not all ones
        text = json.dumps(request["messages"])
        return verifier_reply("FAIL" if intensity_of(request) == "HIGH" and " question a?" in text else "PASS")

    server.responder = by_model(
        {
            "gen-a": lambda request: generator_reply(request, "a"),
            "gen-b": lambda request: generator_reply(request, "b"),
            "ver-a": lambda request: verifier_reply("PASS"),
            "ver-b": ver_b,
        }
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory, prefect_harness) -> Path:
    """A generation run folder (benchmark.parquet, gv_analysis.json, manifest.json, ...)."""
    from refusalbench.flows.launch import run_generation
    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

    folder = tmp_path_factory.mktemp("export-run")
    (folder / "base.jsonl").write_text("".join(json.dumps(row) + "\n" for row in BASE))
    with ScriptedLLMServer() as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("REFUSALBENCH_CACHE_DIR", str(folder / "cache"))
        _scripted(server)
        models = "".join(
            f"  {name}: {{model: openai/{name}, api_base: '{server.url}', max_attempts: 2}}\n"
            for name in ("gen-a", "gen-b", "ver-a", "ver-b")
        )
        config = folder / "run.yaml"
        config.write_text(
            f"models:\n{models}cache:\n  path: {json.dumps(str(folder / 'calls.sqlite'))}\n"
            "generation:\n  base_set: base.jsonl\n  generators: [gen-a, gen-b]\n"
            "  verifiers: [ver-a, ver-b]\n  seed: 7\n  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]\n"
        )
        run_generation(str(config), str(folder / "run"))
    return folder / "run"


@pytest.fixture
def run_dir(generated, tmp_path) -> Path:
    """A private copy of the run folder (a test may add an audit to it)."""
    return Path(shutil.copytree(generated, tmp_path / "run", ignore=shutil.ignore_patterns("_work", "_prefect")))


# ---------------------------------------------------------------- reading an export as `datasets` does


def card_parts(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def load_config(folder: Path, name: str | None = None) -> dict[str, pa.Table]:
    """split -> rows of one config, by the card's ``configs:`` (``data_files`` globs, as ``datasets`` resolves them)."""
    meta, _ = card_parts(folder)
    configs = {c["config_name"]: c for c in meta["configs"]}
    config = configs[name] if name else next(c for c in meta["configs"] if c.get("default"))
    splits = {}
    for entry in config["data_files"]:
        files = sorted(folder.glob(entry["path"]))
        assert files, entry
        splits[entry["split"]] = pa.concat_tables([pq.read_table(f) for f in files])
    return splits


def by_id(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: row["item_id"])


def table_after(body: str, heading: str) -> list[list[str]]:
    """The first Markdown table after ``heading``: header row, then body rows (cells stripped)."""
    lines = body.splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return [rows[0], *rows[2:]]  # without the |---| separator


def as_counts(table: list[list[str]]) -> dict[tuple[str, str], int]:
    """A crosstab from the card (total row and column left out) as {(row, column): n}, zeros dropped."""
    header, *rows = table
    return {
        (row[0], column): int(value)
        for row in rows
        if row[0] != "total"
        for column, value in zip(header[1:], row[1:])
        if column != "total" and int(value)
    }


def export(run_dir: Path, out: Path, *extra: str, capsys=None) -> tuple[int, str, str]:
    from refusalbench.flows.cli import main

    try:
        main(["export", str(run_dir), "--format", "hf", "--out", str(out), *extra])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr() if capsys else None
    return code, captured.out if captured else "", captured.err if captured else ""


# ---------------------------------------------------------------- tests


def test_export_reads_back_as_the_benchmark(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    code, stdout, stderr = export(run_dir, out, capsys=capsys)
    assert code == 0, stderr
    bench = pq.read_table(run_dir / "benchmark.parquet")
    assert f"exported {bench.num_rows} items" in stdout
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "README.md",
        "data/multi/test-00000-of-00001.parquet",
        "data/single/test-00000-of-00001.parquet",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left

    meta, _ = card_parts(out)
    assert [c["config_name"] for c in meta["configs"]] == ["default", "single", "multi"]
    assert meta["license"] == "FILL-IN" and meta["language"] == ["en"]
    assert meta["size_categories"] == ["n<1K"] and meta["task_categories"] == ["question-answering"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["run_id"] in meta["pretty_name"]

    (test,) = load_config(out).values()
    assert test.num_rows == bench.num_rows == 9  # 3 items x 2 strata x 2 generators, less gen-a's HIGH ones
    assert test.schema.remove_metadata() == bench.schema.remove_metadata()  # nested passages included
    assert by_id(test) == by_id(bench)
    rows = by_id(bench)
    for variant in ("single", "multi"):
        (part,) = load_config(out, variant).values()
        assert part.schema.remove_metadata() == bench.schema.remove_metadata()
        assert by_id(part) == [r for r in rows if r["variant"] == variant]
    multi = next(r for r in by_id(test) if r["variant"] == "multi")
    assert multi["passages"] == [
        {"text": "Edited passage one.", "relevant": True},
        {"text": "Noise passage.", "relevant": False},
    ]
    assert multi["original_passages"][0] == {"text": "The dose is 5 mg.", "relevant": True}


def test_card_figures_are_the_runs(run_dir, tmp_path):
    from refusalbench.tasks.refusalbench.export.hf_dataset import export_run

    export_run(str(run_dir), tmp_path / "hf")
    meta, body = card_parts(tmp_path / "hf")
    frame = pq.read_table(run_dir / "benchmark.parquet").to_pandas()
    gv = json.loads((run_dir / "gv_analysis.json").read_text())
    manifest = json.loads((run_dir / "manifest.json").read_text())

    composition = table_after(body, "### Class × intensity")
    assert as_counts(composition) == dict(Counter(zip(frame.perturbation_class, frame.intensity)))
    assert composition[-1][-1] == str(len(frame))
    assert as_counts(table_after(body, "### Generator × class")) == dict(
        Counter(zip(frame.generator, frame.perturbation_class))
    )
    expected = {row[0]: int(row[1]) for row in table_after(body, "### Expected behaviour")[1:]}
    assert expected == dict(Counter(frame.expected))

    funnel = {row[0]: int(row[1]) for row in table_after(body, "### Funnel")[1:]}
    assert funnel == gv["funnel"] and funnel["sampled"] == len(frame)
    header, *rows = table_after(body, "### Pass rate: generator × verifier")
    for row in rows:
        for verifier, value in zip(header[1:], row[1:]):
            shown, n = value.split(" (n=")
            assert float(shown) == pytest.approx(gv["pass_rate_matrix"][row[0]][verifier], abs=5e-4)
            assert int(n.rstrip(")")) == gv["judged_counts"][row[0]][verifier]
    assert "0.500" in json.dumps(rows)  # ver-b failed half of gen-a's candidates

    # How it was made: the run's numbers and settings, not literals.
    methods = body.split("## How it was made", 1)[1].split("\n## ", 1)[0]
    for fact in (
        f"seed {manifest['seed']}",
        f"{gv['funnel']['attempted']} attempts",
        "unanimous filter",
        f"{gv['funnel']['accepted']} accepted",
        f"{manifest['counts']['assignments']} assignments",
        f"{sum(gv['verdict_counts'].values())} verifications",
        "gen-a = `openai/gen-a`",
        "`base.jsonl`",
    ):
        assert fact in methods, fact
    # Provenance: catalogue and template hashes of the manifest; nothing of the endpoints.
    assert manifest["catalogue_hash"] in body and "176 levers" in body
    for name in ("generator_single.j2", "verifier_multi.j2", "target_single.j2"):
        assert f"| {name} | `{manifest['prompt_hashes'][name]}` | same |" in body
    levers = {row[0]: int(row[-1]) for row in table_after(body, "<details><summary>Levers used</summary>")[1:]}
    assert levers == dict(Counter(frame.lever_id))
    assert "api_base" not in body and "127.0.0.1" not in body and str(run_dir.parent) not in body
    assert "No human audit in this run folder" in body
    assert "Replace `license: FILL-IN` in the YAML header" in body


def test_card_carries_the_audit_when_there_is_one(run_dir, tmp_path):
    import datetime as dt

    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.audit.human_audit import AuditLabelStore, sample_run, write_audit
    from refusalbench.tasks.refusalbench.export.hf_dataset import export_run
    from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
    from refusalbench.tasks.refusalbench.schema.json_files import AuditLabel

    sample_run(str(run_dir), per_stratum=3, seed=1)
    sample = ArtifactStore(run_dir).load(rb_files.AUDIT_SAMPLE)
    labels = AuditLabelStore(run_dir / rb_files.AUDIT_LABELS.name)
    when = dt.datetime.now(dt.UTC)
    for annotator, fail_every in (("ann", 2), ("bob", 3)):
        for index, item in enumerate(sample):
            verdict = "FAIL" if index % fail_every == 0 else "PASS"
            labels.append(AuditLabel(item_id=item.item_id, annotator=annotator, label=verdict, labelled_at=when))
    write_audit(str(run_dir))
    audit = json.loads((run_dir / "audit.json").read_text())

    export_run(str(run_dir), tmp_path / "hf")
    _, body = card_parts(tmp_path / "hf")
    shown = {(row[0], row[1]): (int(row[2]), int(row[3]), row[4]) for row in table_after(body, "## Human audit")[1:]}
    wanted = {("class", r["value"]): (r["n"], r["passed"], f"{r['pass_rate']:.3f}") for r in audit["by_class"]}
    wanted |= {("intensity", r["value"]): (r["n"], r["passed"], f"{r['pass_rate']:.3f}") for r in audit["by_intensity"]}
    wanted[("all", "all")] = (audit["overall"]["n"], audit["overall"]["passed"], f"{audit['overall']['pass_rate']:.3f}")
    assert shown == wanted
    assert f"A stratified sample of {audit['sample_size']} items" in body
    assert f"Cohen's kappa between annotators {audit['annotator_agreement']['kappa']:.3f}" in body


def test_card_of_an_evaluated_folder_and_of_a_bare_benchmark(run_dir, tmp_path):
    from refusalbench.tasks.refusalbench.export.hf_dataset import export_run

    # After `run`, manifest.json is the evaluation's; the generation's is generation_manifest.json.
    generation = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "generation_manifest.json").write_text(json.dumps(generation))
    (run_dir / "manifest.json").write_text(json.dumps({**generation, "kind": "evaluate", "run_id": "evaluation-id"}))
    export_run(str(run_dir), tmp_path / "evaluated")
    meta, body = card_parts(tmp_path / "evaluated")
    assert generation["run_id"] in meta["pretty_name"] and "evaluation-id" not in body
    assert "| manifest | generation_manifest.json |" in body and "| evaluated | yes" in body

    # A folder with nothing but a benchmark: exported; the card says what it cannot know.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run_dir / "benchmark.parquet", bare)
    export_run(str(bare), tmp_path / "bare-hf")
    (rows,) = load_config(tmp_path / "bare-hf").values()
    assert by_id(rows) == by_id(pq.read_table(bare / "benchmark.parquet"))
    _, body = card_parts(tmp_path / "bare-hf")
    assert "holds no generation manifest" in body and "No `gv_analysis.json` in the run folder" in body
    assert "catalogue hash at generation: not recorded" in body


def test_large_variants_are_cut_into_numbered_shards(run_dir, tmp_path):
    from refusalbench.tasks.refusalbench.export.hf_dataset import export_run

    result = export_run(str(run_dir), tmp_path / "hf", max_rows=4)
    assert [f for f in result.files if "single" in f] == [
        "data/single/test-00000-of-00002.parquet",
        "data/single/test-00001-of-00002.parquet",
    ]
    (single,) = load_config(tmp_path / "hf", "single").values()
    (everything,) = load_config(tmp_path / "hf").values()
    assert single.num_rows == 6 and everything.num_rows == 9


def test_datasets_library_loads_the_export_offline(run_dir, tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    from refusalbench.tasks.refusalbench.export.hf_dataset import export_run

    out = tmp_path / "hf"
    export_run(str(run_dir), out)
    bench = by_id(pq.read_table(run_dir / "benchmark.parquet"))
    cache = str(home / "datasets")
    for loaded in (
        datasets.load_dataset("parquet", data_dir=str(out), cache_dir=cache),
        datasets.load_dataset(str(out), cache_dir=cache),
    ):
        assert list(loaded) == ["test"]
        assert sorted(loaded["test"].to_list(), key=lambda r: r["item_id"]) == bench
        passages = loaded["test"].features["passages"]
        assert passages.feature["text"].dtype == "string" and passages.feature["relevant"].dtype == "bool"
    assert datasets.get_dataset_config_names(str(out)) == ["default", "single", "multi"]
    multi = datasets.load_dataset(str(out), "multi", split="test", cache_dir=cache)
    assert multi.to_list() == [r for r in bench if r["variant"] == "multi"]


def test_force_replaces_only_the_card_and_the_data(run_dir, tmp_path, capsys):
    out = tmp_path / "clone"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / ".gitattributes").write_text("*.parquet filter=lfs\n")
    (out / "data" / "old").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), out / "data" / "old" / "test-00000-of-00001.parquet")
    (out / "README.md").write_text("old card\n")

    code, _, stderr = export(run_dir, out, capsys=capsys)
    assert code == 2 and stderr.strip() == (
        f"{out}: --out: the folder is not empty; pass --force to replace its README.md and data/"
    )
    assert (out / "README.md").read_text() == "old card\n"
    code, _, stderr = export(run_dir, out, "--force", capsys=capsys)
    assert code == 0, stderr
    assert (out / ".git" / "HEAD").exists() and (out / ".gitattributes").exists()
    assert not (out / "data" / "old").exists()
    assert sorted(p.name for p in (out / "data").iterdir()) == ["multi", "single"]
    assert card_parts(out)[0]["license"] == "FILL-IN"
    assert sorted(p.name for p in out.iterdir()) == [".git", ".gitattributes", "README.md", "data"]


def test_a_failed_export_leaves_nothing(run_dir, tmp_path, monkeypatch):
    import refusalbench.tasks.refusalbench.export.hf_dataset as export_module

    written = []

    def failing_write(table, where, **kwargs):
        if written:
            raise OSError("disk full")
        written.append(where)
        pq.write_table(table, where, **kwargs)

    monkeypatch.setattr(export_module.pq, "write_table", failing_write)
    with pytest.raises(OSError, match="disk full"):
        export_module.export_run(str(run_dir), tmp_path / "hf")
    assert written and list(tmp_path.iterdir()) == [run_dir]  # neither DIR nor its temporary folder


def test_bad_input_exits_2_with_one_line_and_writes_nothing(run_dir, tmp_path, capsys):
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

    out = tmp_path / "hf"
    missing = tmp_path / "typo"
    empty_folder = tmp_path / "no-benchmark"
    empty_folder.mkdir()
    empty_bench = tmp_path / "empty-bench"
    ArtifactStore(empty_bench).save(rb_files.BENCHMARK, [])
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "base.jsonl").write_text("{}\n")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run_dir, unfinished)
    manifest = json.loads((unfinished / "manifest.json").read_text())
    (unfinished / "manifest.json").write_text(json.dumps({**manifest, "status": "failed"}))
    cases = [
        ([str(missing), "--format", "hf"], f"{missing}: -: no such run folder"),
        (
            [str(unfinished), "--format", "hf"],
            f"{unfinished / 'manifest.json'}: -: the generation run did not complete (status failed)",
        ),
        (
            [str(empty_folder), "--format", "hf"],
            f"{empty_folder / 'benchmark.parquet'}: -: no benchmark.parquet in this run folder",
        ),
        ([str(empty_bench), "--format", "hf"], f"{empty_bench / 'benchmark.parquet'}: -: the benchmark has no items"),
        ([str(run_dir), "--format", "csv"], "csv: --format: unknown export format (known: hf)"),
    ]
    from refusalbench.flows.cli import main

    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(["export", *argv, "--out", str(out)])
        stderr = capsys.readouterr().err
        assert exit_info.value.code == 2 and stderr.count("\n") == 1 and stderr.startswith(message), stderr
        assert not out.exists() and not missing.exists()
    for argv, message in (
        ([str(run_dir), "--out", str(run_dir), "--force"], "is the run folder itself"),
        ([str(run_dir), "--out", str(project), "--force"], "holds files other than Parquet"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["export", *argv])
        stderr = capsys.readouterr().err
        assert exit_info.value.code == 2 and stderr.count("\n") == 1 and message in stderr, stderr
    assert not (run_dir / "README.md").exists() and sorted(p.name for p in project.iterdir()) == ["data"]
    assert [p.name for p in (project / "data").iterdir()] == ["base.jsonl"]

    # A real process: the exit status and a clean stderr.
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "export", str(missing), "--format", "hf", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "" and done.stderr == f"{missing}: -: no such run folder\n"
