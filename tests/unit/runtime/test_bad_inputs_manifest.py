"""What a hostile user tried on `invoke manifest.show` / `manifest.diff` and the tables torchbuild
prints (issue 27 items 8, 11, 12, 13 and 14): each is a named error or the value shown as it is."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import invoke_here, make_wheel
from test_manifest import OLD_WHEEL, RUN, saved

from torchbuild.builder import repro
from torchbuild.builder.manifest_task import DIFFERENT
from torchbuild.core import console
from torchbuild.core.errors import PathError, WheelError
from torchbuild.core.safeio import TooLarge
from torchbuild.runtime import manifest as mf
from torchbuild.runtime import report as rp
from torchbuild.runtime.options import BuildOptions

invoke = invoke_here  # `invoke ARGV` in this process, its exit status


def _with(path: str, value: Any) -> dict[str, Any]:
    """OLD_WHEEL with the dotted field path set to value."""
    data = copy.deepcopy(OLD_WHEEL)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


# --------------------------------------------------------------------------- item 8: bounded reads


def test_manifest_show_of_dev_zero_is_a_named_error_not_an_endless_read(capsys):
    assert invoke("manifest.show", "/dev/zero") == PathError.exit_code
    err = capsys.readouterr().err
    assert "not a regular file" in err and "hint: " in err and "Traceback" not in err


def test_a_fifo_given_as_a_manifest_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "x.manifest.json"
    os.mkfifo(fifo)
    with pytest.raises(PathError, match="not a regular file"):
        mf.read(fifo)


def test_a_manifest_larger_than_the_limit_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    path = saved(tmp_path, OLD_WHEEL)
    monkeypatch.setattr(mf, "MANIFEST_LIMIT", path.stat().st_size - 1)
    with pytest.raises(TooLarge, match="more than the") as caught:
        mf.read(path)
    assert str(path) in caught.value.message


def test_find_run_reads_other_manifests_in_the_out_dir_only_up_to_the_limit(tmp_path, monkeypatch):
    saved(tmp_path, {**OLD_WHEEL, "run_id": "ffffffffffff", "log": "x" * 5000}, "big.whl.manifest.json")
    monkeypatch.setattr(mf, "MANIFEST_LIMIT", 4000)
    with pytest.raises(TooLarge, match=r"big\.whl\.manifest\.json"):
        mf.find_run(tmp_path, RUN)


def test_a_ninja_log_larger_than_the_limit_is_a_named_error(tmp_path, monkeypatch):
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n" + "1\t2\t0\tx.o\tabc\n" * 100)
    monkeypatch.setattr(rp, "NINJA_LOG_LIMIT", 1000)
    with pytest.raises(TooLarge, match="ninja log"):
        rp.mark(log)
    with pytest.raises(TooLarge, match="ninja log"):
        rp.read_ninja_log(log)


def _wheel_pair(tmp_path: Path, extra: dict[str, bytes]) -> tuple[Path, Path]:
    """Two wheels of pkg 1.0 with different content; b also holds the members in extra."""
    a = make_wheel(tmp_path / "a", "pkg", "1.0", module="pkg", salt="one")
    b = make_wheel(tmp_path / "b", "pkg", "1.0", module="pkg", salt="two")
    with zipfile.ZipFile(b, "a") as z:
        for name, data in extra.items():
            z.writestr(name, data)
    return a, b


def test_a_wheel_member_larger_than_the_limit_is_refused_before_it_is_decompressed(tmp_path, monkeypatch):
    a, b = _wheel_pair(tmp_path, {"pkg/huge.so": b"\0" * 5000})
    monkeypatch.setattr(repro, "MEMBER_LIMIT", 4096)
    with pytest.raises(WheelError, match=r"member pkg/huge\.so is 5000 bytes uncompressed") as caught:
        repro.diff_wheels(a, b)
    assert str(b) in caught.value.message


def test_a_wheel_announcing_more_members_than_the_limit_is_refused_before_they_are_read(tmp_path, monkeypatch, capsys):
    a, b = _wheel_pair(tmp_path, {f"pkg/m{i}.py": b"" for i in range(10)})
    monkeypatch.setattr(repro, "MEMBERS_LIMIT", 8)
    with monkeypatch.context() as m:
        m.setattr(zipfile.ZipFile, "_RealGetContents", lambda self: pytest.fail("the central directory was read"))
        assert invoke("manifest.diff", str(b), str(a)) == WheelError.exit_code
        assert "14 members, more than the 8" in capsys.readouterr().err
        with pytest.raises(WheelError, match="14 members, more than the 8"):
            repro.diff_wheels(b, a)


def test_a_wheel_whose_end_record_understates_its_members_is_still_refused(tmp_path, monkeypatch):
    a, b = _wheel_pair(tmp_path, {f"pkg/m{i}.py": b"" for i in range(10)})
    monkeypatch.setattr(repro, "MEMBERS_LIMIT", 8)
    monkeypatch.setattr(repro, "check_member_count", lambda wheel: None)  # as if the record said fewer
    with pytest.raises(WheelError, match="14 members, more than the 8"):
        repro.diff_wheels(a, b)


# --------------------------------------------------------------------------- item 11: linear diff


class _CountedName(str):
    """A member name that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_diff_of_two_wheels_compares_names_a_number_of_times_linear_in_the_members(tmp_path, monkeypatch):
    members = 2000
    names = [f"pkg/m{i:05d}.py" for i in range(members)]
    a = make_wheel(tmp_path / "a", "pkg", "1.0", module="pkg", salt="one")
    b = make_wheel(tmp_path / "b", "pkg", "1.0", module="pkg", salt="two")
    for wheel, order in ((a, names), (b, names[::-1])):  # every shared member at another place
        with zipfile.ZipFile(wheel, "a") as z:
            for name in order:
                z.writestr(name, b"")
    infolist = zipfile.ZipFile.infolist

    def counted(self: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
        infos = infolist(self)
        for info in infos:
            info.filename = _CountedName(info.filename)
        return infos

    monkeypatch.setattr(zipfile.ZipFile, "infolist", counted)
    _CountedName.compared = 0
    found = repro.diff_wheels(a, b)
    assert sum(m.what == "position" for m in found.members) >= members - 1
    # a list.index() per member compares ~members**2 / 2 = 2,000,000 times
    assert _CountedName.compared < 20 * members


# the text of a table of 40k rows: rich takes minutes, so console lays it out itself

TAME = ["a", "Z", "0", " ", "  ", "[", "]", "[/x]", ":", "-", "\u00e9", "e\u0301", "\u4e2d", "\u2500", "\x1b[31m", "\r"]
EXOTIC = [*TAME, "\n", "\t", "\u00a0", "\u3000", "\u200b"]


def _random_table(rng: random.Random, alphabet: list[str]) -> dict[str, Any]:
    def text(most: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))

    n = rng.randint(1, 5)
    most = rng.choice([1, 4, 12, 40, 90])
    return {
        "columns": [text(6) or "c" for _ in range(n)],
        "rows": [[text(most) for _ in range(rng.randint(0, n))] for _ in range(rng.randint(1, 12))],
        "title": rng.choice([None, text(8), text(60)]),
        "justify": [rng.choice(["left", "right"]) for _ in range(rng.randint(0, n))],
        "header": rng.random() < 0.6,
    }


