"""Fixtures that drive the real Docker engine. No mocks: an unreachable engine fails the run."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    FIXTURES,
    OFI_PLUGIN,
    SUITE,
    SUITE_PYTHON,
    TEST_TORCH,
    TORCH_PROFILE,
    image_ok,
    run_in,
    run_invoke,
    set_args,
)
from image_builds import BUILDS
from slurm_cluster import SlurmCluster, missing_tools

from torchbuild.core.arch import Arch
from torchbuild.core.errors import EngineUnavailable
from torchbuild.image.baseimage import make_base_image
from torchbuild.profile.config import resolve
from torchbuild.runtime.apptainer import DockerApptainer, locate
from torchbuild.runtime.engine import Engine
from torchbuild.sif.host import ensure_builder, remove_tree


@pytest.fixture(scope="session")
def engine() -> Engine:
    try:
        return Engine.connect()
    except EngineUnavailable as exc:
        pytest.fail(f"integration tests need a Docker engine: {exc.message} ({exc.hint})")


@pytest.fixture(scope="session")
def test_cache(tmp_path_factory) -> Path:
    return Path(os.environ.get("TORCHBUILD_TEST_CACHE", tmp_path_factory.mktemp("cache")))


# the session's image builds, started together before the first test (prebuilt_images)


def _base(engine: Engine, test_cache: Path, suite: str) -> str:
    """torchbuild/base:<suite>-x86_64, made with the product's own base-image code if missing."""
    tag, _ = make_base_image(
        engine,
        suite=suite,
        arch=Arch.X86_64,
        work_dir=test_cache / "rootfs",
        ignore_valid_until=True,  # snapshot mirrors serve expired Release files
    )
    return tag


@pytest.fixture(scope="session", autouse=True)
def prebuilt_images(request, test_cache: Path, site_certs: list[str], tmp_path_factory):
    """Start the image builds the selected tests need (image_builds.py), dependencies first and the
    longest early, and wait for them before the first test; one line per build in the log. The
    fixtures below take the results. TORCHBUILD_TEST_PREBUILD=0 leaves each build to its fixture."""
    if os.environ.get("TORCHBUILD_TEST_PREBUILD", "1") == "0":
        yield
        return
    needed = {name for item in request.session.items for name in item.fixturenames}
    _start_builds(needed, test_cache, site_certs, tmp_path_factory)
    _start_module_builds(request.session.items, test_cache)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    t0 = time.monotonic()
    lines = BUILDS.wait()
    if reporter is not None and lines:
        reporter.write_line(f"images built before the first test in {time.monotonic() - t0:.0f} s, two at a time:")
        for line in lines:
            reporter.write_line(f"  {line}")
    yield
    BUILDS.shutdown()


def _start_builds(needed: set[str], test_cache: Path, site_certs: list[str], tmp_path_factory) -> None:
    """Queue what needed (the selected tests' fixture names) asks for; each thread its own engine
    client. A dependency is queued before what waits for it."""
    want = {
        name
        for name in ("local_base", "sid_base", "cpu_image", "cuda_image", "torch_image", "sid_pythons_image", "cpu_sif")
        if name in needed
    }
    if "debian_torch_wheel" in needed:
        want |= {"torch_image", "debian_torch_wheel"}
    if want & {"cpu_image", "cuda_image", "torch_image", "cpu_sif"}:
        want.add("local_base")
    if want & {"sid_pythons_image", "cpu_sif"}:
        want.add("sid_base")
    local = lambda: BUILDS.get("local_base", lambda: "")  # noqa: E731 - queued before its users
    sid = lambda: BUILDS.get("sid_base", lambda: "")  # noqa: E731
    queue: list[tuple[str, Any]] = [
        ("local_base", lambda: _base(Engine.connect(), test_cache, SUITE)),
        ("sid_base", lambda: _base(Engine.connect(), test_cache, "sid")),
        # longest first: the CUDA toolkit image, then the cpu image the most tests use
        ("cuda_image", lambda: _cuda_image(local(), site_certs)),
        ("cpu_image", lambda: _cpu_image(_site_overrides(local(), site_certs))),
        ("torch_image", lambda: _torch_image(local(), site_certs)),
        ("apptainer_builder", lambda: ensure_builder(_builder_spec(sid(), site_certs), Engine.connect())),
        ("sid_pythons_image", lambda: _sid_pythons_image(sid(), site_certs)),
    ]
    if "cpu_sif" in want:
        want.add("apptainer_builder")
        sif_dir = tmp_path_factory.mktemp("sif")
        queue.append(
            (
                "cpu_sif",
                lambda: _cpu_sif(
                    _site_overrides(local(), site_certs), sid(), sif_dir, after=("cpu_image", "apptainer_builder")
                ),
            )
        )
    if "debian_torch_wheel" in want:
        dirs = (tmp_path_factory.mktemp("debian-torch-wheel"), tmp_path_factory.mktemp("fx"))
        torch = lambda: BUILDS.get("torch_image", lambda: None)  # noqa: E731
        queue.append(("debian_torch_wheel", lambda: _debian_torch_wheel(Engine.connect(), torch(), *dirs)))
    for name, build in queue:
        if name in want:
            BUILDS.start(name, build)


