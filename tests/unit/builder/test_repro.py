"""Reproducible wheels (repro.py): SOURCE_DATE_EPOCH from the source, the canonical zip, the
member-by-member comparison behind `invoke manifest.diff A.whl B.whl`, and the --python option."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib
from pathlib import Path

import pytest
from helpers import invoke_here, make_wheel

from torchbuild.builder import repro
from torchbuild.builder.host import pythons_option
from torchbuild.builder.manifest_task import DIFFERENT
from torchbuild.core.errors import ToolMissing, UsageError, WheelError
from torchbuild.profile.config import resolve
from torchbuild.runtime.compile_job import check_wheel_tools, path_independent
from torchbuild.runtime.pipenv import interpreter
from torchbuild.source.fetch import SourceInfo

EPOCH = 1700000000  # 2023-11-14T22:13:20Z


def _shuffled(wheel: Path, *, when: tuple[int, ...], mode: int, reverse: bool) -> Path:
    """The same members as wheel, in another order, with another timestamp and mode."""
    out = wheel.parent / ("reversed" if reverse else "sorted") / wheel.name
    out.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        infos = sorted(src.infolist(), key=lambda i: i.filename, reverse=reverse)
        for info in infos:
            new = zipfile.ZipInfo(info.filename, date_time=when)
            new.external_attr = mode << 16
            new.compress_type = zipfile.ZIP_STORED if reverse else zipfile.ZIP_DEFLATED
            dst.writestr(new, src.read(info))
    return out


def test_two_wheels_with_the_same_files_become_byte_identical(tmp_path):
    wheel = make_wheel(tmp_path / "w", "pkg", "1.0", module="pkg")
    a = _shuffled(wheel, when=(2024, 5, 1, 12, 0, 0), mode=0o100664, reverse=False)
    b = _shuffled(wheel, when=(1999, 1, 1, 0, 0, 0), mode=0o100600, reverse=True)
    assert a.read_bytes() != b.read_bytes()
    assert repro.normalize_wheel(a, EPOCH) and repro.normalize_wheel(b, EPOCH)
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as z:
        names = z.namelist()
        assert names[-1] == "pkg-1.0.dist-info/RECORD" and names[0] == "pkg/__init__.py"
        assert {i.date_time for i in z.infolist()} == {(2023, 11, 14, 22, 13, 20)}
        assert {i.external_attr >> 16 for i in z.infolist()} == {0o100644}
        # the contents are untouched: RECORD's hashes stay true
        with zipfile.ZipFile(wheel) as orig:
            assert {n: z.read(n) for n in names} == {n: orig.read(n) for n in orig.namelist()}
    # a canonical wheel is left as it is
    before = a.stat().st_mtime_ns
    assert repro.normalize_wheel(a, EPOCH) is False and a.stat().st_mtime_ns == before
    assert not list(a.parent.glob("*.partial"))


def test_executables_keep_their_execute_bit(tmp_path):
    wheel = tmp_path / "e-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        info = zipfile.ZipInfo("e-1.0.data/scripts/run", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o100775 << 16
        z.writestr(info, "#!/bin/sh\n")
        z.writestr("e-1.0.dist-info/RECORD", "")
    repro.normalize_wheel(wheel, EPOCH)
    with zipfile.ZipFile(wheel) as z:
        assert z.getinfo("e-1.0.data/scripts/run").external_attr >> 16 == 0o100755


def test_a_date_before_1980_becomes_1980():
    assert repro.zip_time(0) == (1980, 1, 1, 0, 0, 0)
    assert repro.zip_time(EPOCH + 1) == (2023, 11, 14, 22, 13, 20)  # zip keeps even seconds


def test_a_file_that_is_not_a_zip_is_a_named_error(tmp_path):
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    bad.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(WheelError):
        repro.normalize_wheel(bad, EPOCH)
    assert list(tmp_path.iterdir()) == [bad]


def test_diff_names_each_member_and_how_it_differs(tmp_path):
    a = make_wheel(tmp_path / "a", "pkg", "1.0", module="pkg", salt="one")
    b = make_wheel(tmp_path / "b", "pkg", "1.0", module="pkg", salt="two")
    with zipfile.ZipFile(b, "a") as z:
        z.writestr("pkg/extra.py", "x = 1\n")
    d = repro.diff_wheels(a, b)
    assert not d.identical
    found = {(m.name, m.what) for m in d.members}
    assert ("pkg/__init__.py", "content") in found
    assert ("pkg-1.0.dist-info/METADATA", "content") in found
    assert ("pkg/extra.py", "only in B") in found
    text = repro.describe(d, a, b)
    assert text.startswith("different: ") and "pkg/extra.py" in text and "members differ" in text

    c = _shuffled(a, when=(2024, 5, 1, 12, 0, 0), mode=0o100755, reverse=False)
    metadata_only = {(m.name, m.what) for m in repro.diff_wheels(a, c).members}
    assert ("pkg/__init__.py", "timestamp") in metadata_only and ("pkg/__init__.py", "mode") in metadata_only
    assert not any(what == "content" for _, what in metadata_only)

    same = tmp_path / "same.whl"
    same.write_bytes(a.read_bytes())
    assert repro.diff_wheels(a, same).identical
    assert repro.describe(repro.diff_wheels(a, same), a, same).startswith("identical: ")


invoke = invoke_here  # `invoke ARGV` in this process, its exit status


def test_manifest_diff_of_two_wheels_exits_99_when_they_differ(tmp_path, capsys):
    a = make_wheel(tmp_path / "a", "pkg", "1.0", module="pkg", salt="one")
    b = make_wheel(tmp_path / "b", "pkg", "1.0", module="pkg", salt="two")
    assert invoke("manifest.diff", str(a), str(b)) == DIFFERENT
    assert "pkg/__init__.py" in capsys.readouterr().out
    same = make_wheel(tmp_path / "c", "pkg", "1.0", module="pkg", salt="one")
    assert invoke("manifest.diff", str(a), str(same)) == 0
    assert "identical" in capsys.readouterr().out
    # a wheel that is not a wheel: a named error, not a traceback
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    bad.write_text("no zip")
    code = invoke("manifest.diff", str(a), str(bad))
    assert code == WheelError.exit_code and "not a zip archive" in capsys.readouterr().err


def _zeros_wheel(path: Path, members: int, date: int, size: int = 1 << 20) -> Path:
    """A wheel of `members` members of `size` zero bytes each, written by hand: the member's
    deflated bytes (about 1 KiB per MiB) are made once and repeated, so a wheel declaring
    gigabytes is written in milliseconds. date: the members' DOS date (a timestamp difference
    makes two such wheels differ while every member's content is the same)."""

    def deflated(data: bytes) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush()

    wheel_text = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    zeros = bytes(size)
    entries = [("zeros-1.0.dist-info/WHEEL", deflated(wheel_text), zlib.crc32(wheel_text), len(wheel_text))]
    blob, crc = deflated(zeros), zlib.crc32(zeros)
    entries += [(f"zeros/z{i:06d}", blob, crc, size) for i in range(members)]
    out, central = bytearray(), bytearray()
    for name, data, c, usize in entries:
        n, offset = name.encode(), len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, date, c, len(data), usize, len(n), 0) + n + data
        central += (
            struct.pack(
                "<4s6H3L5H2L",
                b"PK\x01\x02",
                20,
                20,
                0,
                8,
                0,
                date,
                c,
                len(data),
                usize,
                len(n),
                0,
                0,
                0,
                0,
                0o644 << 16,
                offset,
            )
            + n
        )
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), len(out), 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out + central + end))
    return path


