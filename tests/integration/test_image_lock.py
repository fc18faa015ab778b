"""Several Pythons in one toolchain image, locked images and the installed list, on a real
engine: the sid-pythons image (Python 3.13 and 3.14 from Debian sid), `invoke image --lock`
and a rebuild from the lock that installs the very same packages, a lock that no longer
installs (LockError, exit 28), and the installed list a build in the image records in its
manifest."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from helpers import FIXTURES, preflight_ok, run_invoke, set_args

from torchbuild.inputs import lock as lk
from torchbuild.inputs.image import read_image_files

pytestmark = pytest.mark.docker

SID_PYTHONS = str(FIXTURES / "profiles" / "sid-pythons.yaml")  # as conftest's sid_pythons_image
# the locked image gets its own tag, so the shared sid-pythons image stays as the fixture made it
LOCKED_NAME = "torchbuild-test/locked"


def run_in(engine, tag: str, *cmd: str) -> str:
    out = engine.client.containers.run(tag, list(cmd), remove=True, stdout=True, stderr=True)
    return out.decode().strip()


def installed(engine, tag: str) -> list[str]:
    return read_image_files(engine, tag, [lk.INSTALLED_LIST])["installed.txt"].decode().splitlines()


def _cached_step(stdout: str, step: str) -> bool:
    """True when the docker build output shows step taken from the layer cache."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    at = next(i for i, line in enumerate(lines) if step in line)
    return lines[at + 1] == "---> Using cache"


def test_each_python_has_its_venv_with_the_requirements(engine, sid_pythons_image):
    spec, _ = sid_pythons_image
    tag = spec.image_tag
    script = "import setuptools, wheel, pybind11, sys; print(sys.prefix, '%d.%d' % sys.version_info[:2])"
    assert run_in(engine, tag, "python3", "-c", script) == "/opt/venv 3.13"  # the primary, on PATH
    assert run_in(engine, tag, "/opt/venv-3.14/bin/python", "-c", script) == "/opt/venv-3.14 3.14"
    labels = engine.image_attrs(tag)["Config"]["Labels"]
    assert json.loads(labels["org.torchbuild.python-versions"]) == ["3.14"]
    assert labels["org.torchbuild.locked"] == "false" and "org.torchbuild.lock-sha256" not in labels
    listed = installed(engine, tag)
    assert listed == lk.canonical_list(listed)
    for venv in ("/opt/venv", "/opt/venv-3.14"):
        assert any(line.startswith(f"pip {venv} setuptools==") for line in listed), venv
    assert any(line.startswith("dpkg python3.14-venv=") for line in listed)


@pytest.mark.slow  # about 2.5 min: the image is built again from the lock (apt and pip, no cache)
def test_lock_round_trip_installs_the_same_packages(engine, sid_pythons_image, tmp_path):
    spec, sets = sid_pythons_image
    lock_file = tmp_path / "sid-pythons.x86_64.lock"
    args = ["image", "--profile", SID_PYTHONS, "--arch", "x86_64", *set_args([*sets, f"image_name={LOCKED_NAME}"])]
    locked_tag = spec.image_tag.replace(spec.image_name, LOCKED_NAME)
    try:
        res = run_invoke(*args, "--lock", "--lock-file", str(lock_file))
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr
        assert "both images list the same packages" in res.stdout
        lock, sha256 = lk.read(lock_file)
        apt, pip = lock.counts()
        assert apt > 50 and list(lock.pip) == ["3.13", "3.14"] and pip > 10
        assert any(p.startswith("python3.14-venv=") for p in lock.apt)
        labels = engine.image_attrs(locked_tag)["Config"]["Labels"]
        assert labels["org.torchbuild.locked"] == "true" and labels["org.torchbuild.lock-sha256"] == sha256
        # what the lock installed is what the unlocked image has, to the version
        assert installed(engine, locked_tag) == installed(engine, spec.image_tag)
        # the lock travels into the image: the lists it installed and which file they came from
        shown = run_in(engine, locked_tag, "cat", "/opt/torchbuild/inputs/lock/lock.sha256")
        assert shown == f"{sha256}  {lock_file.name}"
        # present, the lock is used: a cache hit (or, where torchbuild's source changed meanwhile,
        # the apt and pip layers from Docker's cache: the lock is the same input)
        again = run_invoke(*args, "--lock-file", str(lock_file))
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr
        assert "up to date (cache hit)" in again.stdout or _cached_step(again.stdout, "RUN mapfile -t pythons")

        # a pinned version the archive does not have: the named error, with the refresh command
        stale = tmp_path / "stale.lock"
        text = lock_file.read_text()
        cmake = next(line for line in text.splitlines() if line.startswith("- cmake="))
        stale.write_text(text.replace(cmake, "- cmake=9.9.9-1"))
        res = run_invoke(*args, "--lock-file", str(stale))
        assert res.returncode == 28, res.stdout[-3000:] + res.stderr
        assert "LockError" in res.stderr and "no longer installs: the locked apt packages did not install" in res.stderr
        assert "Version '9.9.9-1' for 'cmake' was not found" in res.stderr
        assert f"--lock --rebuild --lock-file {stale}" in res.stderr
        assert engine.image_attrs(locked_tag)["Config"]["Labels"]["org.torchbuild.lock-sha256"] == sha256

        # a lock made for other inputs is refused before anything is built
        other = run_invoke(*args, "--set", "python_versions=3.13", "--lock-file", str(lock_file))
        assert other.returncode == 28 and "python_versions: lock has 3.14 the profile does not" in other.stderr
    finally:
        if engine.image_attrs(locked_tag):
            engine.client.images.remove(locked_tag, force=True)


def test_a_build_in_the_image_records_its_installed_list(engine, sid_pythons_image, tmp_path):
    spec, sets = sid_pythons_image
    tree = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    out = tmp_path / "out"
    overrides = [*sets, f"cache_dir={tmp_path / 'cache'}", "patches=none"]
    _, manifest = preflight_ok(SID_PYTHONS, tree, out, set_args(overrides), "--arch", "x86_64")
    packages = manifest["packages"]
    copy = out / "logs" / packages["file"]
    lines = copy.read_text().splitlines()
    assert lines == installed(engine, spec.image_tag)
    assert packages["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest() == lk.installed_digest(lines)
    assert packages["dpkg"] + packages["pip"] == len(lines)
    assert manifest["image"]["inputs"]["locked"] == "false"
