"""A wheel for an older OS than the one it was built on, across real operating systems.

The fixture's C++ extension is built in a toolchain image on a debootstrapped Debian bullseye base
(glibc 2.31, as SLES 15 SP4+ at Derecho and ARCHER2; GCC 10). Bullseye's apt has Python 3.9 only,
so the image builds CPython 3.11 from its source tarball (`python_sources`: Debian's copy of
python.org's Python-3.11.2.tgz, byte for byte: the same sha256 pyenv pins for python.org's). The
wheel it makes is tagged manylinux for the floor, and imports natively on this host (bookworm,
glibc 2.36, Python 3.11) and in a stock bookworm container. The fixture built in the suite's trixie
image needs trixie's glibc: a 2.31 floor with that base is refused at `invoke config` (nothing in
out/), and `invoke install --engine native` run inside the bullseye image refuses that wheel
before making the prefix.

The bullseye base and image are built with the suite's shared images, before the first test
(`prebuild`): 640 s on a new engine beside the rest of the suite, most of it the CPython build.

What is not run here: a RHEL 8-class base (the manylinux_2_28 builder; dnf) and the real PyTorch
source on bullseye (Debian's de-vendored 2.6 source needs trixie's libraries; a site with the
full upstream source builds it on this base with the same keys).
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, TEST_TORCH, run_invoke, set_args
from image_builds import BUILDS

from torchbuild.core.arch import Arch
from torchbuild.image.baseimage import make_base_image
from torchbuild.runtime import elffloor

pytestmark = pytest.mark.docker

PY = "3.11"
PY_SOURCE = (
    "http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz"
    "#sha256=2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849"
)
FLOOR = "2.31"


def _site_certs() -> list[str]:  # as conftest's site_certs: this host's locally added CAs
    certs = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    return ["ca_certificates=" + ",".join(certs)] if certs else []


def bullseye_sets(base: str, site_certs: list[str]) -> list[str]:
    return [
        TEST_TORCH,  # bullseye's GCC 10 and CMake 3.18 build 2.6, not the current release
        f"base_image={base}",
        f"python_version={PY}",
        f"python_sources={json.dumps({PY: PY_SOURCE})}",
        f"glibc_floor={FLOOR}",
        # its own image name: the tag is the profile's (cpu-2.6.0-x86_64), which the suite's trixie image has
        "image_name=torchbuild-test/toolchain-bullseye",
        *site_certs,
    ]


def _bullseye_image(test_cache: Path) -> tuple[list[str], str]:
    """The bullseye base (debootstrap) and the cpu profile's image on it, through the CLI."""
    from torchbuild.profile.config import resolve
    from torchbuild.runtime.engine import Engine

    base = make_base_image(Engine.connect(), suite="bullseye", arch=Arch.X86_64, work_dir=test_cache / "rootfs")[0]
    sets = bullseye_sets(base, _site_certs())
    res = run_invoke("image", "--profile", "cpu", "--arch", "x86_64", *set_args(sets), timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    return sets, resolve("cpu", sets, arch="x86_64").image_tag


def prebuild(items: list, test_cache: Path, after) -> list:
    """Built with the suite's shared images, before the first test (conftest.prebuilt_images)."""
    return [("bullseye_image", lambda: _bullseye_image(test_cache))] if items else []


@pytest.fixture(scope="module")
def bullseye_image(engine, test_cache) -> tuple[list[str], str]:
    return BUILDS.get("bullseye_image", lambda: _bullseye_image(test_cache))


def build_fixture(tmp: Path, sets: list[str], name: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    tree, out = tmp / f"{name}-src", tmp / f"{name}-out"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    # a call whose symbol version follows the C library: g++ on glibc >= 2.38 binds strtol to
    # __isoc23_strtol@GLIBC_2.38 (C23), on bullseye to strtol@GLIBC_2.2.5; the fixture alone needs
    # nothing newer than 2.2.5 on either (measured: manylinux_2_5 from the trixie image)
    with (tree / "csrc" / "ops.cpp").open("a") as f:
        f.write(
            '\n#include <cstdlib>\nextern "C" long minitorch_parse(const char* s) { return std::strtol(s, nullptr, 10); }\n'
        )
    args = ["build", "--in-container", "--profile", "cpu", "--arch", "x86_64", "--source", str(tree), "--out", str(out)]
    common = [f"cache_dir={tmp / 'cache'}", "patches=none", f"local_version={name}"]
    return run_invoke(*args, *set_args([TEST_TORCH, *sets, *common]), timeout=3600), out


def in_container(engine, tag: str, script: str, mounts: dict[str, str]) -> tuple[int, str]:
    container = engine.client.containers.run(
        tag,
        ["bash", "-c", script],
        volumes={h: {"bind": c, "mode": "ro"} for h, c in mounts.items()},
        environment={"HOME": "/tmp"},
        detach=True,
    )
    try:
        status = container.wait(timeout=900)
        return status["StatusCode"], container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_the_python_the_base_lacks_is_built_from_its_pinned_source(engine, bullseye_image):
    _, tag = bullseye_image
    code, logs = in_container(
        engine,
        tag,
        "python3 -c 'import sys, ssl, sqlite3, lzma, bz2, ctypes; print(sys.version_info[:2], sys.base_prefix)'"
        " && cat /opt/torchbuild/record/python-sources.txt && ldd --version | head -1",
        {},
    )
    assert code == 0, logs
    assert f"(3, 11) /opt/python{PY}" in logs  # the venv's base: the Python built from the tarball
    assert PY_SOURCE.split("#sha256=")[1] in logs and "2.31" in logs.splitlines()[-1]


def test_a_bullseye_wheel_imports_on_newer_systems_and_is_tagged_for_the_floor(engine, bullseye_image, tmp_path):
    sets, _ = bullseye_image
    res, out = build_fixture(tmp_path, sets, "bullseye")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert "toolchain meets the site's floor (glibc 2.31 <= 2.31)" in res.stdout
    (wheel,) = out.glob("*.whl")
    assert "-cp311-cp311-manylinux_2_" in wheel.name, wheel.name
    manifest = json.loads((out / f"{wheel.name}.manifest.json").read_text())
    assert not elffloor.glibc.above(manifest["floor"]["glibc"], FLOOR), manifest["floor"]
    # natively on this host: bookworm's glibc 2.36, this Python 3.11
    assert sys.version_info[:2] == (3, 11), "this check needs the host's Python to be the wheel's 3.11"
    env = tmp_path / "host-venv"
    venv.create(env, with_pip=True)
    pip = subprocess.run(
        [env / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr
    probe = "import minitorch; print(minitorch.add(2, 3))"
    ran = subprocess.run([env / "bin" / "python", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == 0 and ran.stdout.strip() == "5.0", ran.stderr
    # in a stock bookworm container (Debian's own python3 3.11, glibc 2.36), from the unpacked wheel
    from integration.test_stock_distros import DISTROS, stock_image

    bookworm = next(d for d in DISTROS if d.suite == "bookworm")
    stock, _ = stock_image(engine, bookworm, tmp_path / "stock")
    code, logs = in_container(
        engine,
        stock,
        f"python3 -m zipfile -e /w/{wheel.name} /tmp/w && cd /tmp && PYTHONPATH=/tmp/w python3 -c '{probe}'",
        {str(out): "/w"},
    )
    assert code == 0 and logs.strip().splitlines()[-1] == "5.0", logs


def test_a_trixie_base_is_refused_for_the_floor_and_its_wheel_is_refused_by_install_on_bullseye(
    engine, cpu_image, site_overrides, bullseye_image, tmp_path
):
    # the suite's trixie base with a 2.31 floor: refused before anything is built
    res, out = build_fixture(tmp_path, [*site_overrides, f"glibc_floor={FLOOR}"], "refused")
    assert res.returncode == 2 and "has glibc 2.41, newer than glibc_floor 2.31" in res.stderr, res.stderr
    assert not out.exists() or not any(out.iterdir())
    # the same fixture built there without a floor needs trixie's glibc
    res, out = build_fixture(tmp_path, site_overrides, "trixie")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    (wheel,) = out.glob("*.whl")
    assert elffloor.glibc.above(elffloor.analyse(wheel).glibc, FLOOR)
    # `invoke install` on a bullseye system (the bullseye image, this checkout read-only) refuses it
    _, tag = bullseye_image
    _, logs = in_container(
        engine,
        tag,
        f"cd /repo && invoke install --engine native --prefix /tmp/env --wheel /w/{wheel.name} --out /tmp/o;"
        " echo exit=$?; test -e /tmp/env && echo prefix-made || echo no-prefix",
        {str(out): "/w", str(REPO): "/repo"},
    )
    assert "exit=32" in logs and "this host's glibc is 2.31" in logs and "no-prefix" in logs, logs
