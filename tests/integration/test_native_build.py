"""invoke build without --in-container: the same build code on this machine (a login node).

Needs a host compiler, cmake, ninja and ccache (.ci/run installs them)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, TEST_TORCH, TREE_KINDS, fixture_tree, manifest_of, run_invoke, set_args

from torchbuild.builder import unitpeak

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
    sets = set_args([TEST_TORCH, f"cache_dir={cache}", "patches=none", "local_version=native"])
    # two small heavy units in their pool: build.ninja's for setup.py, CMake's for scikit-build-core
    heavy = set_args(
        [TEST_TORCH, "heavy_units=[build/heavy/*]", "env.MINITORCH_HEAVY=2", "env.MINITORCH_HEAVY_ENTRIES=200"]
    )
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
        *set_args([TEST_TORCH, f"cache_dir={tmp_path / 'c'}", "patches=none"]),
    )
    assert res.returncode == 10 and "canary csrc/nope.cpp" in res.stderr


def _kill_tree(pid: int) -> None:
    """SIGKILL pid and all its descendants (the build runs its compile in a session of its own,
    which a kill of the first process group would leave running), stopped first so none forks."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)


def test_a_build_cut_off_and_run_again_is_one_build_over_two_runs(tree, tmp_path):
    """A hard cut (the whole process group killed, as a node that goes away) in the middle of
    ninja, then the same command again: the wheel is made, no step that finished before the cut
    runs again, and the report gives each run and the whole build's wall over its lower bound
    (issue 42, items 2 and 5)."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    sets = set_args(
        [TEST_TORCH, f"cache_dir={cache}", "patches=none", "env.MINITORCH_SLOW_UNITS=6", "env.MINITORCH_UNIT_SECONDS=3"]
    )
    args = [sys.executable, "-m", "invoke", "build", "--source", str(tree), "--out", str(out), *sets]
    ninja_log = tree / "build" / ".ninja_log"
    first = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while not (ninja_log.is_file() and "slow/unit_" in ninja_log.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "the first run ended before any slow step"
            time.sleep(0.5)
    finally:
        _kill_tree(first.pid)  # every process of the run at once, as a node that goes away
        first.wait()
    assert not list(out.glob("*.whl"))  # no wheel, whole or partial, in out/
    left = [p.name for p in out.glob(".partial-*")]  # what a SIGKILL leaves: the run's own staging
    res = run_invoke("build", "--source", str(tree), "--out", str(out), *sets)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert not list(out.glob(".partial-*")) and all(f"torchbuild: removed {name}," in res.stdout for name in left)
    logged = [ln.split("\t")[3] for ln in ninja_log.read_text().splitlines()[1:]]
    done = [o for o in logged if "slow/unit_" in o and not o.startswith("/")]
    assert len(done) == len(set(done)) == 6, done  # each slow step ran to its end once
    eff = manifest_of(res.stdout)["report"]["efficiency"]
    assert eff["runs"] == 2 and eff["build_wall_s"] > eff["ninja_wall_s"] > 0 and eff["bound_s"] > 0, eff
    # each run's ninja time found: two jobs cannot do the work in less than half of it
    assert eff["ninja_wall_s"] >= eff["work_s"] * 0.99, eff
    assert re.search(
        r"^efficiency: wall \d+ s = [\d.]+ x the lower bound .*, over the build's 2 runs$", res.stdout, re.M
    )
    report_text = (out / "logs" / manifest_of(res.stdout)["report"]["text"]).read_text()
    assert "this build was made in 2 runs" in report_text and re.search(
        r"^ *run 2 +\d+ s +[1-9]\d* s", report_text, re.M
    )


def test_a_second_run_while_a_killed_runs_compile_goes_on_is_refused_by_name(tree, tmp_path):
    """Only torchbuild killed (SIGKILL), its pip and ninja left running in their own session: the
    same command again is TreeBusy (exit 33) naming the process, not a second ninja in the tree;
    once they are done, the same command finishes the build without compiling a step again."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    sets = set_args(
        [TEST_TORCH, f"cache_dir={cache}", "patches=none", "env.MINITORCH_SLOW_UNITS=4", "env.MINITORCH_UNIT_SECONDS=3"]
    )
    args = [sys.executable, "-m", "invoke", "build", "--source", str(tree), "--out", str(out), *sets]
    ninja_log = tree / "build" / ".ninja_log"
    first = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (ninja_log.is_file() and "slow/unit_" in ninja_log.read_text()):
        assert first.poll() is None and time.monotonic() < deadline, "the first run ended before any slow step"
        time.sleep(0.5)
    first.kill()
    first.wait()
    busy = run_invoke("build", "--source", str(tree), "--out", str(out), *sets)
    assert busy.returncode == 33, busy.stdout[-2000:] + busy.stderr
    assert re.search(
        rf"another build is running in {re.escape(str(tree))}: process \d+ \(.*pip", busy.stdout + busy.stderr
    )
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:  # the orphans end: the tree is free again
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)
    res = run_invoke("build", "--source", str(tree), "--out", str(out), *sets)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    logged = [ln.split("\t")[3] for ln in ninja_log.read_text().splitlines()[1:]]
    done = [o for o in logged if "slow/unit_" in o and not o.startswith("/")]
    assert len(done) == len(set(done)) == 4, done
    assert len(list(out.glob("minitorch-*.whl"))) == 1 and not list(out.glob(".partial-*"))
