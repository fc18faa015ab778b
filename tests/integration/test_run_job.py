"""The Alliance's run job (`invoke submit --run`, the seed's pytorch-test.sh) on the real
one-node Slurm, whose TaskProlog gives each job a $SLURM_TMPDIR as the Alliance's prolog does:
the job makes a venv there, installs the fixture wheel from a wheelhouse with --no-index, and
runs a script that imports it; the venv is gone after the job. The same script run where no
$SLURM_TMPDIR is set makes its venv in a private temporary directory and removes it. The same
job with an mpi4py wheel that `invoke wheelhouse --add-mpi4py` compiles (about 5 min) is in
tests/slow/test_run_job_mpi4py.py."""

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

PROBE = """import sys, runjobfixture
print("imported runjobfixture", runjobfixture.__version__, "from", runjobfixture.__file__)
print("argv", sys.argv[1:])
print("RUNJOB_VAR", __import__("os").environ.get("RUNJOB_VAR"))
"""


def fixture_wheelhouse(root: Path) -> Path:
    """A wheelhouse that `invoke wheelhouse --wheel` fills with the fixture wheel."""
    house = root / "wheelhouse"
    fixture = make_wheel(root / "built", "runjobfixture", "1.0.0+computecanada", module="runjobfixture")
    res = run_invoke("wheelhouse", "--dest", str(house), "--wheel", str(fixture))
    assert res.returncode == 0, res.stdout + res.stderr
    return house


def run_sets(extra_env: str = "", mpi: bool = False) -> list[str]:
    """The alliance profile on the stand-in: no Lmod modules, no GPU, its Python; without MPI
    (so no mpi4py in the job) unless mpi."""
    return set_args(
        [
            "runtime_modules=[]", "modules=[]", "gpus=0", "gpu_type=", "cpus=1", "mem=2G",
            # the run job's own shape (pytorch-test.sh's 6 cores, 32000M, a GPU) on the one-node Slurm
            "run_job={cpus: 1, mem: 2G, gpus: 0}",
            "python_version={}.{}".format(*sys.version_info[:2]),
            f'runtime_env={{"RUNJOB_VAR": "a b;$(x)"{extra_env}}}',
            *([] if mpi else ["mpi=none", "distributed=[gloo, nccl]"]),
        ]
    )  # fmt: skip


def submit_run_job(slurm, house: Path, script: Path, out: Path, sets: list[str]) -> tuple[str, Path]:
    """`invoke submit --run` with --wait; its output and the job's venv (gone by now), after the
    checks every run job must pass."""
    t0 = time.monotonic()
    res = run_invoke(
        "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(house), "--package",
        "runjobfixture", "--out", str(out), "--wait", "--arg", "two words", *sets, "--", "--epochs", "3",
        env=slurm.env, timeout=600,
    )  # fmt: skip
    print(f"\nrun job: {time.monotonic() - t0:.1f} s from `invoke submit --run` to its end")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert re.search(r"^job \d+ COMPLETED \(exit code 0\)", res.stdout, re.M), res.stdout[-3000:]
    # the venv was made in the job's $SLURM_TMPDIR, from the wheelhouse
    venv = re.search(r"^torchbuild: venv (\S+) \(Python ", res.stdout, re.M)
    assert venv and "/jobtmp/job." in venv.group(1), res.stdout[-3000:]
    assert "SLURM_TMPDIR is not set" not in res.stdout
    assert re.search(
        r"^imported runjobfixture 1\.0\.0\+computecanada from " + re.escape(venv.group(1)), res.stdout, re.M
    )
    assert "argv ['two words', '--epochs', '3']" in res.stdout
    assert "RUNJOB_VAR a b;$(x)" in res.stdout
    assert not Path(venv.group(1)).exists()  # gone with the job
    (kept,) = (out / "logs").glob(f"torchbuild-run-alliance-{script.stem.replace(' ', '_')}-*.sbatch")
    assert "--no-index" in kept.read_text()
    return res.stdout, Path(venv.group(1))


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    return fixture_wheelhouse(tmp_path_factory.mktemp("runjob"))


def test_list_shows_what_avail_wheels_shows(wheelhouse):
    res = run_invoke("wheelhouse", "--dest", str(wheelhouse), "--list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["name", "version", "python", "arch"]
    assert [ln.split() for ln in lines[1:]] == [["runjobfixture", "1.0.0+computecanada", "py3", "generic"]]


def test_run_job_installs_from_the_wheelhouse_into_slurm_tmpdir(slurm, wheelhouse, tmp_path):
    script = tmp_path / "pytorch test.py"
    script.write_text(PROBE)
    submit_run_job(slurm, wheelhouse, script, tmp_path / "out", run_sets())


def test_run_script_without_slurm_tmpdir_uses_a_private_directory(wheelhouse, tmp_path):
    """The rendered script run by bash where no $SLURM_TMPDIR is set (a site without the prolog)."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    res = run_invoke(
        "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(wheelhouse), "--package",
        "runjobfixture", "--dry-run", *run_sets(),
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