def test_manifest_diff_refuses_wheels_that_would_inflate_far_beyond_their_size(tmp_path, capsys):
    """Issue 41 item 19: two 4 MB wheels inflated 16 GiB each (42 s of CPU). Here two 330 KB
    wheels declaring 300 MiB each: refused from their central directories, before inflating."""
    a = _zeros_wheel(tmp_path / "a" / "zeros-1.0-py3-none-any.whl", 300, date=0x5821)
    b = _zeros_wheel(tmp_path / "b" / "zeros-1.0-py3-none-any.whl", 300, date=0x5822)
    started = time.monotonic()
    code = invoke("manifest.diff", str(a), str(b))
    err = capsys.readouterr().err
    assert code == WheelError.exit_code, err
    assert f"error: WheelError: {a} would inflate to 300 MiB, " in err and "at most 100 times" in err, err
    assert time.monotonic() - started < 5


def test_manifest_diff_has_a_total_inflate_bound(tmp_path, monkeypatch):
    """The bound on both wheels together (16 GiB: a pair of CUDA torch wheels is some 2 to 9),
    here lowered so that two small real wheels cross it."""
    a = make_wheel(tmp_path / "a", "pkg", "1.0", module="pkg", salt="one")
    c = _shuffled(a, when=(2024, 5, 1, 12, 0, 0), mode=0o100755, reverse=False)
    monkeypatch.setattr(repro, "DIFF_INFLATE_LIMIT", 10)
    with pytest.raises(WheelError, match=r"would inflate .* more than the .* torchbuild inflates for a diff"):
        repro.diff_wheels(a, c)


