"""The pre-generated flatbuffers header made again for a system flatbuffers (builder/flatbuf.py):
Debian's de-vendored PyTorch 2.6 stopped at its static_assert an hour into the real build."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from torchbuild.builder import flatbuf
from torchbuild.core.errors import ToolMissing

SCHEMA = "namespace torch.jit.mobile.serialization;\ntable Module { bytecode_version:uint; }\nroot_type Module;\n"


def pinned_header(major: int, minor: int, rev: int) -> str:
    return (
        '#include "flatbuffers/flatbuffers.h"\n'
        f"static_assert(FLATBUFFERS_VERSION_MAJOR == {major} &&\n"
        f"              FLATBUFFERS_VERSION_MINOR == {minor} &&\n"
        f"              FLATBUFFERS_VERSION_REVISION == {rev},\n"
        '             "Non-compatible flatbuffers version included");\n'
    )


def tree(tmp_path: Path, pinned: tuple[int, int, int] = (23, 3, 3)) -> Path:
    src = tmp_path / "pytorch"
    (src / flatbuf.SCHEMA.parent).mkdir(parents=True)
    (src / flatbuf.SCHEMA).write_text(SCHEMA)
    (src / flatbuf.GENERATED).write_text(pinned_header(*pinned))
    return src


def include_dir(tmp_path: Path, version: tuple[int, int, int]) -> Path:
    inc = tmp_path / "include"
    (inc / "flatbuffers").mkdir(parents=True)
    names = ("MAJOR", "MINOR", "REVISION")
    (inc / "flatbuffers" / "base.h").write_text(
        "".join(f"#define FLATBUFFERS_VERSION_{n} {v}\n" for n, v in zip(names, version))
    )
    return inc


def test_mismatch_without_flatc_is_refused_before_configure(tmp_path: Path) -> None:
    src, inc = tree(tmp_path), include_dir(tmp_path, (23, 5, 26))
    with pytest.raises(ToolMissing) as err:
        flatbuf.regenerate(str(src), {"PATH": str(tmp_path / "empty")}, dirs=[inc])
    assert "23.3.3" in err.value.message and "23.5.26" in err.value.message
    assert "flatbuffers-compiler" in err.value.hint
    assert (src / flatbuf.GENERATED).read_text() == pinned_header(23, 3, 3)  # left as it was


def test_flatc_of_another_version_is_refused(tmp_path: Path) -> None:
    src, inc = tree(tmp_path), include_dir(tmp_path, (23, 5, 26))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "flatc"
    fake.write_text("#!/bin/sh\necho 'flatc version 22.9.24'\n")
    fake.chmod(0o755)
    with pytest.raises(ToolMissing, match=r"22\.9\.24"):
        flatbuf.regenerate(str(src), {"PATH": str(bin_dir)}, dirs=[inc])


@pytest.mark.parametrize("case", ["matching", "vendored", "no-header", "no-schema"])
def test_nothing_to_do(tmp_path: Path, case: str) -> None:
    src = tree(tmp_path)
    inc = include_dir(tmp_path, (23, 3, 3) if case == "matching" else (24, 3, 25))
    if case == "vendored":
        (src / flatbuf.VENDORED).parent.mkdir(parents=True)
        (src / flatbuf.VENDORED).write_text("#define FLATBUFFERS_VERSION_MAJOR 23\n")
    if case == "no-schema":
        (src / flatbuf.SCHEMA).unlink()
    dirs = [] if case == "no-header" else [inc]
    assert flatbuf.regenerate(str(src), {"PATH": str(tmp_path / "empty")}, dirs=dirs) is None
    assert (src / flatbuf.GENERATED).read_text() == pinned_header(23, 3, 3)


def test_include_dirs_follow_the_build_environment(tmp_path: Path) -> None:
    env = {"CPATH": f"/a{os.pathsep}/b", "CMAKE_PREFIX_PATH": "/c", "CONDA_PREFIX": "/d"}
    got = [str(p) for p in flatbuf.include_dirs(env)]
    assert got == ["/a", "/b", "/c/include", "/d/include", "/usr/local/include", "/usr/include"]


@pytest.mark.skipif(
    not (shutil.which("flatc") and Path("/usr/include/flatbuffers/base.h").is_file()),
    reason="needs flatc and the flatbuffers headers (.ci/run installs both)",
)
def test_real_flatc_regenerates_a_header_that_compiles(tmp_path: Path) -> None:
    """The host's flatc and headers: the regenerated header passes its static_assert in g++."""
    src = tree(tmp_path)
    line = flatbuf.regenerate(str(src), dict(os.environ), dirs=[Path("/usr/include")])
    have = flatbuf.header_version(Path("/usr/include/flatbuffers/base.h"))
    assert line is not None and ".".join(map(str, have or ())) in line
    assert flatbuf.pinned_version(src / flatbuf.GENERATED) == have
    main = tmp_path / "main.cpp"
    main.write_text(f'#include "{src / flatbuf.GENERATED}"\nint main() {{ return 0; }}\n')
    cc = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", str(main)], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    # a second run (a resumed build) has nothing to do
    assert flatbuf.regenerate(str(src), dict(os.environ), dirs=[Path("/usr/include")]) is None