def _start_module_builds(items, test_cache: Path) -> None:
    """Queue, after the shared images, the images a selected test module makes for itself: a
    module with `prebuild(items, test_cache, after)` returns [(name, build)] for its selected
    items, and its tests take each result with BUILDS.get(name, build). after(name) waits for a
    shared build (its base)."""
    by_module: dict[Any, list[Any]] = {}
    for item in items:
        if getattr(getattr(item, "module", None), "prebuild", None) is not None:
            by_module.setdefault(item.module, []).append(item)
    after = lambda name: BUILDS.get(name, lambda: None)  # noqa: E731
    for module, selected in by_module.items():
        for name, build in module.prebuild(selected, test_cache, after):
            BUILDS.start(name, build)


def _builder_spec(sid_base: str, site_certs: list[str]):
    """The spec the apptainer-builder image is made for (its base and this host's CAs), as
    `invoke sif` of the cpu image and test_sif_recipe's node resolve it."""
    return resolve("cpu", [f"sif_builder_base={sid_base}", *site_certs])


@pytest.fixture(scope="session")
def local_base(engine: Engine, test_cache: Path) -> str:
    """torchbuild/base:<suite>-x86_64, made with the product's own base-image code if missing."""
    return BUILDS.get("local_base", lambda: _base(engine, test_cache, SUITE))


@pytest.fixture(scope="session")
def arm64_base(engine: Engine, test_cache: Path) -> str:
    """torchbuild/base:<suite>-aarch64, debootstrapped under qemu-user emulation if missing."""
    tag, _ = make_base_image(
        engine, suite=SUITE, arch=Arch.AARCH64, work_dir=test_cache / "rootfs", ignore_valid_until=True
    )
    return tag


@pytest.fixture(scope="session")
def site_certs() -> list[str]:
    """This host's locally added CAs: a TLS-inspecting proxy between us and PyPI needs them."""
    certs = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    return ["ca_certificates=" + ",".join(certs)] if certs else []


# requirements with version specifiers, which must reach pip intact (`six<2`, not `'six<2'`)
SPECIFIED_PACKAGES = ("six<2", "packaging>=23")


@pytest.fixture(scope="session")
def site_overrides(local_base: str, site_certs: list[str]) -> list[str]:
    """--set options that point the cpu profile at the local base (and this host's local CAs),
    with the cpu profile's python_packages plus SPECIFIED_PACKAGES, and MPICH in the image (the
    cray-mpich ABI: the SIF's host MPI test binds another MPICH build over it; distributed stays
    [gloo], so builds still have USE_MPI=0)."""
    return _site_overrides(local_base, site_certs)


def _site_overrides(local_base: str, site_certs: list[str]) -> list[str]:
    packages = [*resolve("cpu").python_packages, *SPECIFIED_PACKAGES]
    return [
        TEST_TORCH,
        f"base_image={local_base}",
        f"python_version={SUITE_PYTHON}",
        f"python_packages={json.dumps(packages)}",
        "mpi=mpich",
        *site_certs,
    ]


# runtime keys the cpu SIF is converted with (left out of the image: no image rebuild)
SIF_RUNTIME_ENV = 'runtime_env={NCCL_SOCKET_IFNAME: hsn, TB_RUNTIME_CHECK: "two words; $HOME stays literal"}'


@pytest.fixture(scope="session")
def cpu_image(engine, site_overrides):
    """The cpu profile image, built through the CLI a user types; returns (spec, first run output)."""
    return BUILDS.get("cpu_image", lambda: _cpu_image(site_overrides))


