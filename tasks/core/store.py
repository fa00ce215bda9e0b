"""The artifact store: one run folder per run, on any fsspec filesystem.

``ArtifactStore("runs/demo")``, ``ArtifactStore("file:///data/runs/demo")`` and
``ArtifactStore("s3://bucket/prefix")`` behave the same. Writes are atomic: a file is
written under a temporary local name and only then moved (local) or uploaded in one PUT
(object storage), so no half-written artifact is ever visible under its final name.
Parquet is written and read in row batches so large tables never need one big buffer.
S3 endpoint and credentials come from the environment: the store's own variables
(``REFUSALBENCH_S3_ENDPOINT_URL``, ``REFUSALBENCH_S3_ACCESS_KEY_ID``, ``REFUSALBENCH_S3_SECRET_ACCESS_KEY``,
``REFUSALBENCH_S3_SESSION_TOKEN``, ``REFUSALBENCH_S3_REGION``), else the standard AWS ones (``AWS_ENDPOINT_URL``, the AWS credential chain).
The store's own are what a cluster sets for its MinIO: the AWS ones also reach LiteLLM's Bedrock
provider, and a MinIO user there makes every Bedrock call fail.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import fsspec.config
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.clocks import timed
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.runfolder import Artifact
from refusalbench.tasks.core.tables import from_table, to_table

ROW_BATCH = 50_000


# The store's S3 settings, each with the variables read in order (the older REFUSALBENCH_S3_ENDPOINT too).
S3_ENDPOINT_ENV = ("REFUSALBENCH_S3_ENDPOINT_URL", "REFUSALBENCH_S3_ENDPOINT", "AWS_ENDPOINT_URL")
S3_REGION_ENV = "REFUSALBENCH_S3_REGION"
S3_KEY_ENV = {
    "key": "REFUSALBENCH_S3_ACCESS_KEY_ID",
    "secret": "REFUSALBENCH_S3_SECRET_ACCESS_KEY",
    "token": "REFUSALBENCH_S3_SESSION_TOKEN",
}
_installed_s3_keys: dict[str, str] = {}


def storage_options(uri: str) -> dict[str, Any]:
    """fsspec options for ``uri``: for S3, the endpoint and region (no secret: Prefect saves these
    with a result-storage block). The store's own keys are installed process-wide (below)."""
    if uri.startswith(("s3://", "s3a://")):
        install_s3_credentials()
        endpoint = next((os.environ[name] for name in S3_ENDPOINT_ENV if os.environ.get(name)), None)
        region = os.environ.get(S3_REGION_ENV)
        client_kwargs = {k: v for k, v in (("endpoint_url", endpoint), ("region_name", region)) if v}
        options: dict[str, Any] = {"client_kwargs": client_kwargs} if client_kwargs else {}
        if endpoint:
            options["endpoint_url"] = endpoint
        return options
    return {}


