"""The one bounded reader and the argv guard (issue 27, items 8 and 13)."""

from __future__ import annotations

import os

import pytest

from torchbuild.core.errors import PathError, UsageError
from torchbuild.core.safeio import TooLarge, loads_json, not_an_option, read_bytes, read_json, read_text


def test_dev_zero_is_refused_without_reading_it() -> None:
    with pytest.raises(PathError, match="not a regular file"):
        read_bytes("/dev/zero", 1024, "reading the manifest")


def test_a_fifo_is_refused_without_blocking(tmp_path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(PathError, match="not a regular file"):
        read_bytes(fifo, 1024, "reading the profile")


def test_a_file_over_the_limit_is_too_large(tmp_path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2049)
    with pytest.raises(TooLarge, match="more than the 2 KiB"):
        read_bytes(big, 2048, "reading the state")
    assert read_bytes(big, 4096, "reading") == b"x" * 2049


def test_a_directory_and_a_missing_file_are_path_errors(tmp_path) -> None:
    with pytest.raises(PathError, match="is a directory"):
        read_text(tmp_path, 10, "reading")
    with pytest.raises(PathError, match="does not exist"):
        read_text(tmp_path / "nope", 10, "reading")


def test_not_utf8_names_the_line(tmp_path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"ok\n\xff\n")
    with pytest.raises(PathError, match=r":2: not UTF-8"):
        read_text(f, 100, "reading")


@pytest.mark.parametrize(
    "text, words",
    [
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ("1" * 5000, "digits"),
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ('{"a": 1e999}', "out of range"),
    ],
)
def test_json_that_crashes_python_or_no_other_reader_takes_is_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        loads_json(text)


def test_ordinary_json_and_nesting_in_strings(tmp_path) -> None:
    assert loads_json('{"a": [1, 2.5, "[[[{{"], "b": -3}') == {"a": [1, 2.5, "[[[{{"], "b": -3}
    f = tmp_path / "m.json"
    f.write_text('{"deep": ' + "[" * 100 + "]" * 100 + "}")
    with pytest.raises(PathError, match="nested more than"):
        read_json(f, 1000, "reading the manifest")


def test_option_like_values_are_refused() -> None:
    assert not_an_option("v2.6.0", "ref") == "v2.6.0"
    with pytest.raises(UsageError, match="starts with '-'"):
        not_an_option("--upload-pack=touch /tmp/x", "ref")


def test_the_size_in_the_message_is_not_rounded_down_to_the_limit(tmp_path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * (1024 * 1024 + 200 * 1024))
    with pytest.raises(TooLarge, match=r"is 1\.2 MiB, more than the 1 MiB"):
        read_bytes(f, 1024 * 1024, "reading")
