"""invoke build --in-container on a real engine: the fixture wheel end to end, Ctrl-C, and a
preflight of the real PyTorch 2.6 source."""

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
from helpers import FIXTURES, REPO, image_ok, preflight_ok, run_invoke, set_args

from torchbuild.inputs.source import sha256_file

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
def workspace(tmp_path):
    """A copy of the fixture project, an output dir and a cache dir, all owned by OTHER_UID."""
    tree = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
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
        *set_args([*overrides, f"cache_dir={cache}", "patches=none", "local_version=tbtest"]),
        *extra,
    ]


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


@pytest.mark.slow
def test_real_pytorch_preflight_and_ccache_reuse(engine, local_base, site_certs, debian_dsc, tmp_path):
    """Debian's de-vendored PyTorch 2.6: configure + c10 in a tool-built image, twice; the second
    time in a fresh tree (--clean) with the ccache warm and CMake's probe results of the first."""
    profile = str(FIXTURES / "profiles" / "debian-pytorch-2.6.yaml")
    sets = set_args([f"base_image={local_base}", *site_certs, f"cache_dir={tmp_path / 'cache'}"])
    image_ok(profile, sets)
    first_out, m1 = preflight_ok(profile, debian_dsc, tmp_path / "out", sets)
    assert "USE_SYSTEM_LIBS=ON" in first_out
    assert m1["preflight"]["targets"] == ["c10"]
    tree = Path(m1["source"]["path"])
    assert list((tree / "build" / "lib").glob("libc10.so*"))
    assert m1["source"]["kind"] == "dsc" and len(m1["source"]["sha256"]) == 64
    # the shipped CUDA-aware MPI series (2.6 reuses 2.4's) was applied to the real source
    assert m1["patches"]["applied_now"] == ["01-cuda-aware-mpi-fallback.patch"]
    assert "MPICH_GPU_SUPPORT_ENABLED" in (tree / "torch/csrc/distributed/c10d/ProcessGroupMPI.cpp").read_text()
    # the first configure ran CMake's probes and saved their results for the next fresh tree
    ran = re.search(r"CMake checks: none seeded \(none saved .*\), (\d+) probes ran", first_out)
    saved = re.search(r"CMake checks: saved (\d+) for the next fresh tree: /cache/cmake-checks/\w+\.json", first_out)
    assert ran and saved and int(ran[1]) >= 30 and int(saved[1]) >= 30, first_out[-5000:]
    # ATen's code generation (3 dry runs in the configure, 3 runs before c10) ran and was saved
    assert first_out.count("torchbuild: code generation saved (torchgen.gen") == 6, first_out[-5000:]
    first = configure_result(tree / "build")

    second_out, m2 = preflight_ok(profile, debian_dsc, tmp_path / "out", sets, "--clean")
    # the fresh tree started from them: no probe ran again, and CMake decided the same
    assert f"CMake checks: {saved[1]} seeded, 0 probes ran" in second_out, second_out[-5000:]
    assert configure_result(tree / "build") == first
    # and none of it ran again: all six restored from /cache/codegen
    assert second_out.count("torchbuild: code generation reused (torchgen.gen") == 6, second_out[-5000:]
    assert "code generation saved" not in second_out
    assert m2["patches"]["already_applied"] == ["01-cuda-aware-mpi-fallback.patch"]
    assert m2["patches"]["applied_now"] == []
    assert m2["ccache"]["hit_rate"] >= 0.90, m2["ccache"]
    assert re.search(r"^ccache hit rate +\d+% \(\d+ hits", second_out, re.M), second_out[-2000:]
