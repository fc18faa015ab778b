"""invoke build --in-container on a real engine: the fixture wheel end to end, Ctrl-C, and a
preflight of the fixture twice (patches, CMake's probe results and ccache reused by a fresh tree).
The same preflight of the real PyTorch 2.6 source (with ATen's code generation reused) is
tests/slow/test_real_preflight.py (about 7 minutes with its image)."""

from __future__ import annotations

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
from helpers import FIXTURES, REPO, TEST_TORCH, TREE_KINDS, fixture_tree, preflight_ok, run_invoke, set_args

from torchbuild.core.safeio import sha256_file

pytestmark = pytest.mark.docker

OTHER_UID = 4242  # a non-root caller, so ownership checks mean something when CI runs as root


def run_containers(engine):
    return engine.client.containers.list(all=True, filters={"label": "org.torchbuild.run=1"})


def _runs(container, command: str) -> bool:
    """True when a process in the container has this command line (docker top)."""
    try:
        procs = container.top()["Processes"] or []
    except Exception:  # the container may stop between list and top
        return False
    return any(command in " ".join(p) for p in procs)


@pytest.fixture
def workspace(tmp_path, request):
    """A copy of the fixture project (setup.py's shape unless parametrised with a kind of tree:
    helpers.TREE_KINDS), an output dir and a cache dir, all owned by OTHER_UID."""
    tree = fixture_tree(tmp_path / "minitorch", getattr(request, "param", "setup.py"))
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    cache.mkdir()
    for root in (tree, out, cache):
        for p in [root, *root.rglob("*")]:
            os.chown(p, OTHER_UID, OTHER_UID)
    return tree, out, cache


def build_args(tree, out, cache, overrides, *extra):
    return [
        "build",
        "--in-container",
        "--profile",
        "cpu",
        "--arch",
        "x86_64",
        "--source",
        str(tree),
        "--out",
        str(out),
        "--user",
        f"{OTHER_UID}:{OTHER_UID}",
        *set_args([TEST_TORCH, *overrides, f"cache_dir={cache}", "patches=none", "local_version=tbtest"]),
        *extra,
    ]


@pytest.mark.parametrize("workspace", TREE_KINDS, indirect=True)
def test_fixture_wheel_end_to_end(engine, cpu_image, site_overrides, workspace):
    spec, _ = cpu_image
    tree, out, cache = workspace
    before = {c.id for c in run_containers(engine)}
    res = run_invoke(*build_args(tree, out, cache, site_overrides))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    # the environment is printed at the start of the build
    assert "PYTORCH_BUILD_VERSION=2.6.0+tbtest" in res.stdout and "CMAKE_CXX_COMPILER_LAUNCHER=ccache" in res.stdout
    wheels = list(out.glob("*.whl"))
    assert [w.name for w in wheels] == [
        f"minitorch-2.6.0+tbtest-cp{spec.python_version.replace('.', '')}-"
        f"cp{spec.python_version.replace('.', '')}-linux_x86_64.whl"
    ]
    wheel = wheels[0]
    manifest = json.loads((out / f"{wheel.name}.manifest.json").read_text())
    assert manifest["wheel"] == {"name": wheel.name, "sha256": sha256_file(wheel), "size": wheel.stat().st_size}
    assert manifest["source"]["kind"] == "dir" and manifest["source"]["path"] == str(tree)
    assert manifest["image"]["tag"] == spec.image_tag
    assert manifest["image"]["id"] == engine.image_attrs(spec.image_tag)["Id"]
    assert manifest["toolchain"]["python"].startswith(spec.python_version)
    assert manifest["toolchain"]["cxx"].startswith("g++")
    assert manifest["environment"]["USE_GLOO"] == "1"
    assert manifest["resolved_profile"]["local_version"] == "tbtest"
    assert manifest["started"] <= manifest["finished"]
    assert (out / "logs" / manifest["log"]).is_file()
    # `invoke build` verified the wheel in the image afterwards
    verified = json.loads((out / f"{wheel.name}.verify.json").read_text())
    assert verified["ok"] and {c["name"] for c in verified["checks"]} >= {"platform tag", "import minitorch"}
    # nothing the build wrote belongs to anyone but the caller
    for root in (out, tree, cache):
        strangers = [p for p in [root, *root.rglob("*")] if p.lstat().st_uid != OTHER_UID]
        assert strangers == [], strangers[:5]
    assert not list(out.glob(".partial-*"))
    # the wheel installs and imports in the image, with the switches compiled in
    script = (
        "python -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index /out/*.whl && "
        "/tmp/v/bin/python -c 'import json, minitorch; "
        "print(json.dumps([minitorch.__version__, minitorch.add(2, 3), minitorch.config()]))'"
    )
    raw = engine.client.containers.run(
        spec.image_tag, ["bash", "-c", script], volumes={str(out): {"bind": "/out", "mode": "ro"}}, remove=True
    )
    version, total, config = json.loads(raw.decode().strip().splitlines()[-1])
    assert version == "2.6.0+tbtest" and total == 5.0
    assert (config["USE_GLOO"], config["USE_MPI"], config["USE_CUDA"]) == ("1", "0", "0")
    assert {c.id for c in run_containers(engine)} == before


