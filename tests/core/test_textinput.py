"""The one reader of text input files (tasks/core/textinput.py): UTF-8 with or without a BOM,
and one wording for what cannot be read."""

from __future__ import annotations

import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.textinput import decode_text, open_bytes, read_text, text_lines


def test_utf8_is_read_with_or_without_a_bom(tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes("café\nline two\n".encode())
    marked.write_bytes(b"\xef\xbb\xbf" + "café\nline two\n".encode())
    assert read_text(plain) == read_text(marked) == "café\nline two\n"


def test_a_byte_that_is_not_utf8_is_named_by_line_and_column(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\nb: 2\nc: caf\xe9\n")
    with pytest.raises(InputError) as info:
        read_text(path)
    assert str(info.value) == f"{path}:3: -: not UTF-8 (byte 0xe9 at column 7)"
    assert (info.value.line, info.value.field) == (3, None)
    # On line 1 the column counts from after the byte-order mark.
    path.write_bytes(b"\xef\xbb\xbfcaf\xe9\n")
    with pytest.raises(InputError, match=r":1: -: not UTF-8 \(byte 0xe9 at column 4\)$"):
        read_text(path)


def test_a_missing_file_or_a_folder_is_one_line(tmp_path):
    with pytest.raises(InputError) as info:
        read_text(tmp_path / "absent.txt")
    assert str(info.value) == f"{tmp_path / 'absent.txt'}: -: file not found"
    with pytest.raises(InputError) as info:
        read_text(tmp_path)
    assert str(info.value) == f"{tmp_path}: -: is a folder, not a file"


def test_decoding_part_of_a_file_counts_lines_from_where_it_starts():
    assert decode_text(b"\xef\xbb\xbfok", "f.jsonl", first_line=5) == "\ufeffok"  # a BOM only starts a file
    with pytest.raises(InputError) as info:
        decode_text(b"fine\nbad \xff here", "f.jsonl", first_line=5)
    assert str(info.value) == "f.jsonl:6: -: not UTF-8 (byte 0xff at column 5)"


def test_lines_are_streamed_and_a_bad_line_comes_in_place_of_its_text(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbffirst\n" + b"x" * 100 + b"\n" + b"caf\xe9\n" + b"last")
    with open_bytes(path) as stream:
        lines = list(text_lines(stream, str(path), max_line_bytes=50))
    assert [number for number, _ in lines] == [1, 2, 3, 4]
    assert lines[0][1] == "first\n" and lines[3][1] == "last"
    assert str(lines[1][1]) == f"{path}:2: -: line is longer than 50 bytes; refusing to read it"
    assert str(lines[2][1]) == f"{path}:3: -: not UTF-8 (byte 0xe9 at column 4)"