def _cpu_image(site_overrides: list[str]):
    res = run_invoke("image", "--profile", "cpu", "--arch", "x86_64", *set_args(site_overrides))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    return resolve("cpu", site_overrides, arch="x86_64"), res.stdout


@pytest.fixture(scope="session")
def debian_dsc(engine, local_base, test_cache):
    """Debian trixie's pytorch 2.6.0+dfsg .dsc (downloaded once per test cache)."""
    sys.path.insert(0, str(FIXTURES))
    from debian_source import fetch_debian_pytorch

    return fetch_debian_pytorch(engine, local_base, test_cache / "debian-src")


@pytest.fixture
def node_tmp():
    """A temporary directory every uid can reach (pytest's own are 0700 under the caller's
    directory): for ApptainerNode, whose user is not the caller. Removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="torchbuild-node-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        remove_tree(path)


@pytest.fixture(scope="session")
def sid_base(engine: Engine, test_cache: Path) -> str:
    """torchbuild/base:sid-x86_64: Apptainer is packaged in Debian sid only."""
    return BUILDS.get("sid_base", lambda: _base(engine, test_cache, "sid"))


@pytest.fixture(scope="session")
def cpu_sif(engine, cpu_image, site_overrides, sid_base, tmp_path_factory):
    """`invoke sif` of the cpu image, as a user types it; returns (spec, sif, first output, builder, sets)."""
    return BUILDS.get("cpu_sif", lambda: _cpu_sif(site_overrides, sid_base, tmp_path_factory.mktemp("sif")))


def _cpu_sif(site_overrides: list[str], sid_base: str, out: Path, after: tuple[str, ...] = ()):
    for name in after:  # queued with the image it converts and the builder: their builds first
        BUILDS.get(name, lambda: None)
    sets = [TEST_TORCH, *site_overrides, f"sif_builder_base={sid_base}", SIF_RUNTIME_ENV]
    res = run_invoke(
        "sif", "--profile", "cpu", "--arch", "x86_64", "--apptainer", "docker", "--out", str(out), *set_args(sets)
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    spec = resolve("cpu", sets, arch="x86_64")
    apptainer = locate(spec, "docker")
    assert isinstance(apptainer, DockerApptainer)
    return spec, out / "torch-build-cpu-x86_64.sif", res.stdout, apptainer, sets


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real one-node Slurm (munged, slurmctld, slurmd), stopped after the session. CI installs
    slurm-wlm and munge (.ci/run); elsewhere the Slurm tests are skipped when they are missing."""
    missing = missing_tools()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm is not installed here ({', '.join(missing)} missing); .ci/run installs it")
        pytest.skip(f"needs slurm-wlm and munge ({', '.join(missing)} missing)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# Where the NCCL and aws-ofi-nccl release tarballs are (SHA256SUMS beside them): the project's
# shared sources next to the checkout, or TORCHBUILD_TEST_SOURCES.
SOURCE_DIRS = [
    Path(p)
    for p in (
        os.environ.get("TORCHBUILD_TEST_SOURCES", ""),
        str(FIXTURES.parents[2] / "shared" / "sources"),
        "/work/shared/sources",
    )
    if p
]


def shared_sources(test_cache: Path, project: str) -> dict[str, tuple[Path, str]]:
    """version -> (project's release tarball copied into the test cache, its sha256), for every
    `<project>-<version>.tar.gz` line of SHA256SUMS; the copy's sha256 is checked. Fails the test,
    naming what is missing, when there is no SHA256SUMS, no line for project or no tarball."""
    found = next((d for d in SOURCE_DIRS if (d / "SHA256SUMS").is_file()), None)
    if found is None:
        pytest.fail(
            f"no {project} tarballs: no SHA256SUMS in {', '.join(map(str, SOURCE_DIRS))} (set TORCHBUILD_TEST_SOURCES)"
        )
    dest = test_cache / "sources"
    dest.mkdir(parents=True, exist_ok=True)
    prefix = f"{project}-"
    tarballs = {}
    for line in (found / "SHA256SUMS").read_text().splitlines():
        sha, _, name = line.strip().partition("  ")
        name = name.lstrip("*")
        if not (name.startswith(prefix) and name.endswith(".tar.gz")):
            continue
        copy = dest / name
        if not copy.exists() or _sha256(copy) != sha:
            if not (found / name).is_file():
                pytest.fail(f"{found / name} is missing (SHA256SUMS lists it)")
            shutil.copyfile(found / name, copy)
            if _sha256(copy) != sha:
                pytest.fail(f"{found / name} does not match its sha256 in SHA256SUMS ({sha})")
        tarballs[name.removeprefix(prefix).removesuffix(".tar.gz")] = (copy, sha)
    if not tarballs:
        pytest.fail(f"{found / 'SHA256SUMS'} lists no {prefix}*.tar.gz")
    return tarballs


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="session")
def ofi_sources(test_cache) -> dict[str, tuple[Path, str]]:
    """version -> (the aws-ofi-nccl tarball copied into the test cache, its sha256 from SHA256SUMS)."""
    return shared_sources(test_cache, "aws-ofi-nccl")


