"""Apptainer SIFs from toolchain images: real Apptainer 1.4 in the apptainer-builder container
(this host has no Apptainer of its own), real Docker engine. A second conversion with
--compression zstd is tests/slow/test_sif_zstd.py; the real PyTorch 2.6 preflight in a SIF is
tests/slow/test_sif_preflight.py."""

from __future__ import annotations

import io
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
from helpers import FIXTURES, REPO, TEST_TORCH, manifest_of, run_invoke, set_args

from torchbuild import __version__
from torchbuild.profile.config import cache_dir
from torchbuild.runtime.apptainer import DockerApptainer
from torchbuild.sif.host import builder_tag

pytestmark = [pytest.mark.docker, pytest.mark.apptainer]


def run_containers(engine):
    """torchbuild's containers from the apptainer-builder image (other work on the same engine
    may have its own toolchain containers running)."""
    filters = {"label": "org.torchbuild.run=1", "ancestor": builder_tag()}
    return engine.client.containers.list(all=True, filters=filters)


def first_output_line(output: str, text: str) -> str:
    return next(line for line in output.splitlines() if text in line)


def converting(engine) -> bool:
    """An `apptainer build --force` container is running (not the short `build --help` probe)."""
    for c in run_containers(engine):
        command = " ".join(c.attrs.get("Args") or []) or str(c.attrs.get("Command", ""))
        if "build --force" in command:
            return True
    return False


def call(apptainer: DockerApptainer, args: list[str], paths: list[Path], command: tuple[str, ...] = ("apptainer",)):
    buf = io.StringIO()
    rc = apptainer.call(args, paths=paths, out=buf, command=command)
    return rc, buf.getvalue()


def squashfs_compression(apptainer: DockerApptainer, sif: Path) -> list[str]:
    """The compression lines of `unsquashfs -s` on the SIF's squashfs partition, e.g.
    ["Compression gzip", "compression-level 6"], as a user would check it."""
    rc, listing = call(apptainer, ["sif", "list", str(sif)], [sif.parent])
    row = next(line for line in listing.splitlines() if "Squashfs" in line)
    offset = row.split("|")[3].split("-")[0].strip()  # SIF POSITION (start-end)
    rc, text = call(apptainer, ["-s", "-o", offset, str(sif)], [sif.parent], command=("unsquashfs",))
    assert rc == 0, text
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("Compression "))
    return [lines[start], *(line for line in lines[start + 1 : start + 4] if line.startswith("compression-level"))]


def test_sif_runs_python_and_torchbuild(engine, cpu_sif):
    _spec, sif, first, apptainer, _ = cpu_sif
    assert sif.is_file() and "written in" in first
    # the default profile's SIF is also torch-build.sif (the same file, not a copy)
    assert (sif.parent / "torch-build.sif").stat().st_ino == sif.stat().st_ino
    assert not list(sif.parent.glob(".*partial*")), "a partial SIF was left behind"
    rc, text = call(apptainer, ["exec", "--userns", str(sif), "python3", "--version"], [sif.parent])
    assert rc == 0 and re.search(r"^Python 3\.13\.\d+$", text, re.M), text
    rc, text = call(apptainer, ["exec", "--userns", str(sif), "torchbuild", "--version"], [sif.parent])
    assert rc == 0 and f"torchbuild {__version__}" in text, text
    # the runscript is the torchbuild CLI, and its help explains the binds
    rc, text = call(apptainer, ["run", "--userns", str(sif), "--help"], [sif.parent])
    assert rc == 0 and "SRC:/src,CACHE:/cache" in text and "--nv" in text, text
    # no builder container outlives its command
    assert not run_containers(engine)


