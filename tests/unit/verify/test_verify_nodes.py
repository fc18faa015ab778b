"""`invoke verify --nodes N`: the job it writes (directives for N nodes, the profile's launcher,
rank.sh in the install's runtime env), the bounded wait, and how the ranks' results are told.
The real two-node run is tests/integration/test_verify_nodes.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_invoke

from torchbuild.core.errors import JobFailed, ProfileError, UsageError
from torchbuild.profile.config import resolve
from torchbuild.runtime import scheduler as sched
from torchbuild.verify import multinode
from torchbuild.verify.multinode import Shape
from torchbuild.verify.nodes import NodesRequest, prepare, rank_script, verify_nodes


def _spec(profile: str = "cpu", *sets: str):
    return resolve(profile, list(sets), arch="x86_64")


def _prefix(tmp_path: Path) -> Path:
    for part in ("activate", "python"):
        (tmp_path / "env" / "bin").mkdir(parents=True, exist_ok=True)
        (tmp_path / "env" / "bin" / part).write_text("")
    return tmp_path / "env"


def _rank(rank: int, host: str, **status: str) -> dict:
    checks = []
    for name in multinode.CHECKS:
        st = status.get(name.split()[0], "pass")
        c = {"name": name, "status": st, "detail": f"{name} {st}"}
        if st == "pass" and "all" in name:
            c["sum"] = 3
        checks.append(c)
    return {"rank": rank, "hostname": host, "local_rank": 0, "checks": checks}


def test_the_launcher_defaults_to_the_schedulers_own_and_the_profile_names_another():
    assert _spec("cpu").job_launcher == "srun"
    assert _spec("derecho").job_launcher == "mpiexec"  # PBS
    assert _spec("cpu", "launcher=mpirun").job_launcher == "mpirun"
    with pytest.raises(ProfileError, match="'aprun' is not allowed"):
        _spec("cpu", "launcher=aprun")


@pytest.mark.parametrize(
    ("launcher", "argv"),
    [
        ("srun", ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4"]),
        ("mpiexec", ["mpiexec", "-n", "8", "-ppn", "4"]),  # the Derecho seed's own
        ("mpirun", ["mpirun", "-np", "8", "--map-by", "ppr:4:node"]),
    ],
)
def test_each_launcher_starts_nodes_times_tasks_ranks(launcher, argv):
    assert sched.launcher_command(launcher, 2, 4) == argv


def test_the_slurm_job_asks_for_n_nodes_and_shares_the_cpus_among_the_ranks(tmp_path):
    spec = _spec("cpu", "cpus=8")
    job = sched.Job("v", ("true",), tmp_path, tmp_path, spec, "")
    lines = sched.nodes_scheduler_for("slurm", 3, 4).directives(job)
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --ntasks-per-node=4" in lines
    assert "#SBATCH --cpus-per-task=2" in lines and "#SBATCH --nodes=1" not in lines
    # the build's one-node job is as it was
    assert "#SBATCH --nodes=1" in sched.Slurm().directives(job)


def test_the_pbs_job_selects_n_chunks_of_mpiprocs(tmp_path):
    spec = _spec("derecho", "cpus=64", "gpus=4")
    job = sched.Job("v", ("true",), tmp_path, tmp_path, spec, "")
    lines = sched.nodes_scheduler_for("pbs", 2, 4).directives(job)
    assert any(ln.startswith("#PBS -l select=2:ncpus=64:ngpus=4") and ln.endswith(":mpiprocs=4") for ln in lines), lines


def test_rank_sh_sources_the_installs_activate_then_runs_the_rank_program(tmp_path):
    text = rank_script(Path("/shared/my env"), tmp_path, {"world_size": 2})
    assert "source '/shared/my env/bin/activate'\n" in text
    assert f"exec python {tmp_path}/rankcheck.py {tmp_path} " in text


def test_the_dry_run_prints_the_job_with_the_derecho_launcher(tmp_path, capsys):
    req = NodesRequest(_spec("derecho"), _prefix(tmp_path), Shape(2, 4), tmp_path / "out", dry_run=True)
    assert verify_nodes(req) is None
    script = capsys.readouterr().out
    assert "#PBS -l select=2:" in script and ":mpiprocs=4" in script
    assert "exec mpiexec -n 8 -ppn 4 " in script and "it would be: qsub " in script
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_prefix_that_is_no_install_is_named_before_anything_is_submitted(tmp_path):
    from torchbuild.core.errors import PathError

    req = NodesRequest(_spec(), tmp_path / "nothing", Shape(2, 1), tmp_path / "out")
    with pytest.raises(PathError, match="has no bin/activate: it is not an install"):
        verify_nodes(req)
    with pytest.raises(UsageError, match="--nodes 0 is out of range"):
        verify_nodes(NodesRequest(_spec(), _prefix(tmp_path), Shape(0, 1), tmp_path / "out"))


class _Stuck(sched.Slurm):
    def __init__(self, state: str, finished: bool = False) -> None:
        self.state, self.finished, self.cancelled = state, finished, False

    def status(self, job_id: str) -> sched.JobStatus | None:
        return sched.JobStatus(self.state, self.state == "RUNNING" or self.finished, self.finished, 0)


def test_the_wait_is_bounded_and_the_job_cancelled_then(monkeypatch):
    cancelled = []
    monkeypatch.setattr(sched, "cancel", lambda s, job_id: cancelled.append(job_id))
    now = iter(range(0, 1000, 10))
    with pytest.raises(JobFailed, match=r"job 7 was still waiting for its nodes \(PENDING\) after 30 s: cancelled"):
        sched.wait_bounded(_Stuck("PENDING"), "7", 30, clock=lambda: next(now), sleep=lambda s: None)
    assert cancelled == ["7"]
    done = sched.wait_bounded(_Stuck("COMPLETED", finished=True), "8", 30, sleep=lambda s: None)
    assert done.state == "COMPLETED"


def test_every_rank_passing_on_every_node_passes_and_nccl_without_gpu_is_skipped():
    ranks = [_rank(0, "n1", nccl="skip"), _rank(1, "n2", nccl="skip")]
    checks = {c.name: c for c in multinode.checks_of(ranks, Shape(2, 1))}
    assert checks["ranks reported"].status == "pass" and checks["nodes"].detail == "2 of 2: n1, n2"
    assert checks["gloo all_reduce"].status == "pass" and checks["nccl all_reduce"].status == "skip"
    s = multinode.summary(ranks, Shape(2, 1), list(checks.values()))
    assert s["ok"] and s["all_reduce_sum"] == 3 and s["all_reduce_correct"]
    assert multinode.summary_line(s).endswith("gloo all_reduce sum 3 (expected 3): correct")


def test_a_missing_rank_a_failed_check_or_one_node_only_fails():
    one_node = [_rank(0, "n1"), _rank(1, "n1")]
    checks = {c.name: c for c in multinode.checks_of(one_node, Shape(2, 1))}
    assert checks["nodes"].status == "fail"
    missing = {c.name: c for c in multinode.checks_of([_rank(0, "n1")], Shape(2, 1))}
    assert missing["ranks reported"].detail == "1 of 2; no result from rank 1"
    failed = {c.name: c for c in multinode.checks_of([_rank(0, "n1"), _rank(1, "n2", mpi4py="fail")], Shape(2, 1))}
    assert failed["mpi4py allreduce"].status == "fail" and failed["mpi4py allreduce"].detail.startswith("rank 1 on n2:")


def test_rankcheck_outside_a_launcher_reports_a_failed_rank(tmp_path, monkeypatch):
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if not k.startswith(("SLURM_", "PMI_", "OMPI_", "PALS_", "PMIX_"))
    }
    done = subprocess.run(
        [sys.executable, str(multinode.RANK_PROGRAM), str(tmp_path), json.dumps({"world_size": 2})],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (result,) = multinode.read_ranks(tmp_path)
    assert result["checks"][0]["name"] == "rank" and "not started by a launcher" in result["checks"][0]["detail"]
    checks = {c.name: c for c in multinode.checks_of([result], Shape(1, 1))}
    assert checks["rank"].status == "fail" and checks["gloo all_reduce"].status == "skip"


def test_the_cli_needs_a_prefix_with_nodes_and_nodes_with_a_prefix():
    res = run_invoke("verify", "--nodes", "2")
    assert res.returncode != 0 and "UsageError: --nodes needs --prefix" in res.stderr, res.stderr
    res = run_invoke("verify", "--prefix", "/x", "--installed", "torch")
    assert res.returncode != 0 and "go with --nodes N" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_the_check_script_parses_and_says_what_running_it_again_does(tmp_path, scheduler):
    spec = _spec("cpu", f"scheduler={scheduler}")
    command = (*sched.launcher_command(spec.job_launcher, 2, 1), str(tmp_path / "rank.sh"))
    job = sched.Job("torchbuild-verify-x", command, tmp_path, tmp_path, spec, "")
    script = tmp_path / "job.sh"
    script.write_text(sched.nodes_scheduler_for(scheduler, 2, 1).render(job))
    text = script.read_text()
    assert "the check runs again" in text and "the build resumes" not in text
    parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, parsed.stderr


@pytest.mark.parametrize("timeout", ["inf", "1e309", "Infinity", "1e300", "604801"])
def test_a_timeout_without_a_bound_is_refused_before_anything_is_written(tmp_path, timeout):
    """Issue 41 item 16: `verify --nodes --timeout inf` (or 1e309) was taken: an unbounded wait."""
    res = run_invoke(
        "verify", "--nodes", "2", "--prefix", str(_prefix(tmp_path)), "--out", str(tmp_path / "out"),
        "--timeout", timeout, "--dry-run",
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(f"error: UsageError: --timeout {float(timeout):g} is more than the 7 days"), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not (tmp_path / "out").exists()


def test_a_week_is_still_a_timeout(tmp_path):
    req = NodesRequest(_spec(), _prefix(tmp_path), Shape(2, 1), tmp_path / "out", timeout=604800.0, dry_run=True)
    from torchbuild.verify.nodes import check_request

    check_request(req)


class _FakeTensor:
    def __init__(self, value: float, device: str) -> None:
        self.value, self.device = value, device

    def item(self) -> float:
        return self.value


class _FakeTorch:
    """torch and torch.distributed as rankcheck uses them: a 2-rank MPI world whose all_reduce
    sums, and refuses CUDA tensors where the MPI is not CUDA-aware (ProcessGroupMPI's words)."""

    def __init__(self, gpus: int, cuda_aware: bool) -> None:
        self.gpus, self.cuda_aware, self.reduced, self.current = gpus, cuda_aware, [], None
        self.cuda = self.distributed = self

    def import_module(self, name: str):
        return self

    # torch.cuda
    def is_available(self) -> bool:
        return self.gpus > 0

    def device_count(self) -> int:
        return self.gpus

    def set_device(self, device: str) -> None:
        self.current = device

    # torch
    def tensor(self, values, device: str = "cpu") -> _FakeTensor:
        return _FakeTensor(values[0], device)

    # torch.distributed
    def is_mpi_available(self) -> bool:
        return True

    def init_process_group(self, backend: str, **kwargs) -> None:
        self.backend = backend

    def get_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 2

    def all_reduce(self, tensor: _FakeTensor) -> None:
        if tensor.device != "cpu" and not self.cuda_aware:
            raise RuntimeError("CUDA tensor detected and the MPI used doesn't have CUDA-aware MPI support")
        self.reduced.append(tensor.device)
        tensor.value = 3.0

    def barrier(self) -> None:
        pass

    def destroy_process_group(self) -> None:
        pass


@pytest.mark.parametrize(
    ("gpus", "aware", "mpi_cuda", "status", "detail"),
    [
        (4, True, True, "pass", "sum 3 over 2 ranks (expected 3) on cuda:1"),
        (4, False, True, "fail", "cuda:1: RuntimeError: CUDA tensor detected and the MPI used doesn't have CUDA-aware"),
        (4, False, False, "skip", "(the profile builds no CUDA with MPI)"),
        (0, False, True, "skip", "no GPU visible on"),
    ],
)
def test_the_mpi_check_all_reduces_a_cuda_tensor_where_a_gpu_is_visible(
    monkeypatch, gpus, aware, mpi_cuda, status, detail
):
    """Derecho's reason for MPI: CUDA-aware cray-mpich. A CPU tensor alone never exercised it."""
    from torchbuild.verify import rankcheck

    fake = _FakeTorch(gpus, aware)
    monkeypatch.setattr(rankcheck.importlib, "import_module", fake.import_module)
    expect = {"world_size": 2, "mpi": True, "mpi_cuda": mpi_cuda}
    cpu, cuda = rankcheck.torch_mpi(expect, rank=0, local=5, world=2, timeout=5)
    assert (cpu["name"], cpu["status"], cpu["sum"]) == ("mpi all_reduce", "pass", 3)
    assert cuda["name"] == "mpi all_reduce (CUDA tensor)" and cuda["status"] == status and detail in cuda["detail"]
    assert fake.reduced == (["cpu", "cuda:1"] if gpus and aware else ["cpu"])
    assert fake.current == ("cuda:1" if gpus else None)
    ranks = [{"rank": 0, "hostname": "n1", "checks": [cpu, cuda]}]
    over = {c.name: c for c in multinode.checks_of(ranks, Shape(1, 1))}
    assert over["mpi all_reduce (CUDA tensor)"].status == status


def test_a_cuda_build_with_mpi_expects_its_mpi_to_take_cuda_tensors(tmp_path):
    req = NodesRequest(resolve("derecho"), _prefix(tmp_path), Shape(2, 4), tmp_path / "out")
    _, _, profile = prepare(req)
    assert '"mpi_cuda": true' in (profile.parent / "rank.sh").read_text()
    req = NodesRequest(
        resolve("cpu", ["mpi=mpich", "distributed=[gloo, mpi]"]), _prefix(tmp_path), Shape(2, 1), tmp_path / "o"
    )
    _, _, profile = prepare(req)
    assert '"mpi_cuda": false' in (profile.parent / "rank.sh").read_text()
