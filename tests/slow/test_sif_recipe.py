"""`invoke sif --from-recipe` on a node with Apptainer and no Docker: the apptainer-builder
container (real Apptainer 1.4, no Docker engine inside it) stands in for the node. As a
non-root user with subordinate ids, torchbuild (from this checkout) turns the toolchain recipe
into a definition with spython and builds the cpu SIF with `apptainer build --fakeroot` from a
debootstrap of Debian trixie from Debian's archive. In that SIF gcc, cmake, ninja, ccache and
torchbuild run, and `apptainer run ... build` builds the minitorch fixture to a wheel.

Slow (about 6 minutes here: debootstrap, apt and pip from the network, then mksquashfs), so
.ci/run keeps only the recipe's unit tests; `nox -s slow` runs this before a release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, ApptainerNode, set_args, shared_dir
from integration.conftest import SPECIFIED_PACKAGES, SUITE_PYTHON

from torchbuild import __version__
from torchbuild.profile.config import resolve
from torchbuild.sif.host import ensure_builder

pytestmark = [pytest.mark.docker, pytest.mark.apptainer]


def test_cpu_sif_from_the_recipe_without_docker_builds_the_fixture(engine, local_base, sid_base, site_certs, node_tmp):
    tmp_path = node_tmp
    packages = [*resolve("cpu").python_packages, *SPECIFIED_PACKAGES]
    sets = [
        TEST_TORCH,
        f"base_image={local_base}",  # torchbuild/base:trixie-x86_64: debootstrap derives trixie from it
        "sif_bootstrap=debootstrap",
        f"python_version={SUITE_PYTHON}",
        f"python_packages={json.dumps(packages)}",
        *site_certs,
    ]
    spec = resolve("cpu", sets, arch="x86_64")
    tag = ensure_builder(resolve("cpu", [f"sif_builder_base={sid_base}", *site_certs]), engine)
    home, out = shared_dir(tmp_path / "home"), shared_dir(tmp_path / "out")
    certs = [Path(c).parent for s in site_certs for c in s.split("=", 1)[1].split(",")]
    node = ApptainerNode(engine, tag, home, [out, *certs])

    rc, text = node.run("sh", "-c", "command -v docker dockerd || echo no-docker; id -u; grep -c . /etc/subuid")
    assert rc == 0 and text.split()[-3:] == ["no-docker", str(ApptainerNode.NODE_UID), "1"], text

    cli = ["/opt/venv/bin/python", "-m", "torchbuild", "sif", "--from-recipe", "--profile", "cpu", "--arch", "x86_64"]
    rc, text = node.run(*cli, "--out", str(out), *set_args(sets))
    assert rc == 0, text[-5000:]
    assert "bootstrap: debootstrap trixie main contrib non-free from http://deb.debian.org/debian; --fakeroot" in text
    sif = out / "torch-build-cpu-x86_64.sif"
    assert sif.is_file() and not list(out.glob(".*partial*"))
    assert not list((home / ".cache" / "torchbuild" / "apptainer" / "work").iterdir())  # nothing left behind

    # the converted SIF's labels, with the recipe in place of the image
    rc, text = node.run("apptainer", "inspect", "--json", "--labels", str(sif))
    assert rc == 0, text
    labels = json.loads(text[text.index("{") :])["data"]["attributes"]["labels"]
    assert labels["org.torchbuild.profile"] == "cpu" and labels["org.torchbuild.arch"] == "x86_64"
    assert labels["org.torchbuild.version"] == __version__ and labels["org.torchbuild.sif.route"] == "recipe"
    assert labels["org.torchbuild.sif.profile-hash"] == spec.hash

    # the toolchain: every tool runs, the site CAs are in place (pip through the proxy used them), the profile is baked in
    probe = (
        "gcc --version | head -1 && cmake --version | head -1 && ninja --version && ccache --version | head -1"
        " && torchbuild --version && python3 -c 'import numpy, six; print(numpy.__version__)'"
        " && test -s /opt/torchbuild/installed.txt && ls /usr/local/share/ca-certificates/torchbuild"
        " && echo TORCHBUILD_PROFILE=$TORCHBUILD_PROFILE"
    )
    rc, text = node.run("apptainer", "exec", "--userns", str(sif), "bash", "-c", probe)
    assert rc == 0, text
    assert "gcc (Debian 14" in text and "cmake version 3." in text and f"torchbuild {__version__}" in text, text
    assert "TORCHBUILD_PROFILE=/opt/torchbuild/profiles/cpu.yaml" in text
    for cert in (s.split("=", 1)[1].split(",") for s in site_certs):
        assert len([c for c in text.splitlines() if c.endswith(".crt")]) == len(cert), text

    # the fixture, built by the SIF's runscript as with a converted SIF
    tree, cache, wheels = tmp_path / "minitorch", shared_dir(tmp_path / "cache"), shared_dir(tmp_path / "wheels")
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    for p in [tree, *tree.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    node.paths += [tree, cache, wheels]
    binds = f"{tree}:/src,{cache}:/cache,{wheels}:/out"
    rc, text = node.run(
        "apptainer", "run", "--userns", "--bind", binds, str(sif),
        "build", "--set", "patches=none", "--set", "local_version=recipe",
    )  # fmt: skip
    assert rc == 0, text[-5000:]
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert len(built) == 1 and built[0].startswith("minitorch-2.6.0+recipe-cp313-cp313-linux_x86_64"), built
    printed = next(line for line in text.splitlines() if line.startswith("manifest: /out/"))
    manifest = json.loads((wheels / Path(printed.split(": ", 1)[1]).name).read_text())
    assert manifest["engine"] == "apptainer" and manifest["wheel"]["name"] == built[0]
    assert manifest["image"]["inputs"]["profile"] == "cpu"  # from the SIF's labels, as with a converted SIF

    # again: up to date by its labels, nothing rebuilt
    rc, text = node.run(*cli, "--out", str(out), *set_args(sets))
    assert rc == 0 and "up to date (made from the current recipe)" in text, text[-3000:]
