"""Artifact store: Parquet round trips on a local folder and on an S3 endpoint (moto)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Passage


def _items(n: int) -> list[BenchmarkItem]:
    return [
        BenchmarkItem(
            item_id=f"i{i}",
            base_id=f"b{i}",
            variant="multi" if i % 2 else "single",
            perturbation_class="P-Ambiguity",
            intensity="LOW",
            lever_id="l",
            generator="g",
            question=f"q{i}?",
            context=None if i % 2 else "ctx",
            passages=[Passage(text="p", relevant=True)] if i % 2 else None,
            original_question="oq",
            answers=["a", "b"],
            expected="ANSWER_CORRECTLY",
            domain=None,
        )
        for i in range(n)
    ]


def _roundtrip(store: ArtifactStore) -> None:
    items = _items(25)
    uri = store.write_records("benchmark.parquet", items, BenchmarkItem)
    assert uri.endswith("benchmark.parquet")
    assert store.read_records("benchmark.parquet", BenchmarkItem) == items
    batches = list(store.iter_batches("benchmark.parquet", batch_size=10))
    assert [b.num_rows for b in batches] == [10, 10, 5]
    store.write_json("metrics.json", {"a": float("nan"), "b": 1.5, "nested": [float("inf")]})
    assert store.read_json("metrics.json") == {"a": None, "b": 1.5, "nested": [None]}
    assert store.child("round-1").write_text("note.txt", "hi").endswith("note.txt")
    assert "round-1/note.txt" in store.list()


def test_local_folder_roundtrip(tmp_path):
    store = ArtifactStore(tmp_path / "run")
    _roundtrip(store)
    # no temporary files are left beside the artifacts
    assert not [p for p in (tmp_path / "run").rglob("*.tmp")]


def test_file_uri_roundtrip(tmp_path):
    _roundtrip(ArtifactStore(f"file://{tmp_path}/run"))


def test_failed_write_leaves_no_file_under_its_final_name(tmp_path):
    store = ArtifactStore(tmp_path)
    table = pa.table({"x": [1, 2, 3]})

    class Boom(Exception):
        pass

    def batches_then_crash():
        yield table.to_batches()[0]
        raise Boom()

    with pytest.raises(Boom):
        store.write_batches("half.parquet", table.schema, batches_then_crash())
    assert not (tmp_path / "half.parquet").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_ENDPOINT_URL=endpoint,
        AWS_DEFAULT_REGION="us-east-1",
    )
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_s3_roundtrip(s3_endpoint):
    store = ArtifactStore("s3://bench/runs/r1")
    assert not store.is_local
    _roundtrip(store)
    assert store.uri("benchmark.parquet") == "s3://bench/runs/r1/benchmark.parquet"
    assert store.exists("benchmark.parquet")


def test_the_store_has_s3_credentials_of_its_own(s3_endpoint, monkeypatch):
    """REFUSALBENCH_S3_* reach every s3fs filesystem of the process (Prefect's result storage
    included) without being among the options Prefect saves with its block; AWS_* stay Bedrock's."""
    from prefect.filesystems import RemoteFileSystem

    from refusalbench.tasks.core.store import storage_options

    monkeypatch.setenv("REFUSALBENCH_S3_ACCESS_KEY_ID", "store-key")
    monkeypatch.setenv("REFUSALBENCH_S3_SECRET_ACCESS_KEY", "store-secret")
    monkeypatch.setenv("REFUSALBENCH_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("REFUSALBENCH_S3_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "bedrock-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "bedrock-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    store = ArtifactStore("s3://bench/own-credentials")
    _roundtrip(store)
    assert (store.fs.key, store.fs.secret) == ("store-key", "store-secret")
    options = storage_options("s3://bench/own-credentials")
    assert options == {
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
        "endpoint_url": s3_endpoint,
    }
    block = RemoteFileSystem(basepath="s3://bench/own-credentials/_prefect", settings=options)
    assert block.filesystem.key == "store-key" and "store-secret" not in block.model_dump_json()

    # Unset, the store reads the AWS chain as it always did.
    for name in (
        "REFUSALBENCH_S3_ACCESS_KEY_ID",
        "REFUSALBENCH_S3_SECRET_ACCESS_KEY",
        "REFUSALBENCH_S3_ENDPOINT_URL",
        "REFUSALBENCH_S3_REGION",
    ):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    store = ArtifactStore("s3://bench/aws-chain")
    assert store.fs.key is None and store.fs.endpoint_url == s3_endpoint
    _roundtrip(store)


def test_folders_and_a_signed_link_a_browser_opens(s3_endpoint, tmp_path):
    """A refresh root's round folders in one listing; on S3 the report is a signed HTTP link served as HTML."""
    import urllib.request

    from refusalbench.tasks.pipeline.refusalbench.refresh_step import REPORT_LINK_EXPIRY_S, report_link

    root = ArtifactStore("s3://bench/rounds")
    root.child("round-1").write_text("report.html", "<html><body>round one</body></html>")
    root.child("round-2").write_json("metrics.json", {})
    root.write_text("notes.txt", "not a folder")
    assert root.folders() == ["round-1", "round-2"]
    link, words = report_link(root.child("round-1"))
    assert link.startswith(f"{s3_endpoint}/bench/rounds/round-1/report.html?") and "Signature" in link
    assert REPORT_LINK_EXPIRY_S == 7 * 86400 and "signed link, valid 7 days" in words
    with urllib.request.urlopen(link, timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/html")  # opens in the browser, not a download
        assert b"round one" in reply.read()
    local = ArtifactStore(tmp_path)
    local.child("round-a").write_text("report.html", "x")
    assert local.folders() == ["round-a"] and local.presigned_url("round-a/report.html", 60) is None
    assert report_link(local.child("round-a")) == (str(tmp_path / "round-a" / "report.html"), "report.html")
