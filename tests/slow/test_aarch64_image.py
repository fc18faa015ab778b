"""aarch64 toolchain images under qemu-user emulation, from a debootstrapped arm64 base (`nox -s slow`:
about 25 minutes on 2 cores, most of a fresh CI run before it moved here)."""

from __future__ import annotations

import re

import pytest
from helpers import SUITE_PYTHON, TEST_TORCH, run_invoke, set_args

from torchbuild import __version__
from torchbuild.profile.config import resolve

pytestmark = [pytest.mark.docker, pytest.mark.emulation]


def sh(engine, tag, *cmd):
    return engine.client.containers.run(tag, list(cmd), remove=True, platform="linux/arm64").decode().strip()


def test_arm64_toolchain_image_under_emulation(engine, arm64_base, site_certs):
    assert engine.image_attrs(arm64_base)["Architecture"] == "arm64"
    # PyTorch's Python build requirements (sympy, numpy, ...) take many minutes to byte-compile
    # under emulation and add nothing to what this checks: the arm64 toolchain itself
    sets = [TEST_TORCH, f"base_image={arm64_base}", f"python_version={SUITE_PYTHON}", "python_packages=[]", *site_certs]
    res = run_invoke("image", "--profile", "cpu", "--arch", "aarch64", *set_args(sets))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    spec = resolve("cpu", sets, arch="aarch64")
    assert spec.image_tag.endswith("-aarch64")
    attrs = engine.image_attrs(spec.image_tag)
    assert attrs["Architecture"] == "arm64"
    assert attrs["Config"]["Labels"]["org.torchbuild.arch"] == "aarch64"
    assert sh(engine, spec.image_tag, "uname", "-m") == "aarch64"
    assert "aarch64" in sh(engine, spec.image_tag, "gcc", "-dumpmachine")
    assert re.match(r"cmake version \d", sh(engine, spec.image_tag, "cmake", "--version"))
    assert sh(engine, spec.image_tag, "python3", "--version").startswith(f"Python {spec.python_version}.")
    assert sh(engine, spec.image_tag, "torchbuild", "--version") == f"torchbuild {__version__}"
