"""A run folder's ``schema_version`` is checked when the folder is read.

An older contract is read (its manifest migrated to this one's shape); a newer one is
refused with one line naming its manifest, exit 2, by every command that reads a folder.
"""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest
from pydantic import ValidationError

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.runfolder import RunManifest
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.benchmark_file import read_benchmark
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

# A manifest as the code before the versioned contract wrote it: no schema_version.
UNVERSIONED_MANIFEST = {
    "run_id": "old",
    "kind": "generate",
    "created_at": "2026-01-01T00:00:00+00:00",
    "finished_at": None,
    "package_version": "0.1.0",
    "config_hash": "h",
    "config": {},
    "catalogue_hash": None,
    "prompt_hashes": {},
    "seed": 0,
    "timings_s": {"generate": 1.5},
    "counts": {"benchmark": 1},
    "calls": {},
    "notes": [],
    "artifacts": ["benchmark.parquet"],
    "status": "completed",
}
NEWER = ("1.6", "2.0", "99.0")


def _item() -> BenchmarkItem:
    return BenchmarkItem(
        item_id="i",
        base_id="b",
        variant="single",
        perturbation_class="P-Ambiguity",
        intensity="LOW",
        lever_id="x",
        generator="g",
        question="q?",
        context="c",
        original_question="oq",
        original_context="oc",
        answers=["a"],
        expected="ANSWER_CORRECTLY",
    )


def _folder(path, version: str | None) -> ArtifactStore:
    """A run folder with a benchmark, written by a refusalbench of contract ``version`` (None: unversioned)."""
    store = ArtifactStore(path)
    store.save(rb_files.BENCHMARK, [_item()])
    manifest = dict(UNVERSIONED_MANIFEST)
    if version is not None:
        manifest["schema_version"] = version
    store.write_json(runfolder.MANIFEST.name, manifest)
    return store


def _refusal(store: ArtifactStore, version: str) -> str:
    return (
        f"{store.uri(runfolder.MANIFEST.name)}: schema_version: {version} is newer than this refusalbench "
        f"reads ({runfolder.SCHEMA_VERSION}); upgrade refusalbench"
    )


# ---------------------------------------------------------------- older: read, migrated


def test_an_unversioned_manifest_is_read_as_contract_1_0(tmp_path):
    store = _folder(tmp_path, None)
    manifest = store.load(runfolder.MANIFEST)
    assert manifest.schema_version == runfolder.UNVERSIONED == "1.0"
    assert manifest.run_id == "old" and manifest.timings_s == {"generate": 1.5} and manifest.status == "completed"
    assert store.load(rb_files.BENCHMARK) == [_item()]
    assert RunManifest.model_validate({**UNVERSIONED_MANIFEST, "schema_version": ""}).schema_version == "1.0"


@pytest.mark.parametrize("version", [version for version, _ in runfolder.SCHEMA_HISTORY])
def test_a_manifest_of_a_known_contract_is_read_as_written(tmp_path, version):
    store = _folder(tmp_path, version)
    assert store.load(runfolder.MANIFEST).schema_version == version
    assert store.load(rb_files.BENCHMARK) == [_item()]
    assert read_benchmark(store.uri(rb_files.BENCHMARK.name)) == [_item()]


def test_a_new_manifest_carries_this_contract(tmp_path):
    from refusalbench.tasks.core.provenance import ManifestRecorder

    store = ArtifactStore(tmp_path)
    ManifestRecorder(store, "generate").save()
    assert json.loads((tmp_path / "manifest.json").read_text())["schema_version"] == runfolder.SCHEMA_VERSION
    assert store.load(runfolder.MANIFEST).schema_version == runfolder.SCHEMA_VERSION


# ---------------------------------------------------------------- newer: refused


@pytest.mark.parametrize("version", NEWER)
def test_a_folder_of_a_newer_contract_is_refused_before_any_file_is_read(tmp_path, version):
    store = _folder(tmp_path, version)
    for artifact in (rb_files.BENCHMARK, runfolder.MANIFEST):
        with pytest.raises(InputError) as refused:
            ArtifactStore(tmp_path).load(artifact)
        assert str(refused.value) == _refusal(store, version)
    with pytest.raises(InputError) as refused:
        read_benchmark(store.uri(rb_files.BENCHMARK.name))
    assert str(refused.value) == _refusal(store, version)