def test_sigint_removes_the_container_and_leaves_no_wheel(engine, cpu_image, site_overrides, workspace):
    tree, out, cache = workspace
    before = {c.id for c in run_containers(engine)}
    args = build_args(tree, out, cache, [*site_overrides, "env.MINITORCH_SLOW_SECONDS=300"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # wait until the build sits in its slow step
            running = [c for c in run_containers(engine) if c.id not in before]
            if running and running[0].status == "running" and _runs(running[0], "sleep 300"):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(1)
        else:
            pytest.fail("the build never reached its slow step")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            for c in run_containers(engine):
                if c.id not in before:
                    c.remove(force=True)
    assert proc.returncode == 130, stdout[-2000:] + stderr
    assert "BuildInterrupted" in stderr
    assert {c.id for c in run_containers(engine)} == before
    assert not list(out.glob("*.whl")) and not list(out.glob(".partial-*"))


def test_missing_image_is_named(engine, site_overrides, workspace):
    tree, out, cache = workspace
    res = run_invoke(*build_args(tree, out, cache, [*site_overrides, "image_name=torchbuild/nothing-here"]))
    assert res.returncode == 7 and "ImageNotFound" in res.stderr and "invoke image" in res.stderr


def configure_result(build: Path) -> tuple[list[str], str]:
    """What a configure decided: CMakeCache.txt's entries (not its comments) and build.ninja."""
    text = (build / "CMakeCache.txt").read_text()
    entries = sorted(ln for ln in text.splitlines() if ln and not ln.startswith(("#", "//")))
    return entries, sha256_file(build / "build.ninja")


def patch_series(tree: Path, directory: Path) -> Path:
    """A one-patch series for the fixture tree: csrc/ops.cpp gains a last line `// patched`."""
    directory.mkdir()
    ops = (tree / "csrc" / "ops.cpp").read_text().splitlines(keepends=True)
    patch = ["--- a/csrc/ops.cpp\n", "+++ b/csrc/ops.cpp\n", f"@@ -1,{len(ops)} +1,{len(ops) + 1} @@\n"]
    (directory / "01-mark.patch").write_text("".join([*patch, *(" " + line for line in ops), "+// patched\n"]))
    return directory


def test_preflight_twice_reuses_probes_and_ccache_in_a_fresh_tree(cpu_image, site_overrides, tmp_path):
    """The fixture's preflight in the cpu image with its CMake probes on (MINITORCH_PROBES), a
    patch series and a canary; then again with --clean: the fresh tree starts from the probe
    results the first configure saved (no probe runs, CMake decides the same), the series is
    found applied and ccache has every object."""
    tree = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    series = patch_series(tree, tmp_path / "series")
    sets = set_args(
        [TEST_TORCH, *site_overrides, f"cache_dir={tmp_path / 'cache'}", f"patches={series}", "env.MINITORCH_PROBES=1"]
    )
    extra = ("--arch", "x86_64", "--canary", "csrc/ops.cpp")
    first_out, m1 = preflight_ok("cpu", tree, tmp_path / "out", sets, *extra)
    assert m1["preflight"]["targets"] == ["c10"] and (tree / "build" / "libc10.a").is_file()
    assert m1["source"]["kind"] == "dir" and m1["engine"] == "docker"
    (canary,) = m1["preflight"]["canaries"]
    assert canary["file"] == "csrc/ops.cpp" and canary["seconds"] > 0, canary
    assert m1["patches"]["applied_now"] == ["01-mark.patch"]
    assert (tree / "csrc" / "ops.cpp").read_text().endswith("// patched\n")
    # the first configure ran the probes and saved their results for the next fresh tree
    ran = re.search(r"CMake checks: none seeded \(none saved .*\), (\d+) probes ran", first_out)
    saved = re.search(r"CMake checks: saved (\d+) for the next fresh tree: /cache/cmake-checks/\w+\.json", first_out)
    assert ran and saved and int(ran[1]) >= 3 and int(saved[1]) >= 3, first_out[-5000:]
    first = configure_result(tree / "build")

    second_out, m2 = preflight_ok("cpu", tree, tmp_path / "out", sets, *extra, "--clean")
    assert f"CMake checks: {saved[1]} seeded, 0 probes ran" in second_out, second_out[-5000:]
    assert configure_result(tree / "build") == first
    assert m2["patches"]["already_applied"] == ["01-mark.patch"] and m2["patches"]["applied_now"] == []
    assert m2["ccache"]["hit_rate"] >= 0.90, m2["ccache"]
    assert re.search(r"^ccache hit rate +\d+% \(\d+ hits", second_out, re.M), second_out[-2000:]