def install_s3_credentials() -> None:
    """Give every s3fs filesystem of this process the store's own keys (REFUSALBENCH_S3_ACCESS_KEY_ID ...).

    Through fsspec's per-protocol defaults rather than the options: a filesystem Prefect builds from
    a result-storage block it loaded by id gets them too, and they never leave the process (the
    options are saved on the server with the block). Unset, s3fs reads the AWS chain as before.
    """
    wanted = {kwarg: os.environ[name] for kwarg, name in S3_KEY_ENV.items() if os.environ.get(name)}
    if wanted == _installed_s3_keys:
        return
    defaults = fsspec.config.conf.setdefault("s3", {})
    for kwarg in _installed_s3_keys:
        defaults.pop(kwarg, None)
    defaults.update(wanted)
    _installed_s3_keys.clear()
    _installed_s3_keys.update(wanted)


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _nan_to_none(value: Any) -> Any:
    """JSON has no NaN: undefined metrics are written as null (readers map null back to NaN)."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


class ArtifactStore:
    def __init__(self, root: str | Path):
        root = str(root)
        self.root = root.rstrip("/") if root not in ("/",) else root
        self.fs, self.base = fsspec.core.url_to_fs(self.root, **storage_options(self.root))
        self._contract_checked = False  # whether ``load`` has checked the folder's schema_version
        self.is_local = self.fs.protocol in ("file", ("file", "local")) or "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )
        if self.is_local:
            Path(self.base).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ paths

    def path(self, name: str) -> str:
        return f"{self.base.rstrip('/')}/{name}"

    def uri(self, name: str) -> str:
        if self.is_local:
            return str(Path(self.base) / name)
        return f"{self.root}/{name}"

    def child(self, name: str) -> ArtifactStore:
        return ArtifactStore(self.uri(name))

    def exists(self, name: str) -> bool:
        found: bool = self.fs.exists(self.path(name))  # fsspec is untyped
        return found

    def list(self, prefix: str = "") -> list[str]:
        base = self.base.rstrip("/")
        try:
            found = self.fs.find(self.path(prefix) if prefix else base)
        except FileNotFoundError:
            return []
        return sorted(p[len(base) + 1 :] if p.startswith(base) else p for p in found)

    # ``builtins.list``: inside the class, ``list`` names the method above.
    def folders(self) -> builtins.list[str]:
        """The names of the folders directly under this one, sorted (one listing, not a walk)."""
        try:
            entries = self.fs.ls(self.base, detail=True)
        except FileNotFoundError:
            return []
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def presigned_url(self, name: str, expires_s: int, content_type: str | None = None) -> str | None:
        """An HTTP(S) URL that opens ``name`` in a browser for ``expires_s`` seconds, signed with this
        store's credentials; None for a local folder or a filesystem that cannot sign URLs."""
        if self.is_local:
            return None
        extra = {"ResponseContentType": content_type} if content_type else {}
        try:
            url: str = self.fs.url(self.path(name), expires=expires_s, **extra)
            return url
        except (AttributeError, NotImplementedError, TypeError):
            return None

    def delete(self, name: str) -> None:
        if self.exists(name):
            self.fs.rm(self.path(name))

    # ------------------------------------------------------------ atomic writes

    def _publish(self, local_tmp: str, name: str) -> str:
        target = self.path(name)
        if self.is_local:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            os.replace(local_tmp, target)  # atomic rename within one filesystem
        else:
            try:
                self.fs.put_file(local_tmp, target)  # a single PUT: the object appears whole or not at all
            finally:
                os.unlink(local_tmp)
        return self.uri(name)

    def _tmp_file(self, name: str) -> str:
        # For local stores the temp file sits beside the target (same filesystem => atomic rename).
        if self.is_local:
            folder = Path(self.path(name)).parent
            folder.mkdir(parents=True, exist_ok=True)
            return str(folder / f".{Path(name).name}.{uuid.uuid4().hex}.tmp")
        # The name's extension last: the upload's Content-Type is guessed from it (a report opens in a browser).
        fd, path = tempfile.mkstemp(suffix=".tmp" + Path(name).suffix)
        os.close(fd)
        return path

    def write_bytes(self, name: str, data: bytes) -> str:
        tmp = self._tmp_file(name)
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self._publish(tmp, name)

    def write_text(self, name: str, text: str) -> str:
        return self.write_bytes(name, text.encode("utf-8"))

    def write_json(self, name: str, obj: Any) -> str:
        with timed("json_write"):
            return self._write_json(name, obj)

    def _write_json(self, name: str, obj: Any) -> str:
        text = json.dumps(_nan_to_none(json.loads(json.dumps(obj, default=_json_default))), indent=2, sort_keys=False)
        return self.write_text(name, text + "\n")

    def write_batches(self, name: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> str:
        """Stream row batches into one Parquet file; it appears only once complete."""
        tmp = self._tmp_file(name)
        try:
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                for batch in batches:
                    writer.write_batch(batch)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self._publish(tmp, name)

    def write_table(self, name: str, table: pa.Table, *, row_batch: int = ROW_BATCH) -> str:
        return self.write_batches(name, table.schema, table.to_batches(max_chunksize=row_batch))

    def write_records(self, name: str, records: builtins.list[BaseModel], record_type: type[BaseModel]) -> str:
        with timed("parquet_write"):  # records -> Arrow -> file: what a run spends writing its tables
            return self.write_table(name, to_table(records, record_type))

    def write_frame(self, name: str, frame: Any) -> str:
        with timed("parquet_write"):
            return self.write_table(name, pa.Table.from_pandas(frame, preserve_index=False))

    # ------------------------------------------------------------ reads

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open(self.path(name), "rb") as fh:
            data: bytes = fh.read()
            return data

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def read_json(self, name: str) -> Any:
        return json.loads(self.read_text(name))

    def read_table(self, name: str) -> pa.Table:
        # Local files go to pyarrow by path: reading through a Python file object made
        # pyarrow's reader threads outlive the interpreter now and then ("terminate called
        # without an active exception" at exit, seen with several CLI processes at once).
        # One file, not a dataset: ParquetFile skips read_table's dataset discovery, which cost a
        # small shard ~4 ms instead of ~1 (tens of shards read back at each stage's end).
        if self.is_local:
            return pq.ParquetFile(self.path(name)).read()
        with self.fs.open(self.path(name), "rb") as fh:
            return pq.ParquetFile(fh).read()

    def iter_batches(self, name: str, batch_size: int = ROW_BATCH) -> Iterator[pa.RecordBatch]:
        if self.is_local:
            yield from pq.ParquetFile(self.path(name)).iter_batches(batch_size=batch_size)
            return
        with self.fs.open(self.path(name), "rb") as fh:
            yield from pq.ParquetFile(fh).iter_batches(batch_size=batch_size)

    def read_records(self, name: str, record_type: type[BaseModel]) -> builtins.list[Any]:
        with timed("parquet_read"):
            return from_table(self.read_table(name), record_type)

    def read_frame(self, name: str) -> Any:
        with timed("parquet_read"):
            return self.read_table(name).to_pandas()

    # ------------------------------------------------------------ declared artifacts (runfolder.py)

    def save(self, artifact: Artifact, value: Any) -> str:
        """Write a declared artifact: records or a DataFrame (Parquet), a document (JSON), text, bytes.

        A JSON document is validated against its model first, so a run folder never holds
        a file that breaks its declared shape.
        """
        if artifact.format == "parquet":
            if artifact.schema is not None:
                return self.write_records(artifact.name, value, artifact.schema)
            return self.write_frame(artifact.name, value)
        if artifact.format == "json":
            if artifact.schema is not None and not isinstance(value, artifact.schema):
                value = artifact.schema.model_validate(value)
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json")
            return self.write_json(artifact.name, value)
        if artifact.format == "bytes":
            return self.write_bytes(artifact.name, value)
        return self.write_text(artifact.name, value)

    def load(self, artifact: Artifact) -> Any:
        """Read a declared artifact back as records, a DataFrame, a document model, text or bytes.

        The first declared artifact read from a run folder checks its ``schema_version``
        first (``check_schema_version``): a folder a newer refusalbench wrote is refused
        with one InputError instead of being misread. A document is validated knowing its
        file (``context["file"]``), so its checks can name it.
        """
        if not self._contract_checked:
            self.check_schema_version()
            self._contract_checked = True
        if artifact.format == "parquet":
            if artifact.schema is not None:
                return self.read_records(artifact.name, artifact.schema)
            return self.read_frame(artifact.name)
        if artifact.format == "json":
            data = self.read_json(artifact.name)
            if artifact.schema is None:
                return data
            return artifact.schema.model_validate(data, context={"file": self.uri(artifact.name)})
        if artifact.format == "bytes":
            return self.read_bytes(artifact.name)
        return self.read_text(artifact.name)

    def has(self, artifact: Artifact) -> bool:
        return self.exists(artifact.name)

    def check_schema_version(self) -> None:
        """Refuse a run folder whose manifest names a contract this code cannot read.

        One InputError naming ``manifest.json`` (exit 2 through the CLI), before any other
        file of the folder is read. A folder without a manifest (a bare benchmark's, a
        knowledge base's sub-folder) or with one that is not a JSON object passes: there is
        no version to check, and whoever reads that manifest reports what is wrong with it.
        """
        if not self.exists(runfolder.MANIFEST.name):
            return
        try:
            data = self.read_json(runfolder.MANIFEST.name)
        except ValueError:
            return
        if isinstance(data, dict):
            problem = runfolder.schema_version_problem(str(data.get("schema_version") or runfolder.UNVERSIONED))
            if problem is not None:
                raise InputError(self.uri(runfolder.MANIFEST.name), problem, field="schema_version")


def split_uri(uri: str) -> tuple[ArtifactStore, str]:
    """'runs/x/items.parquet' -> (store at runs/x, 'items.parquet')."""
    uri = str(uri)
    head, _, tail = uri.rstrip("/").rpartition("/")
    return ArtifactStore(head or "."), tail
