"""invoke build without --in-container: the same build code on this machine (a login node).

Needs a host compiler, cmake, ninja and ccache (.ci/run installs them)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from helpers import FIXTURES, TREE_KINDS, fixture_tree, manifest_of, run_invoke, set_args

from torchbuild.steps import unitpeak

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("g++", "cmake", "ninja", "ccache")),
    reason="native builds need g++, cmake, ninja and ccache on PATH",
)


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", t, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    return t


@pytest.mark.parametrize("kind", TREE_KINDS)
def test_native_wheel_and_preflight_with_a_canary(kind, tmp_path):
    """The same on both shapes of the fixture: setup.py's, and PyTorch main's scikit-build-core
    pyproject.toml (configured by CMake as the backend would, built by pip wheel)."""
    tree = fixture_tree(tmp_path / "minitorch", kind)
    out, cache = tmp_path / "out", tmp_path / "cache"
    sets = set_args([f"cache_dir={cache}", "patches=none", "local_version=native"])
    # two small heavy units in their pool: build.ninja's for setup.py, CMake's for scikit-build-core
    heavy = set_args(["heavy_units=[build/heavy/*]", "env.MINITORCH_HEAVY=2", "env.MINITORCH_HEAVY_ENTRIES=200"])
    res = run_invoke("build", "--source", str(tree), "--out", str(out), *sets, *heavy)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    pool = {"setup.py": "heavy pool: 2 compiles at most", "scikit-build-core": "heavy pool: CMake job pool"}[kind]
    assert f"torchbuild: {pool}" in res.stdout, res.stdout[-3000:]
    assert "PYTORCH_BUILD_VERSION=2.6.0+native" in res.stdout and f"wheel build of {tree} ({kind})" in res.stdout
    (wheel,) = out.glob("minitorch-2.6.0+native-*.whl")
    manifest = json.loads((out / f"{wheel.name}.manifest.json").read_text())
    assert manifest["engine"] == "native" and "image" not in manifest
    assert manifest["environment"]["CCACHE_DIR"] == f"{cache}/ccache"
    # how close the build came to its cores' limit, from ninja's log and graph (issue 42 item 5)
    eff = manifest["report"]["efficiency"]
    assert eff["bound_s"] > 0 and eff["build_wall_s"] >= eff["ninja_wall_s"] > 0 and eff["chain_s"] > 0
    assert re.search(r"^efficiency: wall \d+ s = [\d.]+ x the lower bound", res.stdout, re.M), res.stdout[-2000:]
    # each real compile measured through ccache's prefix: the heaviest units, their peaks and times
    heaviest = manifest["report"]["heaviest"]
    assert heaviest and all(u["peak_rss_bytes"] > 1 << 20 and u["seconds"] > 0 for u in heaviest)
    peaks = [u["peak_rss_bytes"] for u in heaviest]
    assert len(heaviest) == 10 and peaks == sorted(peaks, reverse=True)
    assert any(u["file"].startswith(("csrc/", "build/kernels/")) for u in heaviest), heaviest  # relative to the tree
    report_text = (out / "logs" / manifest["report"]["text"]).read_text()
    assert "lower bound on" in report_text and "units with the highest peak memory" in report_text

    pre = run_invoke(
        "build", "--preflight", "--clean", "--canary", "csrc/ops.cpp", "--source", str(tree), "--out", str(out), *sets
    )
    assert pre.returncode == 0, pre.stdout[-3000:] + pre.stderr
    data = manifest_of(pre.stdout)
    (canary,) = data["preflight"]["canaries"]
    assert canary["file"] == "csrc/ops.cpp" and canary["seconds"] > 0 and canary["peak_rss_bytes"] > 1 << 20
    assert data["preflight"]["targets"] == ["c10"]
    # the canary was compiled for real although ccache held its object from the wheel build: its
    # peak is the compiler's (a cache hit's would be ccache's own, recorded for the next plans)
    units = unitpeak.read_record(str(tree / "build" / "torchbuild-units.tsv"), str(tree))
    assert "csrc/ops.cpp" in units, units
    # c10 was compiled by the wheel build before: --clean removed build/, ccache had it
    assert data["ccache"]["hits"] >= 1
    # the summary names the canary with its time and peak, and where the peaks went for the next plans
    assert re.search(r"^canary csrc/ops\.cpp +[\d.]+ s, peak \d+ MiB$", pre.stdout, re.M), pre.stdout[-1500:]
    assert "canary peaks recorded for the next plans: cxx" in pre.stdout


def test_unknown_canary_is_named(tree, tmp_path):
    res = run_invoke(
        "build",
        "--preflight",
        "--canary",
        "csrc/nope.cpp",
        "--source",
        str(tree),
        "--out",
        str(tmp_path / "o"),
        *set_args([f"cache_dir={tmp_path / 'c'}", "patches=none"]),
    )
    assert res.returncode == 10 and "canary csrc/nope.cpp" in res.stderr