@pytest.mark.parametrize("version", NEWER)
def test_a_manifest_of_a_newer_contract_is_not_a_run_manifest(tmp_path, version):
    with pytest.raises(ValidationError, match="is newer than this refusalbench reads"):
        RunManifest.model_validate({**UNVERSIONED_MANIFEST, "schema_version": version})
    # Read from a file (a kept generation manifest, say), the refusal names that file.
    store = ArtifactStore(tmp_path)
    store.write_json(rb_files.GENERATION_MANIFEST.name, {**UNVERSIONED_MANIFEST, "schema_version": version})
    with pytest.raises(InputError, match=f"generation_manifest.json: schema_version: {version} is newer"):
        store.load(rb_files.GENERATION_MANIFEST)


def test_a_schema_version_that_is_no_version_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="is not MAJOR.MINOR"):
        RunManifest.model_validate({**UNVERSIONED_MANIFEST, "schema_version": "one"})
    store = _folder(tmp_path, "1.2.3")
    with pytest.raises(InputError, match="schema_version: '1.2.3' is not MAJOR.MINOR"):
        store.load(rb_files.BENCHMARK)


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from refusalbench.flows.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def test_this_version_is_the_last_of_the_history_and_each_version_says_what_changed():
    versions = [version for version, _ in runfolder.SCHEMA_HISTORY]
    assert runfolder.SCHEMA_VERSION == versions[-1] == "1.5"
    assert versions == sorted(versions, key=lambda v: tuple(int(p) for p in v.split(".")))
    assert all(runfolder.schema_version_problem(v) is None for v in versions)
    assert all(len(change) > 20 for _, change in runfolder.SCHEMA_HISTORY)
    from refusalbench.tasks.pipeline.runfolder_doc import runfolder_markdown

    page = runfolder_markdown()
    assert "### Schema versions" in page and all(f"| {v} | " in page for v in versions)


def test_report_refuses_a_folder_edited_to_a_newer_version_naming_both(tmp_path, capsys):
    """A folder as ``evaluate`` writes it (manifest of this version), its schema_version edited to 99.0."""
    from refusalbench.tasks.core.provenance import ManifestRecorder

    store = ArtifactStore(tmp_path / "run")
    store.save(rb_files.JUDGED, pd.DataFrame({"model": ["m"], "item_id": ["i"]}))
    ManifestRecorder(store, "evaluate").save()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest["schema_version"] = "99.0"
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    code, stderr = _cli(["report", str(tmp_path / "run")], capsys)
    assert code == 2 and stderr.count("\n") == 1
    assert "99.0" in stderr and f"({runfolder.SCHEMA_VERSION})" in stderr and "manifest.json" in stderr
    assert not (tmp_path / "run" / "report.html").exists()


def test_every_command_that_reads_a_run_folder_refuses_a_newer_one(tmp_path, capsys):
    store = _folder(tmp_path / "run", "99.0")
    run = str(tmp_path / "run")
    store.save(rb_files.JUDGED, pd.DataFrame({"model": ["m"], "item_id": ["i"]}))
    store.save(kon_files.LABEL_SAMPLE, pd.DataFrame({"experiment_id": ["e"]}))
    commands = [
        ["report", run],
        ["score", str(tmp_path / "run" / "judged.parquet"), "--out", str(tmp_path / "scores")],
        ["export", run, "--format", "hf", "--out", str(tmp_path / "hf")],
        ["audit", "sample", run],
        ["knowornot", "label", run, "--annotator", "ann"],
        ["knowornot", "agreement", run],
    ]
    for argv in commands:
        code, stderr = _cli(argv, capsys)
        assert (code, stderr) == (2, _refusal(store, "99.0") + "\n"), argv
    assert not (tmp_path / "hf").exists() and not store.exists(rb_files.AUDIT_SAMPLE.name)
    assert not (tmp_path / "scores").exists()
    # Scores written into a folder a newer refusalbench wrote: refused too, before anything is written.
    judged = tmp_path / "judged.parquet"
    pd.DataFrame(
        {
            "model": ["m"],
            "item_id": ["i"],
            "expected": ["ANSWER_CORRECTLY"],
            "decision": ["ANSWER"],
            "answer_correct": [True],
        }
    ).to_parquet(judged)
    code, stderr = _cli(["score", str(judged), "--out", run], capsys)
    assert (code, stderr) == (2, _refusal(store, "99.0") + "\n")
    assert not store.exists(rb_files.METRICS.name)
    # The viewer opens no such folder.
    from refusalbench.tasks.viewer.folders import open_folder

    with pytest.raises(InputError) as refused:
        open_folder(run)
    assert str(refused.value) == _refusal(store, "99.0")


def test_a_run_manifest_roundtrips_with_its_version():
    manifest = RunManifest(
        schema_version="1.1",
        run_id="r",
        kind="evaluate",
        package_version="0",
        config_hash="h",
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    assert RunManifest.model_validate_json(manifest.model_dump_json()) == manifest
