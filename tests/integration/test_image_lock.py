"""Several Pythons in one toolchain image, locked images and the installed list, on a real
engine: the sid-pythons image (Python 3.13 and 3.14 from Debian sid) and the installed list a
build in the image records in its manifest. `invoke image --lock` and the rebuild from the lock
that installs the very same packages, a lock that no longer installs (LockError, exit 28) and a
lock made for other inputs are tests/slow/test_image_lock_round_trip.py (about 2 minutes: the
image is built again from the lock, apt and pip, no cache)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from helpers import FIXTURES, preflight_ok, set_args

from torchbuild.image.host import read_image_files
from torchbuild.runtime.installed import INSTALLED_LIST, canonical_list, installed_digest

pytestmark = pytest.mark.docker

SID_PYTHONS = str(FIXTURES / "profiles" / "sid-pythons.yaml")  # as conftest's sid_pythons_image
# the locked image gets its own tag, so the shared sid-pythons image stays as the fixture made it
LOCKED_NAME = "torchbuild-test/locked"


def run_in(engine, tag: str, *cmd: str) -> str:
    out = engine.client.containers.run(tag, list(cmd), remove=True, stdout=True, stderr=True)
    return out.decode().strip()


def installed(engine, tag: str) -> list[str]:
    return read_image_files(engine, tag, [INSTALLED_LIST])["installed.txt"].decode().splitlines()


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
    assert listed == canonical_list(listed)
    for venv in ("/opt/venv", "/opt/venv-3.14"):
        assert any(line.startswith(f"pip {venv} setuptools==") for line in listed), venv
    assert any(line.startswith("dpkg python3.14-venv=") for line in listed)


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
    assert packages["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest() == installed_digest(lines)
    assert packages["dpkg"] + packages["pip"] == len(lines)
    assert manifest["image"]["inputs"]["locked"] == "false"
