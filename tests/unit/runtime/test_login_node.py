"""torchbuild on a login node of another arch than its target (Bede's are ppc64le, its GH200 nodes
aarch64): the tasks that build nothing work there for a profile that names its arch, the ones that
would build or run torch natively are refused by name. The host's machine is simulated (uname's
answer to platform.machine); the commands are the ones a user types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, make_wheel, set_args

from torchbuild.core import arch as arch_module
from torchbuild.core.arch import Arch, binfmt_ready
from torchbuild.core.errors import ProfileError
from torchbuild.profile.config import resolve
from torchbuild.runtime.backends.base import Options
from torchbuild.runtime.backends.native import NativeBackend

# `invoke ARGS` in a process whose platform.machine() answers MACHINE
SIMULATED = """
import platform, sys
machine = sys.argv.pop(1)
platform.machine = lambda: machine
from invoke.main import program
sys.argv[0] = "invoke"
program.run()
"""


def invoke_on(machine: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SIMULATED, machine, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# the GH200 nodes' Python (a venv made there) and the cache on Bede's Lustre
NODE_PYTHON = "/nobackup/projects/proj1/me/torchbuild-aarch64/bin/python"
BEDE_JOB = [f"job_python={NODE_PYTHON}", "cache_dir=/nobackup/projects/proj1/me/torchbuild-cache"]


@pytest.fixture
def ppc64le(monkeypatch):
    monkeypatch.setattr(arch_module.platform, "machine", lambda: "ppc64le")


def test_the_host_arch_of_a_ppc64le_node_is_none_and_asking_for_it_names_the_machine(ppc64le):
    assert Arch.host_or_none() is None
    with pytest.raises(ProfileError, match="this host is ppc64le"):
        Arch.host()
    # both of our arches are foreign there: emulated only where a qemu binfmt entry is enabled
    assert not binfmt_ready(Arch.AARCH64, Path("/nonexistent"))


def test_a_profile_naming_its_arch_resolves_on_ppc64le_and_one_meaning_this_host_is_refused(ppc64le):
    assert resolve("bede").arch is Arch.AARCH64
    assert resolve("cpu", arch="aarch64").arch is Arch.AARCH64
    with pytest.raises(ProfileError, match=r"'arch': 'host' is this machine, a ppc64le") as err:
        resolve("cpu")
    assert "--arch" in (err.value.hint or "")


def test_config_submit_doctor_and_wheelhouse_work_on_a_ppc64le_login_node(tmp_path):
    res = invoke_on("ppc64le", "config", "--profile", "bede")
    assert res.returncode == 0, res.stderr
    assert "TORCH_CUDA_ARCH_LIST=9.0" in res.stdout.splitlines()

    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    (tree / "version.txt").write_text("2.6.0\n")
    sub = ["submit", "--profile", "bede", "--engine", "native", "--dry-run", "--account", "proj1"]
    sub += ["--source", str(tree), "--out", str(tmp_path / "out"), *set_args(BEDE_JOB)]
    res = invoke_on("ppc64le", *sub)
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --partition=gh" in res.stdout and "module load gcc/12.2 openmpi/4.1.6" in res.stdout
    assert "dry run: nothing written or submitted" in res.stdout

    res = invoke_on("ppc64le", "doctor")
    assert res.returncode == 0, res.stderr
    assert "this host is ppc64le: build on an x86_64 or aarch64 node" in res.stdout
    assert "x86_64 emulation" in res.stdout and "aarch64 emulation" in res.stdout

    wheel = make_wheel(tmp_path / "built", "torch", "2.6.0+bede", "cp312-cp312-linux_aarch64")
    res = invoke_on("ppc64le", "wheelhouse", "--out", str(wheel.parent), "--dest", str(tmp_path / "wh"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "wh" / wheel.name).is_file()


def test_a_native_build_for_another_arch_is_refused_by_name(tmp_path):
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    res = invoke_on("ppc64le", "build", "--profile", "bede", "--source", str(tree), "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "profile bede targets aarch64, and this host is ppc64le" in res.stderr
    assert res.stderr.splitlines()[-1].startswith("hint: run it on an aarch64 node")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.whl"))


def test_the_native_backend_refuses_a_spec_for_another_arch_on_a_known_host(monkeypatch):
    monkeypatch.setattr(arch_module.platform, "machine", lambda: "x86_64")
    with pytest.raises(ProfileError, match="targets aarch64, and this host is x86_64"):
        NativeBackend(resolve("gh200"), Options()).check()
    assert NativeBackend(resolve("cpu"), Options()).check() is None


def test_a_job_submitted_from_the_ppc64le_login_node_runs_the_nodes_python_not_this_one(tmp_path):
    """The login node's sys.executable is a ppc64le binary the aarch64 node cannot run: without
    job_python the submission is refused by name; with it, the job (its comms step too) runs that."""
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    sub = ["submit", "--profile", "bede", "--engine", "native", "--dry-run", "--account", "proj1"]
    sub += ["--source", str(tree), "--out", str(tmp_path / "out")]
    res = invoke_on("ppc64le", *sub, *set_args(BEDE_JOB[1:]))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "profile bede builds on aarch64 nodes and this host is ppc64le: the job cannot run" in res.stderr
    assert "--set job_python=DIR/bin/python" in res.stderr
    res = invoke_on("ppc64le", *sub, *set_args([*BEDE_JOB, "nccl=source"]))
    assert res.returncode == 0, res.stderr
    assert f"exec {NODE_PYTHON} -m torchbuild build" in res.stdout
    assert f"{NODE_PYTHON} -m torchbuild comms" in res.stdout and sys.executable not in res.stdout


def test_bede_asks_for_a_cache_on_lustre_not_home(tmp_path):
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    sub = ["submit", "--profile", "bede", "--engine", "native", "--dry-run", "--account", "proj1"]
    res = invoke_on("aarch64", *sub, "--source", str(tree), "--out", str(tmp_path / "out"))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert (
        "profile bede needs cache_dir from you: a directory on Bede's Lustre file system, e.g. /nobackup/" in res.stderr
    )
    # from a GH200 node (ghlogin), its own Python is the job's
    res = invoke_on("aarch64", *sub, "--source", str(tree), "--out", str(tmp_path / "out"), *set_args(BEDE_JOB[1:]))
    assert res.returncode == 0, res.stderr
    assert f"exec {sys.executable} -m torchbuild build" in res.stdout
