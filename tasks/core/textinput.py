"""Reading the text files a user gives: one reader, one wording for what cannot be read.

Every text input (configs, the lever catalogue, base sets, judged responses, QA pairs,
documents, evaluation specs) is UTF-8, with or without a byte-order mark. What cannot be
read is an ``InputError`` rendered ``FILE:LINE: -: problem``:

- a byte that is not UTF-8: ``not UTF-8 (byte 0xe9 at column 29)``, the column counting
  bytes of its line (after a BOM on line 1);
- a line over the size bound: ``line is longer than 10 MiB; refusing to read it``;
- a missing file: ``file not found`` (no line), a folder: ``is a folder, not a file``.

``read_text`` reads a whole file; ``text_lines`` streams one line at a time with a size
bound, handing a line's problem back in place of its text so that a validator can report it
and read on (or raise it); ``decode_text`` decodes bytes the caller read itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol

from refusalbench.tasks.core.errors import InputError

UTF8_BOM = b"\xef\xbb\xbf"


class _LineSource(Protocol):
    """A binary stream, or a wrapper that counts what it reads (the importers' progress bar)."""

    def readline(self, size: int = -1, /) -> bytes: ...


def decode_text(raw: bytes, file: str, *, first_line: int = 1) -> str:
    """``raw`` as text: UTF-8, a BOM dropped when ``raw`` starts the file (``first_line`` 1).

    ``first_line``: the file line ``raw`` starts on, so a bad byte is reported at its line.
    """
    body = raw[len(UTF8_BOM) :] if first_line == 1 and raw.startswith(UTF8_BOM) else raw
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = body.rfind(b"\n", 0, exc.start) + 1
        raise InputError(
            file,
            f"not UTF-8 (byte 0x{body[exc.start]:02x} at column {exc.start - line_start + 1})",
            line=first_line + body.count(b"\n", 0, exc.start),
        ) from None


def open_bytes(path: str | Path) -> IO[bytes]:
    """The file opened for reading bytes; a missing, folder or unreadable file is an InputError."""
    file = str(path)
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(file, "file not found") from None
    except IsADirectoryError:
        raise InputError(file, "is a folder, not a file") from None
    except OSError as exc:
        raise InputError(file, f"cannot read file: {exc.strerror or exc}") from None


def read_bytes(path: str | Path) -> bytes:
    """A file's bytes; a missing, folder or unreadable file is an InputError."""
    with open_bytes(path) as stream:
        return stream.read()


def read_text(path: str | Path) -> str:
    """A whole text file: UTF-8 with or without a BOM; anything else is an InputError naming its line."""
    return decode_text(read_bytes(path), str(path))


def human_bytes(n: int) -> str:
    """A size as people write it: ``10 MiB`` when it is whole mebibytes, else ``4096 bytes``."""
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    return f"{n} bytes"


def text_lines(stream: _LineSource, file: str, max_line_bytes: int) -> Iterator[tuple[int, str | InputError]]:
    """(line number, text) per physical line of ``stream`` (from ``open_bytes``; split at ``\\n``
    only); a line that is too long or not UTF-8 comes as its InputError in place of the text.

    Each line is read with a size bound, so an enormous line is skipped chunk by chunk
    instead of being loaded whole.
    """
    line_no = 0
    while chunk := stream.readline(max_line_bytes + 1):
        line_no += 1
        if len(chunk) > max_line_bytes and not chunk.endswith(b"\n"):
            yield (
                line_no,
                InputError(
                    file, f"line is longer than {human_bytes(max_line_bytes)}; refusing to read it", line=line_no
                ),
            )
            while chunk and not chunk.endswith(b"\n"):
                chunk = stream.readline(max_line_bytes)
            continue
        text: str | InputError
        try:
            text = decode_text(chunk, file, first_line=line_no)
        except InputError as problem:
            text = problem
        yield line_no, text


def open_text(path: str | Path) -> IO[str]:
    """A text stream of a file ``text_lines`` found readable (for the csv module): UTF-8, BOM dropped."""
    return open(path, encoding="utf-8-sig", newline="")