@pytest.mark.parametrize("alphabet", [TAME, EXOTIC], ids=["tame", "exotic"])
def test_a_table_laid_out_without_rich_is_the_text_rich_makes(alphabet):
    rng = random.Random(27)
    laid_out = 0
    for _ in range(1500):
        t = _random_table(rng, alphabet)
        fast = console._aligned(t["columns"], t["rows"], t["title"], t["justify"], t["header"])
        if fast is not None:
            laid_out += 1
            assert fast == console.table(**t), t  # a table this small goes through rich
    assert laid_out > (500 if alphabet is TAME else 10)


def test_a_table_of_40k_rows_is_laid_out_without_rich(monkeypatch):
    rows = [(f"pkg/m{i:05d}.py", "position", str(i), str(40_000 - i)) for i in range(40_000)]
    monkeypatch.setattr(console, "Table", None)  # rich's Table would take minutes
    text = console.table(("member", "differs in", "A", "B"), rows, title="[wheels]")
    lines = text.splitlines()
    assert len(lines) == 4 + 40_000 and lines[0] == "[wheels]"  # title, blank edge, header, rule
    assert lines[-1].split() == ["pkg/m39999.py", "position", "39999", "1"]


# --------------------------------------------------------------------------- item 12: values shown as they are

SHOWN_AS_IS = {
    "closing tag": "[/bar]",
    "style tag": "[red]",
    "open and close": "[bold]loud[/bold]",
    "link tag": "[link=http://x]y[/link]",
    "emoji code": ":smile:",
    "backslash before a bracket": "\\[x]",
}


@pytest.mark.parametrize("value", SHOWN_AS_IS.values(), ids=SHOWN_AS_IS.keys())
def test_a_table_shows_rich_markup_in_a_value_as_the_text_it_is(value):
    text = console.table(("key", "value"), [("k", value)], title=value)
    assert text.splitlines()[0] == value
    assert text.splitlines()[-1].split(None, 1) == ["k", value]


