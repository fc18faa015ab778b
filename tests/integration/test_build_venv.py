"""The native build on a bare login node (issue 30): a compiler and a Python, no cmake, no ninja,
no ccache (tests/bare_node.py). `invoke build` makes its build venv there from PyPI (cmake and
ninja wheels, the tree's requirements.txt), builds the fixture with them, says once that it
compiles without ccache, and a second build (a preflight) reuses the venv. Prints the venv's
creation time cold and reused and its size (-s)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from bare_node import build_bare_image, run_bare
from helpers import FIXTURES, SUITE, TEST_TORCH

from torchbuild.sif.host import remove_tree

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def bare(engine, local_base):
    """(engine, the bare node's tag, a work directory every uid can use); the image is removed
    afterwards."""
    work = Path(tempfile.mkdtemp(prefix="torchbuild-bare-"))
    work.chmod(0o777)
    tag = build_bare_image(engine, local_base, SUITE, work)
    try:
        yield engine, tag, work
    finally:
        if engine.client.images.list(tag):
            engine.client.images.remove(tag, force=True)
        remove_tree(work)


def _manifest(out: str, work: Path) -> dict:
    line = next(ln for ln in out.splitlines() if ln.startswith("manifest: "))
    return json.loads((work / Path(line.split(": ", 1)[1]).relative_to("/work")).read_text())


def test_a_bare_node_builds_in_a_venv_from_pypi_and_reuses_it(bare):
    engine, tag, work = bare
    tree = work / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    (tree / "requirements.txt").write_text("# the tree's own build requirements\ntyping-extensions>=4\n")
    sets = f"--set {TEST_TORCH} --set cache_dir=/work/cache --set patches=none --set local_version=bare"
    build = f"$TB build --source /work/minitorch --out /work/out {sets}"
    user = "0:0"  # the bind-mounted work directory is the caller's; the node's user is root here

    rc, out = run_bare(
        engine,
        tag,
        f"for t in cmake ninja ccache conda; do command -v $t && exit 3; done; {build}",
        {str(work): "/work"},
        user,
    )
    assert rc == 0, out[-4000:]
    # one line each: the venv made, and no ccache (no launcher, the build goes on)
    cold = re.search(r"^build venv: created in (\d+) s \((\S+): cmake 3\.\d+\.\d+, ninja [\d.]+\)$", out, re.M)
    assert cold, out[-3000:]
    assert out.count("no ccache on PATH: compiling without a compiler cache") == 1
    assert re.search(r"^ccache +not used \(none on PATH\)$", out, re.M), out[-1500:]
    m = _manifest(out, work)
    assert m["build_venv"]["created"] is True and m["build_venv"]["cmake"].startswith("3.")
    assert m["toolchain"]["cmake"].startswith("cmake version 3.") and m["toolchain"]["ccache"] == ""
    assert not [k for k in m["environment"] if k.endswith("_COMPILER_LAUNCHER")]
    assert m["environment"]["VIRTUAL_ENV"] == cold.group(2)
    assert len(list((work / "out").glob("minitorch-2.6.0+bare-*.whl"))) == 1
    assert "8 passed, 0 failed" in out  # verify ran on the node too (its ELF floor among the checks)

    # a second build (a preflight: cmake --build and ninja straight from the venv's bin) reuses it
    rc, again = run_bare(
        engine,
        tag,
        f"{build} --preflight --clean --canary csrc/ops.cpp && "
        f"{cold.group(2)}/bin/python -c 'import typing_extensions' && {cold.group(2)}/bin/cmake --version",
        {str(work): "/work"},
        user,
    )
    assert rc == 0, again[-4000:]
    assert re.search(r"^build venv: reused \(" + re.escape(cold.group(2)), again, re.M), again[-3000:]
    pre = _manifest(again, work)
    assert pre["build_venv"]["created"] is False and pre["build_venv"]["key"] == m["build_venv"]["key"]
    assert pre["preflight"]["canaries"][0]["file"] == "csrc/ops.cpp"

    venv = work / "cache" / "buildenv" / m["build_venv"]["key"]
    size = int(subprocess.run(["du", "-sk", str(venv.resolve())], capture_output=True, text=True).stdout.split()[0])
    print(
        f"\nbuild venv: cold {m['build_venv']['seconds']:.1f} s, reused {pre['build_venv']['seconds']:.1f} s, "
        f"{size / 1024:.0f} MiB ({venv.resolve().name}: cmake {m['build_venv']['cmake']}, "
        f"ninja {m['build_venv']['ninja']})"
    )
