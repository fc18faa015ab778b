"""The Alliance's run job (`invoke submit --run`, the seed's pytorch-test.sh) on the real
one-node Slurm, whose TaskProlog gives each job a $SLURM_TMPDIR as the Alliance's prolog does:
the job makes a venv there, installs the fixture wheel and an mpi4py wheel built once against a
real MPI (MPICH's PyPI wheel: its mpicc and headers) from a wheelhouse with --no-index, and runs
a script that imports both; the venv is gone after the job. The same script run where no
$SLURM_TMPDIR is set makes its venv in a private temporary directory and removes it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_wheel, run_invoke, set_args

pytestmark = [pytest.mark.slurm]

PROBE = """import sys, runjobfixture, mpi4py
from mpi4py import MPI
print("imported runjobfixture", runjobfixture.__version__, "from", runjobfixture.__file__)
print("mpi4py", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])
print("argv", sys.argv[1:])
print("RUNJOB_VAR", __import__("os").environ.get("RUNJOB_VAR"))
"""


@pytest.fixture(scope="session")
def mpi_wheelhouse(tmp_path_factory):
    """A wheelhouse with the fixture wheel and an mpi4py wheel built once by `invoke wheelhouse
    --add-mpi4py` with MPICH from PyPI (mpicc, headers and libmpi in a venv); the MPI's lib."""
    root = tmp_path_factory.mktemp("runjob")
    mpi = root / "mpich"
    subprocess.run([sys.executable, "-m", "venv", str(mpi)], check=True)
    subprocess.run([str(mpi / "bin" / "pip"), "install", "-q", "--only-binary", ":all:", "mpich"], check=True)
    house = root / "wheelhouse"
    fixture = make_wheel(root / "built", "runjobfixture", "1.0.0+computecanada", module="runjobfixture")
    res = run_invoke("wheelhouse", "--dest", str(house), "--wheel", str(fixture))
    assert res.returncode == 0, res.stdout + res.stderr
    t0 = time.monotonic()
    res = run_invoke(
        "wheelhouse", "--dest", str(house), "--add-mpi4py", "--profile", "alliance",
        *set_args([f"mpicc={mpi / 'bin' / 'mpicc'}", "python_version={}.{}".format(*sys.version_info[:2])]),
        timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    print(f"\nmpi4py wheel built in {time.monotonic() - t0:.0f} s")
    assert re.search(r"^added mpi4py-[\d.]+-cp\d+-cp\d+-linux_x86_64\.whl$", res.stdout, re.M), res.stdout[-2000:]
    return house, mpi / "lib"


def run_sets(mpi_lib: Path) -> list[str]:
    """The alliance profile on the stand-in: no Lmod modules, no GPU, its Python."""
    return set_args(
        [
            "runtime_modules=[]", "modules=[]", "gpus=0", "gpu_type=", "cpus=1", "mem=2G",
            "python_version={}.{}".format(*sys.version_info[:2]),
            f'runtime_env={{"RUNJOB_VAR": "a b;$(x)", "LD_LIBRARY_PATH": "{mpi_lib}"}}',
        ]
    )  # fmt: skip


def test_list_shows_what_avail_wheels_shows(mpi_wheelhouse):
    house, _ = mpi_wheelhouse
    res = run_invoke("wheelhouse", "--dest", str(house), "--list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["name", "version", "python", "arch"]
    rows = [ln.split() for ln in lines[1:]]
    assert rows[0][0] == "mpi4py" and rows[0][3] == "x86_64"
    assert rows[1] == ["runjobfixture", "1.0.0+computecanada", "py3", "generic"]


def test_run_job_installs_from_the_wheelhouse_into_slurm_tmpdir(slurm, mpi_wheelhouse, tmp_path):
    house, mpi_lib = mpi_wheelhouse
    script = tmp_path / "pytorch test.py"
    script.write_text(PROBE)
    out = tmp_path / "out"
    t0 = time.monotonic()
    res = run_invoke(
        "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(house), "--package",
        "runjobfixture", "--out", str(out), "--wait", "--arg", "two words", *run_sets(mpi_lib), "--", "--epochs", "3",
        env=slurm.env, timeout=600,
    )  # fmt: skip
    wall = time.monotonic() - t0
    print(f"\nrun job: {wall:.1f} s from `invoke submit --run` to its end")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert re.search(r"^job \d+ COMPLETED \(exit code 0\)", res.stdout, re.M), res.stdout[-3000:]
    # the venv was made in the job's $SLURM_TMPDIR, from the wheelhouse
    venv = re.search(r"^torchbuild: venv (\S+) \(Python ", res.stdout, re.M)
    assert venv and "/jobtmp/job." in venv.group(1), res.stdout[-3000:]
    assert "SLURM_TMPDIR is not set" not in res.stdout
    assert re.search(
        r"^imported runjobfixture 1\.0\.0\+computecanada from " + re.escape(venv.group(1)), res.stdout, re.M
    )
    assert re.search(r"^mpi4py [\d.]+ MPICH Version:", res.stdout, re.M), res.stdout[-3000:]
    assert "argv ['two words', '--epochs', '3']" in res.stdout
    assert "RUNJOB_VAR a b;$(x)" in res.stdout
    assert "Building wheel for mpi4py" not in res.stdout  # the wheel, not compiled in the job
    assert not Path(venv.group(1)).exists()  # gone with the job
    (kept,) = (out / "logs").glob("torchbuild-run-alliance-pytorch_test.sbatch")
    assert "--no-index" in kept.read_text()


def test_run_script_without_slurm_tmpdir_uses_a_private_directory(mpi_wheelhouse, tmp_path):
    """The rendered script run by bash where no $SLURM_TMPDIR is set (a site without the prolog)."""
    house, mpi_lib = mpi_wheelhouse
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    res = run_invoke(
        "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(house), "--package",
        "runjobfixture", "--dry-run", *run_sets(mpi_lib),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    body = res.stdout.split("# dry run:")[0]
    env = {k: v for k, v in os.environ.items() if k != "SLURM_TMPDIR"}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ran = subprocess.run(["bash", "-c", body], env={**env, "TMPDIR": str(tmp)}, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "SLURM_TMPDIR is not set: the venv goes in a private temporary directory" in ran.stdout
    assert f"torchbuild: venv {tmp}/torchbuild-run." in ran.stdout
    assert "imported runjobfixture 1.0.0+computecanada" in ran.stdout
    assert list(tmp.iterdir()) == []  # removed at exit


def test_install_takes_the_wheelhouse_mpi4py_wheel(mpi_wheelhouse, tmp_path):
    """`invoke install --find-links WH --no-index` natively: mpi4py is the site's wheel, not
    compiled again, and imports against the MPI it was built with."""
    house, mpi_lib = mpi_wheelhouse
    wheel = make_wheel(tmp_path / "built", "runjobinstall", "1.0.0+computecanada", module="runjobinstall")
    prefix = tmp_path / "env"
    t0 = time.monotonic()
    res = run_invoke(
        "install", "--profile", "alliance", "--prefix", str(prefix), "--wheel", str(wheel), "--out", str(tmp_path / "out"),
        "--find-links", str(house), "--no-index", *run_sets(mpi_lib),
        env={"PATH": f"{mpi_lib.parent / 'bin'}:{os.environ['PATH']}"}, timeout=600,
    )  # fmt: skip
    print(f"\ninstall with the wheelhouse's mpi4py: {time.monotonic() - t0:.1f} s")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert re.search(r"installing mpi4py from the wheelhouse's mpi4py-[\d.]+-cp\d+-cp\d+-linux_x86_64\.whl", res.stdout)
    assert "from source" not in res.stdout
    assert re.search(r"mpi4py [\d.]+ uses: MPICH Version:", res.stdout), res.stdout[-3000:]