def test_wheels_that_inflate_as_wheels_do_are_still_compared(tmp_path):
    """A few MiB of zeros in a 10 KB wheel is under the floor (64 MiB): compared as before."""
    a = _zeros_wheel(tmp_path / "a" / "zeros-1.0-py3-none-any.whl", 8, date=0x5821)
    b = _zeros_wheel(tmp_path / "b" / "zeros-1.0-py3-none-any.whl", 8, date=0x5822)
    d = repro.diff_wheels(a, b)
    assert {m.what for m in d.members} == {"timestamp"}


# --------------------------------------------------------------------------- SOURCE_DATE_EPOCH


def test_a_git_tree_takes_its_commit_time(tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    env = {**os.environ, "GIT_COMMITTER_DATE": "@1600000000 +0000", "GIT_AUTHOR_DATE": "@1500000000 +0000"}
    for cmd in (
        ["init", "-q"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
    ):
        subprocess.run(["git", "-C", str(tree), *cmd], check=True, env=env)
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    epoch = repro.source_date_epoch(SourceInfo(kind="git", path=tree, commit=commit), {})
    assert epoch == repro.Epoch(1600000000, f"commit {commit[:12]}")
    # a release process's own SOURCE_DATE_EPOCH wins
    assert repro.source_date_epoch(SourceInfo(kind="git", path=tree, commit=commit), {"SOURCE_DATE_EPOCH": "42"}) == (
        repro.Epoch(42, "env")
    )


def test_an_archive_takes_its_newest_member(tmp_path):
    archive = tmp_path / "src.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, mtime in (("src/a.py", 1600000000), ("src/b.py", 1650000000)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 2, mtime
            tar.addfile(info, io.BytesIO(b"x\n"))
    info = SourceInfo(kind="tarball", path=tmp_path / "unpacked", url=str(archive))
    assert repro.source_date_epoch(info, {}) == repro.Epoch(1650000000, "archive src.tar.gz")


@pytest.mark.parametrize("kind", ["dsc", "dir"])
def test_a_debian_source_takes_its_changelog_date(tmp_path, kind):
    """A .dsc, or the tree dpkg-source made of it given as a directory: the real wheel's rebuild
    from the unpacked tree was stamped 1980 against the .dsc build's changelog date (all 10,820
    members differed by their time)."""
    (tmp_path / "debian").mkdir()
    (tmp_path / "debian" / "changelog").write_text(
        "pytorch (2.6.0+dfsg-7) unstable; urgency=medium\n\n  * x\n\n"
        " -- Someone <s@example.org>  Tue, 04 Mar 2025 10:00:00 +0100\n\n"
        "pytorch (2.6.0+dfsg-6) unstable; urgency=medium\n\n  * y\n\n"
        " -- Someone <s@example.org>  Mon, 03 Feb 2025 10:00:00 +0100\n"
    )
    epoch = repro.source_date_epoch(SourceInfo(kind=kind, path=tmp_path), {})
    assert epoch == repro.Epoch(1741078800, "debian/changelog")  # 2025-03-04T09:00:00Z, the newest entry


def _wheel_of(tree: Path, out: Path) -> Path:
    """A wheel of tree's files stamped with their mtimes, as a build tool zips them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(p for p in tree.rglob("*") if p.is_file() and "build" not in p.parts):
            z.write(path, path.relative_to(tree).as_posix())
    return out


def test_two_copies_of_a_plain_tree_give_the_same_wheel_whatever_their_mtimes(tmp_path):
    a = tmp_path / "a"
    for name, text in {"setup.py": "# x\n", "pkg/__init__.py": "", "pkg/op.py": "x = 1\n"}.items():
        (a / name).parent.mkdir(parents=True, exist_ok=True)
        (a / name).write_text(text)
        os.utime(a / name, (1600000000, 1600000000))
    b = tmp_path / "b"
    shutil.copytree(a, b, copy_function=shutil.copy)  # as `cp -r`: the content, the copy's own mtimes
    for path in b.rglob("*.py"):
        os.utime(path, (1700000000, 1700000000))
    (a / "build").mkdir()  # the build writes into the tree: its first build moves nothing
    (a / "build" / "new.o").write_text("")
    epochs = [repro.source_date_epoch(SourceInfo(kind="dir", path=tree), {}) for tree in (a, b)]
    assert epochs[0] == epochs[1]
    wheels = [_wheel_of(tree, tmp_path / name / "p-1.0-py3-none-any.whl") for tree, name in ((a, "wa"), (b, "wb"))]
    for wheel, epoch in zip(wheels, epochs):
        repro.normalize_wheel(wheel, epoch.seconds)
    assert wheels[0].read_bytes() == wheels[1].read_bytes()
    # the manifest's origin names the rule: a documented constant, not the tree's mtimes
    assert epochs[0] == repro.Epoch(repro.PLAIN_TREE_EPOCH, "plain tree: constant 1980-01-01")


# --------------------------------------------------------------------------- paths and Pythons


def test_ccache_sees_paths_relative_to_the_tree_and_a_profile_can_choose(tmp_path):
    env = path_independent({}, str(tmp_path / "tree"))
    assert env == {"CCACHE_BASEDIR": str(tmp_path / "tree"), "CCACHE_NOHASHDIR": "1"}
    # the tree's path never reaches the compiler's flags (PyTorch records them in the library)
    assert "CXXFLAGS" not in env and "CFLAGS" not in env
    assert path_independent({"CCACHE_BASEDIR": "/site"}, "/x")["CCACHE_BASEDIR"] == "/site"


def test_python_option():
    spec = resolve("cpu", ["python_version=3.13", 'python_versions=["3.13", "3.14"]'])
    assert pythons_option(spec, "") == ()
    assert pythons_option(spec, "all") == ("3.13", "3.14")
    assert pythons_option(spec, "3.14, 3.13,3.14") == ("3.14", "3.13")
    with pytest.raises(UsageError, match=r"3\.12 is not among the profile's Pythons \(3\.13, 3\.14\)"):
        pythons_option(spec, "3.13,3.12")
    with pytest.raises(UsageError):
        pythons_option(spec, ",")


def test_interpreter_for_a_version():
    here = "{}.{}".format(*sys.version_info[:2])
    assert interpreter("") == sys.executable and interpreter(here) == sys.executable
    with pytest.raises(ToolMissing, match=r"no Python 3\.99 here") as err:
        interpreter("3.99")
    assert "python_versions" in (err.value.hint or "")


def test_another_interpreter_is_asked_for_its_own_wheel_tools(tmp_path):
    (tmp_path / "setup.py").write_text("")
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(ToolMissing, match=r"venv/bin/python lacks setuptools"):
        check_wheel_tools(str(tmp_path), str(bare / "bin" / "python"))
    check_wheel_tools(str(tmp_path), sys.executable)  # this one has them (the test environment)
