"""The Alliance's run job with the site's mpi4py wheel: `invoke wheelhouse --add-mpi4py` compiles
mpi4py once against a real MPI (MPICH's PyPI wheel: its mpicc, headers and libmpi in a venv;
about 5 min on 2 cores), `--list` shows it beside the fixture wheel, the run job on the real
one-node Slurm installs it from the wheelhouse into $SLURM_TMPDIR and imports it, and
`invoke install --find-links WH --no-index` takes it instead of compiling mpi4py again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from helpers import TEST_TORCH, make_wheel, run_invoke, set_args
from integration.test_run_job import PROBE, fixture_wheelhouse, run_sets, submit_run_job

pytestmark = [pytest.mark.slurm]

MPI_PROBE = (
    PROBE
    + """import mpi4py
from mpi4py import MPI
print("mpi4py", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])
"""
)


@pytest.fixture(scope="module")
def mpi_wheelhouse(tmp_path_factory):
    """The fixture wheelhouse plus an mpi4py wheel built by `invoke wheelhouse --add-mpi4py`; the
    MPI's lib directory."""
    root = tmp_path_factory.mktemp("runjob")
    mpi = root / "mpich"
    subprocess.run([sys.executable, "-m", "venv", str(mpi)], check=True)
    subprocess.run([str(mpi / "bin" / "pip"), "install", "-q", "--only-binary", ":all:", "mpich"], check=True)
    house = fixture_wheelhouse(root)
    t0 = time.monotonic()
    res = run_invoke(
        "wheelhouse", "--dest", str(house), "--add-mpi4py", "--profile", "alliance",
        *set_args([TEST_TORCH, f"mpicc={mpi / 'bin' / 'mpicc'}", "python_version={}.{}".format(*sys.version_info[:2])]),
        timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    print(f"\nmpi4py wheel built in {time.monotonic() - t0:.0f} s")
    assert re.search(r"^added mpi4py-[\d.]+-cp\d+-cp\d+-linux_x86_64\.whl$", res.stdout, re.M), res.stdout[-2000:]
    return house, mpi / "lib"


def test_list_shows_the_mpi4py_wheel(mpi_wheelhouse):
    house, _ = mpi_wheelhouse
    res = run_invoke("wheelhouse", "--dest", str(house), "--list")
    assert res.returncode == 0, res.stderr
    rows = [ln.split() for ln in res.stdout.splitlines()[1:]]
    assert rows[0][0] == "mpi4py" and rows[0][3] == "x86_64", rows
    assert rows[1] == ["runjobfixture", "1.0.0+computecanada", "py3", "generic"]


def test_run_job_imports_the_wheelhouse_mpi4py(slurm, mpi_wheelhouse, tmp_path):
    house, mpi_lib = mpi_wheelhouse
    script = tmp_path / "pytorch test.py"
    script.write_text(MPI_PROBE)
    sets = run_sets(f', "LD_LIBRARY_PATH": "{mpi_lib}"', mpi=True)
    out, _ = submit_run_job(slurm, house, script, tmp_path / "out", sets)
    assert re.search(r"^mpi4py [\d.]+ MPICH Version:", out, re.M), out[-3000:]
    assert "Building wheel for mpi4py" not in out  # the wheel, not compiled in the job


def test_install_takes_the_wheelhouse_mpi4py_wheel(mpi_wheelhouse, tmp_path):
    """`invoke install --find-links WH --no-index` natively: mpi4py is the site's wheel, not
    compiled again, and imports against the MPI it was built with."""
    house, mpi_lib = mpi_wheelhouse
    wheel = make_wheel(tmp_path / "built", "runjobinstall", "1.0.0+computecanada", module="runjobinstall")
    prefix = tmp_path / "env"
    t0 = time.monotonic()
    res = run_invoke(
        "install", "--profile", "alliance", "--prefix", str(prefix), "--wheel", str(wheel), "--out", str(tmp_path / "out"),
        "--find-links", str(house), "--no-index", *run_sets(f', "LD_LIBRARY_PATH": "{mpi_lib}"', mpi=True),
        env={"PATH": f"{mpi_lib.parent / 'bin'}:{os.environ['PATH']}"}, timeout=600,
    )  # fmt: skip
    print(f"\ninstall with the wheelhouse's mpi4py: {time.monotonic() - t0:.1f} s")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert re.search(r"installing mpi4py from the wheelhouse's mpi4py-[\d.]+-cp\d+-cp\d+-linux_x86_64\.whl", res.stdout)
    assert "from source" not in res.stdout
    assert re.search(r"mpi4py [\d.]+ uses: MPICH Version:", res.stdout), res.stdout[-3000:]