def test_sif_carries_profile_environment_and_labels(engine, cpu_sif):
    spec, sif, _, apptainer, _ = cpu_sif
    labels = apptainer.labels(sif)
    image = engine.image_attrs(spec.image_tag)
    assert labels["org.torchbuild.sif.image-id"] == image["Id"] and labels["org.torchbuild.sif.route"] == "image"
    assert labels["org.torchbuild.profile-hash"] == image["Config"]["Labels"]["org.torchbuild.profile-hash"]
    assert labels["org.torchbuild.sif.profile-hash"] == spec.hash
    assert labels["org.torchbuild.version"] == __version__
    # the default compression: gzip (every Apptainer and Singularity runs it) at level 6, not
    # mksquashfs's slow level 9 and not zstd (which Apptainer before 1.4 cannot open)
    assert labels["org.torchbuild.sif.compression"] == "gzip:6"
    assert squashfs_compression(apptainer, sif) == ["Compression gzip", "compression-level 6"]
    assert "(gzip:6)" in first_output_line(cpu_sif[2], "written in")
    # %environment: the profile's build environment, even under --cleanenv
    rc, text = call(apptainer, ["exec", "--userns", "--cleanenv", str(sif), "env"], [sif.parent])
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert env["TORCHBUILD_PROFILE"] == "/opt/torchbuild/profiles/cpu.yaml"
    assert env["USE_CUDA"] == "0" and env["BLAS"] == "OpenBLAS" and env["CCACHE_DIR"] == "/cache/ccache"
    # the baked profile resolves to the very profile the image was made from
    rc, text = call(apptainer, ["run", "--userns", str(sif), "config", "--format", "json"], [sif.parent])
    assert rc == 0, text
    data = json.loads(text[text.index("{") :])
    assert data["profile"] == "cpu" and data["hash"] == spec.hash


def test_sif_rerun_is_a_cache_hit(cpu_sif, site_overrides):
    _spec, sif, _, _, sets = cpu_sif
    before = sif.stat().st_mtime_ns
    res = run_invoke("sif", "--profile", "cpu", "--arch", "x86_64", "--out", str(sif.parent), *set_args(sets))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "up to date" in res.stdout and sif.stat().st_mtime_ns == before


def test_sif_interrupted_leaves_the_old_sif_and_no_container(engine, cpu_sif):
    """Ctrl-C while Apptainer converts: exit 130, the builder container is gone, no partial file,
    and the SIF from before is untouched."""
    spec, sif, _, _, sets = cpu_sif
    before = sif.stat().st_mtime_ns
    args = ["sif", "--profile", "cpu", "--arch", "x86_64", "--out", str(sif.parent), "--rebuild", *set_args(sets)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not converting(engine):  # the conversion container starts after the OCI layout is written
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the conversion never started"
            time.sleep(0.5)
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "BuildInterrupted" in stderr, stdout[-2000:] + stderr
    assert not run_containers(engine)
    assert not list(sif.parent.glob(".*partial*")), list(sif.parent.iterdir())
    assert sif.stat().st_mtime_ns == before
    assert not list((cache_dir(spec) / "apptainer" / "work").iterdir()), (
        "the OCI layout or Apptainer's temp files were left behind"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_sif_refuses_when_space_is_short(cpu_sif, tmp_path):
    """A cache on a 64 MiB file system cannot hold the conversion: refused up front, nothing written."""
    _spec, _sif, _, _, sets = cpu_sif
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        res = run_invoke(
            "sif",
            "--profile",
            "cpu",
            "--arch",
            "x86_64",
            "--out",
            str(small / "out"),
            "--rebuild",
            *set_args([TEST_TORCH, *sets, f"cache_dir={small / 'cache'}"]),
        )
        assert res.returncode == 12 and "InsufficientSpace" in res.stderr, res.stdout + res.stderr
        assert "GiB free on the file system of" in res.stderr
        assert list(small.iterdir()) == [], "the refused conversion wrote something"
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_sif_builds_and_verifies_the_fixture_wheel(engine, cpu_sif, tmp_path):
    """`invoke build --in-container --engine apptainer`: the wheel is built by the SIF's runscript
    and then verified in the SIF."""
    _, sif, _, _, sets = cpu_sif
    tree = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    out = tmp_path / "out"
    res = run_invoke(
        "build", "--in-container", "--engine", "apptainer", "--apptainer", "docker", "--sif", str(sif),
        "--profile", "cpu", "--arch", "x86_64", "--source", str(tree), "--out", str(out),
        *set_args([TEST_TORCH, *sets, f"cache_dir={tmp_path / 'cache'}", "patches=none", "local_version=tbsif"]),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    m = manifest_of(res.stdout)
    assert m["engine"] == "apptainer" and m["wheel"]["name"].startswith("minitorch-2.6.0+tbsif-cp313")
    verified = json.loads((out / f"{m['wheel']['name']}.verify.json").read_text())
    assert verified["ok"] and verified["python"].startswith("3.13"), verified
    assert not run_containers(engine)
