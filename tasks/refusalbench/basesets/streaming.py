"""Reading the importers' source files once, line by line, with a progress callback.

The public dumps the importers read can be large (the KILT knowledge source is about 35 GB of
JSON lines), so they are streamed in bounded memory and the bytes read so far are reported to an
optional ``on_progress(bytes_read, total_bytes)`` callback, from which the CLI draws a bar. One
``ByteProgress`` can span several files, so an import reading two files shows one bar.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from refusalbench.tasks.refusalbench.basesets.problems import Problems

# core.textinput owns the line-level rules (size bound, BOM, UTF-8) that every text input obeys;
# readers.json_lines reports them to the file's Problems, so a bad line reads the same
# whichever command met it.
from refusalbench.tasks.refusalbench.basesets.readers import json_lines

ProgressCallback = Callable[[int, int], None]

# Report at most every 8 MiB: a few thousand calls for the 35 GB knowledge source.
PROGRESS_STEP = 8 * 1024 * 1024


class ByteProgress:
    """Bytes read over one or more files against their combined size, passed on every ``step`` bytes."""

    def __init__(
        self, paths: Sequence[str | os.PathLike[str]], on_progress: ProgressCallback | None, step: int = PROGRESS_STEP
    ):
        self.total = sum(Path(p).stat().st_size for p in paths)
        self.done = 0
        self._on_progress = on_progress
        self._step = step
        self._reported = 0

    def add(self, n: int) -> None:
        self.done += n
        if self._on_progress is not None and self.done - self._reported >= self._step:
            self._reported = self.done
            self._on_progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        """The final report: everything is read (or no longer needed when the reader stopped early)."""
        self.done = self.total
        if self._on_progress is not None:
            self._on_progress(self.total, self.total)


class _CountingStream:
    """A binary stream that reports what ``readline`` hands out to a ByteProgress."""

    def __init__(self, raw: IO[bytes], progress: ByteProgress):
        self._raw = raw
        self._progress = progress

    def readline(self, size: int = -1) -> bytes:
        chunk = self._raw.readline(size)
        self._progress.add(len(chunk))
        return chunk


def refuse_json_array(path: Path, problems: Problems) -> None:
    """A file that opens with ``[`` is one JSON array, not JSON lines: say how to convert it."""
    with open(path, "rb") as stream:
        head = stream.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        problems.add(
            "this is one JSON array, not JSON lines (one object per line); convert it first, "
            f"e.g. jq -c '.[]' {path.name} > {path.stem}.jsonl",
            line=1,
        )
        problems.raise_if_any()


def iter_json_lines(
    path: Path, problems: Problems, max_line_bytes: int, progress: ByteProgress | None = None
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) per non-blank line; problems are collected, not raised."""
    with open(path, "rb") as raw:
        yield from json_lines(raw if progress is None else _CountingStream(raw, progress), problems, max_line_bytes)


def iter_raw_lines(
    path: Path, max_line_bytes: int, progress: ByteProgress | None = None
) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, complete) per physical line, undecoded, for callers that parse few lines.

    A line longer than ``max_line_bytes`` comes back as its first ``max_line_bytes`` bytes with
    ``complete`` False; the rest of it is skipped in chunks, never held whole.
    """
    with open(path, "rb") as raw:
        stream = raw if progress is None else _CountingStream(raw, progress)
        line_no = 0
        while True:
            chunk = stream.readline(max_line_bytes + 1)
            if not chunk:
                return
            line_no += 1
            if len(chunk) > max_line_bytes and not chunk.endswith(b"\n"):
                head = chunk[:max_line_bytes]
                while chunk and not chunk.endswith(b"\n"):
                    chunk = stream.readline(max_line_bytes)
                yield line_no, head, False
                continue
            if line_no == 1 and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
            yield line_no, chunk, True