ESCAPES = {
    "colour": ("a\x1b[31mred\x1b[0mb", "aredb"),
    "clear screen": ("a\x1b[2Jb", "ab"),
    "window title (BEL)": ("a\x1b]0;pwned\x07b", "ab"),
    "hyperlink (ST)": ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),
    "terminal reset": ("a\x1bcb", "ab"),
    "8-bit CSI": ("a\x9b31mb", "ab"),
    "lone ESC at the end": ("ab\x1b", "ab"),
    "carriage return": ("ok\rFAIL", "ok\\rFAIL"),
    "backspace and BEL": ("a\x08\x07b", "a\\x08\\x07b"),
    "NUL and DEL": ("a\x00\x7fb", "a\\x00\\x7fb"),
}


@pytest.mark.parametrize(("value", "shown"), ESCAPES.values(), ids=ESCAPES.keys())
def test_a_table_strips_terminal_escape_sequences_and_shows_control_characters(value, shown):
    text = console.table(("key", "value"), [("k", value)])
    assert text.splitlines()[-1].split(None, 1) == ["k", shown]
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in text)


def test_invoke_config_shows_a_value_with_square_brackets(capsys):
    assert invoke("config", "--set", "env.FOO=[/bar]", "--set", "env.BAR=[red]") == 0
    out = capsys.readouterr().out
    assert '{"FOO": "[/bar]", "BAR": "[red]"}' in out


def test_manifest_show_of_a_build_with_square_brackets_in_its_values(tmp_path, capsys):
    data = _with("environment", {"FOO": "[/bar]", "COLOUR": "[red]", "TITLE": "\x1b]0;pwned\x07x"})
    assert invoke("manifest.show", str(saved(tmp_path, data))) == 0
    out = capsys.readouterr().out
    assert "[/bar]" in out and "[red]" in out and "\x1b" not in out and "pwned" not in out


def test_manifest_diff_shows_square_brackets_in_the_fields_that_differ(tmp_path, capsys):
    a = saved(tmp_path, _with("environment.CXXFLAGS", "[red]"), "a.manifest.json")
    b = saved(tmp_path, _with("environment.CXXFLAGS", "[/bar]"), "b.manifest.json")
    assert invoke("manifest.diff", str(a), str(b)) == DIFFERENT
    row = next(line for line in capsys.readouterr().out.splitlines() if "CXXFLAGS" in line)
    assert row.split() == ["environment.CXXFLAGS", "[red]", "[/bar]"]


def test_manifest_diff_of_wheels_shows_a_member_named_with_square_brackets(tmp_path, capsys):
    a, b = _wheel_pair(tmp_path, {"[/oops].py": b"", "[red].py": b""})
    assert invoke("manifest.diff", str(a), str(b)) == DIFFERENT
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["[/oops].py", "only", "in", "B"] in [r[:4] for r in rows]
    assert ["[red].py", "only", "in", "B"] in [r[:4] for r in rows]


# --------------------------------------------------------------------------- item 13: strict JSON

NOT_JSON_TORCHBUILD_WROTE = {
    "100k deep": ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than"),
    "5000-digit number": ('{"x": 1' + "0" * 5000 + "}", "more than 64 digits"),
    "NaN": ('{"x": NaN}', "NaN is not JSON"),
    "Infinity": ('{"x": Infinity}', "Infinity is not JSON"),
    "-Infinity": ('{"x": -Infinity}', "-Infinity is not JSON"),
    "a float out of range": ('{"x": 1e999}', "out of range"),
}


@pytest.mark.parametrize(("text", "message"), NOT_JSON_TORCHBUILD_WROTE.values(), ids=NOT_JSON_TORCHBUILD_WROTE.keys())
def test_json_no_manifest_holds_is_a_named_error(tmp_path, capsys, text, message):
    path = tmp_path / "x.manifest.json"
    path.write_text(text)
    with pytest.raises(mf.ManifestError, match=message) as caught:
        mf.read(path)
    assert str(path) in caught.value.message and caught.value.hint
    assert invoke("manifest.show", str(path)) == mf.ManifestError.exit_code
    assert "Traceback" not in capsys.readouterr().err


def test_nan_in_a_manifest_field_is_refused_not_read_as_a_number(tmp_path):
    path = tmp_path / "x.manifest.json"
    path.write_text(json.dumps(_with("duration_s", float("nan"))))  # Python writes NaN
    with pytest.raises(mf.ManifestError, match="NaN"):
        mf.read(path)


# --------------------------------------------------------------------------- item 14: damaged wheels


