"""`invoke submit` against a real one-node Slurm (slurmctld, slurmd, munge: the `slurm` fixture):
the minitorch fixture built in batch jobs, natively and through the SIF, a failing job, a job
cancelled mid-build and submitted again, a refused submission and a dry run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, manifest_of, run_invoke, set_args

pytestmark = [pytest.mark.slurm]

# shell metacharacters in the output path: the script must quote it everywhere it appears
ODD_OUT = "o ut$(touch PWNED);`touch PWNED2`'&x"


def minitorch(tmp_path: Path, name: str = "minitorch") -> Path:
    tree = tmp_path / name
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    return tree


def submit(slurm, tree: Path, out: Path, cache: Path, *extra: str, sets: tuple[str, ...] = (), timeout: int = 900):
    return run_invoke(
        "submit", "--source", str(tree), "--out", str(out), "--cpus", "1", "--mem", "2G", *extra,
        *set_args([TEST_TORCH, f"cache_dir={cache}", "patches=none", *sets]),
        env=slurm.env, timeout=timeout,
    )  # fmt: skip


def job_id_of(stdout: str) -> str:
    m = re.search(r"^submitted slurm job (\d+)", stdout, re.M)
    assert m, stdout[-2000:]
    return m.group(1)


def test_wait_builds_the_wheel_natively_within_the_allocation(slurm, tmp_path):
    """--wait: the job builds and verifies the wheel; the planner takes the job's 1 core and
    2 GiB; the script is kept beside the logs, quotes the odd output path, and nothing it
    names is run by the shell."""
    tree, out, cache = minitorch(tmp_path), tmp_path / ODD_OUT, tmp_path / "cache"
    res = submit(slurm, tree, out, cache, "--engine", "native", "--wait", sets=("local_version=slurm",))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    job = job_id_of(res.stdout)
    assert re.search(rf"^job {job} started on \S+, \d+ s after submission$", res.stdout, re.M), res.stdout[-3000:]
    assert re.search(rf"^job {job} COMPLETED \(exit code 0\) after \d+ s$", res.stdout, re.M)
    (wheel,) = out.glob("minitorch-2.6.0+slurm-*.whl")
    m = manifest_of(res.stdout)
    assert m["wheel"]["name"] == wheel.name and m["engine"] == "native"
    assert json.loads(Path(f"{wheel}.verify.json").read_text())["ok"]
    log = next((out / "logs").glob(f"torchbuild-cpu-*-{job}.log")).read_text()
    # the job's allocation is what the planner planned with (SLURM_MEM_PER_NODE=2048)
    assert "jobs: 1 (auto: 1 cores (SLURM_CPUS_ON_NODE), 2.0 GiB (SLURM_MEM_PER_NODE)" in log, log[:3000]
    (script,) = (out / "logs").glob("torchbuild-cpu-*.sbatch")
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert "#SBATCH --mem=2G" in script.read_text() and "--resume" in script.read_text()
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    assert not slurm.queue()


def test_wait_builds_in_the_sif(slurm, cpu_sif, tmp_path):
    """The default runtime: the job runs the build in the SIF; the allocation reaches the
    planner inside it."""
    _, sif, _, _, sets = cpu_sif
    tree, out, cache = minitorch(tmp_path), tmp_path / "out", tmp_path / "cache"
    res = submit(
        slurm, tree, out, cache, "--sif", str(sif), "--apptainer", "docker", "--profile", "cpu", "--arch", "x86_64",
        "--wait", sets=(*sets, "local_version=slurmsif"),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    m = manifest_of(res.stdout)
    assert m["engine"] == "apptainer" and m["wheel"]["name"].startswith("minitorch-2.6.0+slurmsif-cp313")
    assert "1 cores (SLURM_CPUS_ON_NODE), 2.0 GiB (SLURM_MEM_PER_NODE)" in res.stdout
    assert json.loads((out / f"{m['wheel']['name']}.verify.json").read_text())["python"].startswith("3.13")


def test_a_failing_job_names_its_state_exit_code_and_log_tail(slurm, tmp_path):
    tree, out = minitorch(tmp_path), tmp_path / "out"
    (tree / "csrc" / "ops.cpp").write_text("this is not C++;\n")
    res = submit(slurm, tree, out, tmp_path / "cache", "--engine", "native", "--wait")
    # the job's exit code is the build's (BuildFailed, 10), and so is submit's
    assert res.returncode == 10, res.stdout[-3000:] + res.stderr
    job = job_id_of(res.stdout)
    assert f"error: JobFailed: slurm job {job} FAILED, exit code 10; the last 30 lines of" in res.stderr
    tail = [ln for ln in res.stderr.splitlines() if ln.startswith("  | ")]
    assert len(tail) == 30 and any("BuildFailed" in ln for ln in tail), res.stderr
    assert not list(out.glob("*.whl"))


def test_a_cancelled_job_submitted_again_skips_the_finished_steps(slurm, tmp_path):
    """scancel mid-build (in the fixture's slow step, after configure), then the same submit:
    the log says source and configure were skipped, and the wheel arrives. A third submit
    finds everything done."""
    tree, out, cache = minitorch(tmp_path), tmp_path / "out", tmp_path / "cache"
    sets = ("env.MINITORCH_SLOW_SECONDS=30",)
    first = submit(slurm, tree, out, cache, "--engine", "native", sets=sets)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    job = job_id_of(first.stdout)
    stamp = tree / "build" / "torchbuild-configure.json"
    deadline = time.monotonic() + 300
    while not (stamp.exists() and json.loads(stamp.read_text()).get("complete")):
        assert time.monotonic() < deadline, slurm.state(job)
        time.sleep(1)
    time.sleep(3)  # into the slow step
    assert slurm.state(job) == "RUNNING"
    # the same request while it runs: refused, naming the running job
    twice = submit(slurm, tree, out, cache, "--engine", "native", sets=sets)
    assert twice.returncode == 20 and f"job {job} of this same request" in twice.stderr, twice.stderr
    slurm.run("scancel", job)
    deadline = time.monotonic() + 120
    while slurm.queue():  # CANCELLED at once; in the queue until its processes are gone
        assert time.monotonic() < deadline, slurm.queue()
        time.sleep(1)
    assert slurm.state(job) == "CANCELLED"
    # torchbuild stopped its processes and cleaned up within Slurm's KillWait (10 s here)
    assert "error: BuildInterrupted: " in next((out / "logs").glob(f"*-{job}.log")).read_text()
    assert not list(out.glob("*.whl")) and not list(out.glob(".partial-*"))

    again = submit(slurm, tree, out, cache, "--engine", "native", "--wait", sets=sets)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr
    assert "resume: skipping source: " in again.stdout
    assert "torchbuild: skipping configure: " in again.stdout
    (wheel,) = out.glob("minitorch-2.6.0-*.whl")

    third = submit(slurm, tree, out, cache, "--engine", "native", "--wait", sets=sets)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr
    assert f"resume: skipping the build: {wheel.name}" in third.stdout
    assert f"resume: skipping verify: {wheel.name}" in third.stdout
    # the same request: one script, submitted three times
    assert len(list((out / "logs").glob("*.sbatch"))) == 1


def test_dry_run_submits_and_writes_nothing(slurm, tmp_path):
    tree, out = minitorch(tmp_path), tmp_path / "out"
    res = submit(slurm, tree, out, tmp_path / "cache", "--engine", "native", "--dry-run", "--module", "gcc/13")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --cpus-per-task=1" in res.stdout and "module load gcc/13" in res.stdout
    assert "# dry run: nothing written or submitted" in res.stdout
    assert not slurm.queue()
    assert not out.exists()


def test_a_refused_submission_names_slurms_reason_and_leaves_no_script(slurm, tmp_path):
    tree, out = minitorch(tmp_path), tmp_path / "out"
    res = submit(slurm, tree, out, tmp_path / "cache", "--engine", "native", "--partition", "nosuch")
    assert res.returncode == 20, res.stdout + res.stderr
    assert "error: SubmissionRefused: sbatch refused the job: " in res.stderr
    assert "invalid partition" in res.stderr.lower()
    assert not list((out / "logs").glob("*.sbatch")) and not list(out.rglob("*.yaml"))
    assert not slurm.queue()
