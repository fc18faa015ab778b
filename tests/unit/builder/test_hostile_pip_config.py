"""A site pip configuration that points find-links at a wheelhouse with a higher torch and a
constraint file pinning another torch (what HPC sites, the Alliance among them, set for every
user): install, verify, the companions' build and bench each keep the built torch."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import isolated_pip_env, make_wheel

from torchbuild.bench import step as benchmod
from torchbuild.builder import companions
from torchbuild.profile.config import resolve
from torchbuild.runtime import pipenv
from torchbuild.runtime.manifest import INSTALL_MANIFEST, read_install
from torchbuild.verify.step import verify_wheel

BUILT = "9.9.9+built"
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
TORCHBUILD = Path(sys.executable).with_name("torchbuild")


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """PIP_CONFIG_FILE naming a config with find-links to torch 99.0 and a constraint file
    pinning torch 1.0 (and capping another package), no index (nothing leaves this machine);
    no other PIP_* variable. Returns the built torch wheel (9.9.9+built)."""
    site = tmp_path / "site"
    make_wheel(site / "wheels", "torch", "99.0", module="torch")
    (site / "constraints.txt").write_text("# the site's torch\ntorch==1.0\nsite-only-pkg<2  # kept\n")
    conf = site / "pip.conf"
    conf.write_text(
        f"[global]\nno-index = true\nfind-links = {site / 'wheels'}\nconstraint = {site / 'constraints.txt'}\n"
    )
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    return make_wheel(tmp_path / "built", "torch", BUILT, module="torch")


def test_the_hostile_config_refuses_the_built_torch_to_plain_pip(tmp_path, hostile):
    """The stand-in's own teeth: plain pip under this config cannot unpack the built wheel."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(tmp_path / "t"), str(hostile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "torch==1.0" in proc.stdout + proc.stderr


def test_the_site_constraint_lines_on_other_packages_are_carried_on(tmp_path, hostile):
    files = pipenv.site_constraint_files(sys.executable, os.environ)
    assert files == [str(tmp_path / "site" / "constraints.txt")]
    env = pipenv.keep_built(tmp_path / "c.txt", {"torch": BUILT}, sys.executable, os.environ)
    assert env == {"PIP_CONSTRAINT": str(tmp_path / "c.txt")}
    assert (tmp_path / "c.txt").read_text() == "torch===9.9.9+built\nsite-only-pkg<2\n"


@pytest.mark.skipif(shutil.which(f"python{PYVER}") is None, reason=f"python{PYVER} is not on PATH")
def test_install_keeps_the_built_torch(tmp_path, hostile):
    prefix = tmp_path / "env"
    args = [str(TORCHBUILD), "install", "--prefix", str(prefix), "--wheel", str(hostile)]
    args += [
        "--out",
        str(tmp_path / "out"),
        "--set",
        f"python_version={PYVER}",
        "--set",
        f"cache_dir={tmp_path / 'cache'}",
        "--no-index",
    ]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert f"torch=={BUILT}" in read_install(prefix / INSTALL_MANIFEST).frozen
    assert f"import torch: {BUILT}" in done.stdout


def test_verify_installs_the_built_torch_into_its_fresh_venv(hostile):
    checks = {c.name: c for c in verify_wheel(hostile, resolve("cpu"), BUILT)}
    assert checks["install into a fresh venv"].status == "pass", checks["install into a fresh venv"].detail


def test_the_companions_build_against_the_built_torch(tmp_path, hostile):
    torch_dir = tmp_path / "work" / "torch"
    torch_dir.mkdir(parents=True)  # as build_all makes it
    companions.unpack_torch(hostile, torch_dir, os.environ, tmp_path / "work")
    assert (torch_dir / "torch" / "__init__.py").read_text().startswith(f'__version__ = "{BUILT}"')


def test_bench_keeps_the_built_torch_when_torchbench_asks_pip_for_the_newest(tmp_path, hostile):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(hostile)], check=True, env=isolated_pip_env())  # the built torch, as install leaves it
    tree = tmp_path / "bench"
    tree.mkdir()
    (tree / "install.py").write_text(  # the site's find-links offer torch 99.0
        "import subprocess, sys\n"
        "sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--upgrade', 'torch']))\n"
    )
    out = io.StringIO()
    result = benchmod.bench(benchmod.Request(venv=str(env), benchmark=str(tree)), out=out)
    assert benchmod.pinned_packages(env / "bin" / "python")["torch"]["version"] == BUILT
    assert result["torch"]["version"] == BUILT
    assert (env / "torchbuild-constraints.txt").read_text() == "torch===9.9.9+built\nsite-only-pkg<2\n"