@pytest.fixture(scope="session")
def nccl_sources(test_cache) -> dict[str, tuple[Path, str]]:
    """version ("2.21.5-1") -> (the NCCL release tarball copied into the test cache, its sha256)."""
    return shared_sources(test_cache, "nccl")


@pytest.fixture(scope="session")
def cuda_image(engine, local_base, site_certs) -> tuple[object, list[str]]:
    """The cuda-offline toolchain image, made for building the aws-ofi-nccl plugin too (autotools,
    hwloc, trixie's libfabric-dev 2.1): one image for the CUDA and the comms tests."""
    return BUILDS.get("cuda_image", lambda: _cuda_image(local_base, site_certs))


def _cuda_image(local_base: str, site_certs: list[str]) -> tuple[object, list[str]]:
    sets = [TEST_TORCH, f"base_image={local_base}", *site_certs, f"aws_ofi_nccl_version={OFI_PLUGIN}"]
    res = run_invoke("image", "--profile", "cuda-offline", *set_args(sets))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    return resolve("cuda-offline", sets), sets


@pytest.fixture(scope="session")
def torch_image(engine, local_base, site_certs):
    """The debian-torch-installed image (python3-torch 2.6, Open MPI, pybind11), built through
    the CLI: (its spec, the --set values it was built with)."""
    return BUILDS.get("torch_image", lambda: _torch_image(local_base, site_certs))


def _torch_image(local_base: str, site_certs: list[str]):
    sets = [TEST_TORCH, f"base_image={local_base}", *site_certs]
    image_ok(TORCH_PROFILE, set_args(sets))
    return resolve(TORCH_PROFILE, sets), sets


# Debian sid with Python 3.13 (/opt/venv) and 3.14 (/opt/venv-3.14): several Pythons in one image
SID_PYTHONS = str(FIXTURES / "profiles" / "sid-pythons.yaml")


@pytest.fixture(scope="session")
def sid_pythons_image(engine, sid_base, site_certs):
    """The sid-pythons toolchain image (tests/fixtures/profiles/sid-pythons.yaml), built through
    the CLI: (its spec, the --set values it was built with)."""
    return BUILDS.get("sid_pythons_image", lambda: _sid_pythons_image(sid_base, site_certs))


def _sid_pythons_image(sid_base: str, site_certs: list[str]):
    sets = [TEST_TORCH, f"base_image={sid_base}", *site_certs]
    image_ok(SID_PYTHONS, set_args(sets))
    return resolve(SID_PYTHONS, sets, arch="x86_64"), sets


@pytest.fixture(scope="session")
def debian_torch_wheel(engine, torch_image, tmp_path_factory) -> Path:
    """Debian's installed torch 2.6.0+debian packed as a wheel (tests/fixtures/debian_torch_wheel.py)."""
    dirs = (tmp_path_factory.mktemp("debian-torch-wheel"), tmp_path_factory.mktemp("fx"))
    return BUILDS.get("debian_torch_wheel", lambda: _debian_torch_wheel(engine, torch_image, *dirs))


def _debian_torch_wheel(engine: Engine, torch_image, out: Path, fixtures: Path) -> Path:
    spec, _ = torch_image
    shutil.copy(FIXTURES / "debian_torch_wheel.py", fixtures)
    run_in(engine, spec.image_tag, "python3 /fx/debian_torch_wheel.py /out", {str(out): "/out", str(fixtures): "/fx"})
    (wheel,) = out.glob("torch-2.6.0+debian-cp313-cp313-linux_x86_64.whl")
    return wheel
