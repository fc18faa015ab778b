"""invoke image on a real engine: the cpu toolchain image on a local trixie base."""

from __future__ import annotations

import json
import re

import pytest
from helpers import SUITE_PYTHON, TEST_TORCH, run_invoke, set_args
from packaging.requirements import Requirement

from torchbuild import __version__
from torchbuild.core.arch import Arch
from torchbuild.core.errors import ImageOutOfDate
from torchbuild.image.host import image_inputs, require_image
from torchbuild.profile.config import resolve

pytestmark = pytest.mark.docker


def run_in(engine, tag: str, *cmd: str) -> str:
    out = engine.client.containers.run(tag, list(cmd), remove=True, stdout=True, stderr=True)
    return out.decode().strip()


def test_local_base_is_amd64_debian(engine, local_base):
    attrs = engine.image_attrs(local_base)
    assert attrs["Architecture"] == Arch.X86_64.docker_arch
    assert "Debian" in run_in(engine, local_base, "cat", "/etc/os-release")


def test_toolchain_runs_compilers_python_and_torchbuild(engine, cpu_image):
    spec, _ = cpu_image
    assert run_in(engine, spec.image_tag, "gcc", "--version").startswith("gcc ")
    assert re.match(r"cmake version \d+\.\d+", run_in(engine, spec.image_tag, "cmake", "--version"))
    assert run_in(engine, spec.image_tag, "ccache", "--version").startswith("ccache version")
    assert run_in(engine, spec.image_tag, "ninja", "--version")
    python = run_in(engine, spec.image_tag, "python3", "--version")
    assert python.startswith(f"Python {spec.python_version}."), python
    assert run_in(engine, spec.image_tag, "torchbuild", "--version") == f"torchbuild {__version__}"
    # the build requirements are importable by the image's python
    assert run_in(engine, spec.image_tag, "python3", "-c", "import numpy, yaml, sympy; print('ok')") == "ok"


def test_requirements_with_specifiers_are_installed_at_satisfying_versions(engine, cpu_image):
    spec, _ = cpu_image
    specified = [Requirement(p) for p in spec.python_packages if Requirement(p).specifier]
    assert len(specified) >= 2, spec.python_packages  # site_overrides adds them
    for req in specified:
        script = f"import importlib.metadata as m; print(m.version({req.name!r}))"
        version = run_in(engine, spec.image_tag, "python3", "-c", script)
        assert req.specifier.contains(version), f"{req}: the image has {req.name} {version}"


def test_an_image_built_for_another_python_is_refused_by_name(engine, cpu_image, site_overrides):
    spec, _ = cpu_image
    assert require_image(spec, engine)["Id"] == engine.image_attrs(spec.image_tag)["Id"]
    # flags of the build are not inputs of the image
    assert require_image(resolve("cpu", [*site_overrides, "cxxflags=-O1"], arch="x86_64"), engine)
    other = "3.12" if SUITE_PYTHON != "3.12" else "3.11"
    asks = resolve("cpu", [*site_overrides, f"python_version={other}"], arch="x86_64")
    with pytest.raises(ImageOutOfDate) as exc:
        require_image(asks, engine)
    assert f"python_version: image {SUITE_PYTHON}, profile {other}" in exc.value.message
    assert "invoke image --profile cpu --arch x86_64" in exc.value.hint
    assert f"--set python_version={other}" in exc.value.hint


def test_torchbuild_in_the_image_resolves_the_same_profile(engine, cpu_image, site_overrides):
    spec, _ = cpu_image
    args = ["config", "--profile", "cpu", "--arch", "x86_64", "--format", "json", *set_args(site_overrides)]
    inside = json.loads(run_in(engine, spec.image_tag, "torchbuild", *args))
    assert inside["hash"] == spec.hash
    assert inside["env"]["PYTORCH_BUILD_VERSION"] == spec.build_version


def test_image_labels_record_profile_and_versions(engine, cpu_image):
    spec, _ = cpu_image
    attrs = engine.image_attrs(spec.image_tag)
    labels = attrs["Config"]["Labels"]
    assert attrs["Architecture"] == "amd64"
    assert labels["org.torchbuild.profile"] == "cpu"
    assert labels["org.torchbuild.version"] == __version__
    assert labels["org.torchbuild.base-image"] == spec.base_image
    assert labels["org.torchbuild.torch-version"] == spec.torch_version
    assert len(labels["org.torchbuild.profile-hash"]) == 64
    inputs = image_inputs(attrs)
    assert inputs["python_version"] == SUITE_PYTHON
    assert inputs["base_image_id"] == engine.image_attrs(spec.base_image)["Id"]
    assert json.loads(inputs["python_packages"]) == list(spec.python_packages)


def test_rerun_with_nothing_changed_is_a_cache_hit(engine, cpu_image, site_overrides):
    spec, _ = cpu_image
    before = engine.image_attrs(spec.image_tag)["Id"]
    res = run_invoke("image", "--profile", "cpu", "--arch", "x86_64", *set_args(site_overrides))
    assert res.returncode == 0, res.stderr
    assert "up to date (cache hit)" in res.stdout
    assert "Step " not in res.stdout  # no docker build ran
    assert engine.image_attrs(spec.image_tag)["Id"] == before


def test_missing_base_image_fails_named_and_leaves_no_container(engine, site_overrides):
    before = {c.id for c in engine.client.containers.list(all=True)}
    res = run_invoke(
        "image",
        "--profile",
        "cpu",
        "--arch",
        "x86_64",
        *set_args([TEST_TORCH, *site_overrides, "base_image=torchbuild/base:no-such-suite-x86_64"]),
    )
    assert res.returncode == 4, res.stdout + res.stderr
    assert "ImageBuildFailed" in res.stderr and "no-such-suite" in res.stderr
    assert "invoke base-image" in res.stderr
    assert {c.id for c in engine.client.containers.list(all=True)} == before


def test_doctor_sees_the_engine_and_judges_each_task(engine):
    res = run_invoke("doctor")
    assert res.returncode == 0, res.stderr
    engine_row = next(ln for ln in res.stdout.splitlines() if "docker engine" in ln)
    assert engine_row.split()[:3] == ["ok", "docker", "engine"] and engine.version()["Version"] in engine_row
    verdicts = {
        task: ln.strip().startswith("ready")
        for ln in res.stdout.splitlines()
        for task in ("image --arch x86_64", "base-image", "build --in-container", "config")
        if task in ln and ln.strip().startswith(("ready", "NOT READY"))
    }
    assert verdicts == {"image --arch x86_64": True, "base-image": True, "build --in-container": True, "config": True}