def _damaged(tmp_path: Path, compression: int) -> tuple[Path, Path]:
    """Two wheels that differ; b's member pkg/data.bin has one byte of its data changed (its
    recorded CRC no longer matches; deflated, the stream may not even decompress)."""
    payload = bytes(range(256)) * 64
    a, b = _wheel_pair(tmp_path, {})
    for wheel in (a, b):
        with zipfile.ZipFile(wheel, "a", compression=compression) as z:
            z.writestr("pkg/data.bin", payload)
    with zipfile.ZipFile(b) as z:
        info = z.getinfo("pkg/data.bin")
    raw = bytearray(b.read_bytes())
    name_len = len(info.filename.encode())
    data_at = info.header_offset + 30 + name_len + len(info.extra)
    raw[data_at + info.compress_size // 2] ^= 0xFF
    b.write_bytes(bytes(raw))
    return a, b


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_a_wheel_member_with_a_bad_crc_is_a_named_error_naming_the_wheel_and_member(tmp_path, capsys, compression):
    a, b = _damaged(tmp_path, compression)
    with pytest.raises(WheelError, match=r"member pkg/data\.bin cannot be read") as caught:
        repro.diff_wheels(a, b)
    assert str(b) in caught.value.message
    assert invoke("manifest.diff", str(a), str(b)) == WheelError.exit_code
    err = capsys.readouterr().err
    assert "pkg/data.bin" in err and "hint: " in err and "Traceback" not in err


def _name_not_utf8(wheel: Path) -> None:
    """A member whose name is flagged UTF-8 but holds bytes that are not."""
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("pkg/\u00e9x.py", b"x")
    wheel.write_bytes(wheel.read_bytes().replace("pkg/\u00e9x.py".encode(), b"pkg/\xff\xfex.py"))


def _cut_in_half(wheel: Path) -> None:
    wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])


DAMAGED_ARCHIVES = {"a member name not UTF-8": _name_not_utf8, "cut in half": _cut_in_half}


@pytest.mark.parametrize("damage", DAMAGED_ARCHIVES.values(), ids=DAMAGED_ARCHIVES.keys())
def test_manifest_diff_of_a_damaged_wheel_is_a_named_error(tmp_path, capsys, damage):
    a, b = _wheel_pair(tmp_path, {})
    damage(b)
    assert invoke("manifest.diff", str(a), str(b)) == WheelError.exit_code
    err = capsys.readouterr().err
    assert str(b) in err and "hint: " in err and "Traceback" not in err


def test_the_companions_step_reads_the_manifests_beside_the_wheel_only_up_to_the_limit(tmp_path, monkeypatch):
    from torchbuild.builder import host as runner
    from torchbuild.profile.config import resolve
    from torchbuild.runtime.backends.native import NativeBackend

    wheel = tmp_path / "torch-2.6.0-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"")
    saved(tmp_path, {**OLD_WHEEL, "log": "x" * 5000}, "big.whl.manifest.json")
    monkeypatch.setattr(NativeBackend, "run", lambda self, step, request, binds: None)  # built nothing
    monkeypatch.setattr(mf, "MANIFEST_LIMIT", 4000)
    spec = resolve("cpu")
    with pytest.raises(TooLarge, match=r"big\.whl\.manifest\.json"):
        runner.companions_with(spec, NativeBackend(spec, BuildOptions()), [], wheel, cache=tmp_path / "cache")


def test_config_text_sends_no_terminal_escape_sequence_from_a_value():
    from torchbuild.configview.render import config_text
    from torchbuild.profile.config import resolve

    spec = dataclasses.replace(resolve("cpu"), description="\x1b[2Jcleared", env={"TITLE": "\x1b]0;pwned\x07x"})
    text = config_text(spec)
    assert "\x1b" not in text and "\x07" not in text and "# cleared" in text and "TITLE='x'" in text


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_manifest_diff_of_a_wheel_that_is_no_regular_file_is_refused_without_waiting(tmp_path, capsys, kind):
    a, _ = _wheel_pair(tmp_path, {})
    odd = tmp_path / "odd-1.0-py3-none-any.whl"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.mkdir()
    assert invoke("manifest.diff", str(odd), str(a)) == WheelError.exit_code
    err = capsys.readouterr().err
    assert "not a regular file" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["../../elsewhere.whl", "/dev/zero", "..", ""])
def test_a_manifest_whose_wheel_name_is_not_a_file_name_is_refused(tmp_path, name):
    path = saved(tmp_path, _with("wheel.name", name))
    with pytest.raises(mf.ManifestError, match="is not a file name"):
        mf.read(path)
