"""`invoke verify --nodes N`: the distributed checks across N nodes, as a batch job.

1. a run directory under --out (a file system the nodes share) gets the rank program
   (verify/rankcheck.py) and rank.sh, which sources the install's bin/activate (the
   profile's runtime_env, as `invoke install` wrote it) and runs the program in its Python;
2. the job (runtime/scheduler.py's script: the profile's directives for N nodes, its modules) runs
   the site's launcher (the profile's `launcher`: srun, mpiexec or mpirun) over rank.sh;
3. torchbuild waits for it (at most --timeout seconds, then cancels it), reads each rank's
   result, prints a table per rank and the summary, writes the JSON report and fails
   (VerifyFailed) if any check failed.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from torchbuild.core.errors import JobFailed, PathError, UsageError, VerifyFailed, named_os_errors, writable_dir
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime import scheduler as sched
from torchbuild.runtime.manifest import write_json
from torchbuild.verify import multinode
from torchbuild.verify import step as verify

MAX_NODES = 4096
MAX_TASKS_PER_NODE = 1024
DEFAULT_TIMEOUT_S = 1800.0  # queueing included
MAX_TIMEOUT_S = 7 * 86400.0  # a week: more than any queue's wait a person would sit through
CHECK_TIMEOUT_S = 300  # one collective's, in each rank


@dataclasses.dataclass(frozen=True)
class NodesRequest:
    spec: BuildSpec
    prefix: Path  # the install `invoke install` made: bin/activate and bin/python
    shape: multinode.Shape
    out_dir: Path
    report: Path | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    dry_run: bool = False


def check_request(req: NodesRequest) -> None:
    """UsageError or PathError before anything is written or submitted."""
    shape = req.shape
    if not 1 <= shape.nodes <= MAX_NODES:
        raise UsageError(f"--nodes {shape.nodes} is out of range", hint=f"e.g. --nodes 2 (at most {MAX_NODES})")
    if not 1 <= shape.tasks_per_node <= MAX_TASKS_PER_NODE:
        raise UsageError(f"--tasks-per-node {shape.tasks_per_node} is out of range", hint="e.g. --tasks-per-node 4")
    if not req.timeout > 0:
        raise UsageError(f"--timeout {req.timeout:g} gives the job no time", hint="e.g. --timeout 1800 (seconds)")
    if not req.timeout <= MAX_TIMEOUT_S:  # inf, 1e309 (inf too) and the like: an unbounded wait
        raise UsageError(
            f"--timeout {req.timeout:g} is more than the {MAX_TIMEOUT_S // 86400:.0f} days torchbuild waits for a job",
            hint="e.g. --timeout 1800 (seconds, queueing included); the job keeps its own --walltime",
        )
    for part in ("bin/activate", "bin/python"):
        if not (req.prefix / part).exists():
            raise PathError(
                f"--prefix {req.prefix} has no {part}: it is not an install `invoke install` made",
                hint=f"make one with `invoke install --profile {req.spec.profile} --prefix DIR` on a file system the nodes share",
            )
    sched.check_job_keys(req.spec)


def rank_script(prefix: Path, run_dir: Path, expect: dict[str, Any]) -> str:
    """rank.sh: the install's runtime env (its activate), then the rank program in its Python."""
    program = run_dir / multinode.RANK_PROGRAM.name
    return (
        "#!/bin/bash\n"
        "# one rank of `invoke verify --nodes`: the install's runtime env, then the checks\n"
        f"source {shlex.quote(str(prefix / 'bin' / 'activate'))}\n"
        f"exec python {shlex.quote(str(program))} {shlex.quote(str(run_dir))} {shlex.quote(json.dumps(expect))}\n"
    )


def prepare(req: NodesRequest) -> tuple[sched.Scheduler, sched.Job, Path]:
    """The run directory (rank program, rank.sh) and the job that launches it; (scheduler, job,
    the resolved profile's path beside the script)."""
    spec, shape = req.spec, req.shape
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.monotonic_ns() % 100000:05d}"
    run_dir = req.out_dir / "verify-nodes" / stamp
    expect = {
        "world_size": shape.world_size,
        "mpi": "mpi" in spec.distributed,
        "nccl": "nccl" in spec.distributed,
        # a CUDA build with MPI: its MPI must take CUDA tensors (CUDA-aware) where GPUs are visible
        "mpi_cuda": spec.cuda and "mpi" in spec.distributed,
        "timeout": CHECK_TIMEOUT_S,
    }
    scheduler = sched.nodes_scheduler_for(spec.scheduler, shape.nodes, shape.tasks_per_node)
    launcher = sched.launcher_command(spec.job_launcher, shape.nodes, shape.tasks_per_node)
    command = (*launcher, str(run_dir / "rank.sh"))
    name = f"torchbuild-verify-{spec.profile}-{stamp}"
    job = sched.Job(name, command, run_dir, run_dir, spec, sched.job_account(spec))
    if not req.dry_run:
        writable_dir(run_dir, "--out")
        with named_os_errors(run_dir, "the run directory of `invoke verify --nodes`"):
            shutil.copyfile(multinode.RANK_PROGRAM, run_dir / multinode.RANK_PROGRAM.name)
            (run_dir / "rank.sh").write_text(rank_script(req.prefix, run_dir, expect))
            (run_dir / "rank.sh").chmod(0o755)
    return scheduler, job, run_dir / "profile.yaml"


def verify_nodes(req: NodesRequest, out: TextIO | None = None) -> dict[str, Any] | None:
    """Submit the job, wait for it (bounded), then report; VerifyFailed if a check failed,
    JobFailed if the job never ran its ranks. The report's data (None with dry_run)."""
    out = out or sys.stdout
    check_request(req)
    scheduler, job, profile_file = prepare(req)
    if req.dry_run:
        out.write(scheduler.render(job))
        print(f"# dry run: nothing written or submitted; it would be: "
              f"{sched.shell_words(scheduler.submit_args(job, scheduler.script_path(job)))}", file=out)  # fmt: skip
        return None
    submitted = sched.submit(scheduler, job, profile_file, out)
    print(f"waiting for job {submitted.job_id} (at most {req.timeout:.0f} s)", file=out, flush=True)
    status = sched.wait_bounded(scheduler, submitted.job_id, req.timeout)
    ranks = multinode.read_ranks(job.workdir)
    if not ranks:
        raise JobFailed(
            f"{scheduler.name} job {submitted.job_id} {status.state} (exit code {status.exit_code}) and no rank "
            f"reported; the last lines of {submitted.log}:\n{sched.tail(submitted.log)}",
            hint="check the launcher (`launcher` in the profile) and that --prefix and --out are on a shared file system",
            job_exit=status.exit_code,
        )
    return _report(req, job, submitted, status, ranks, out)


def _report(
    req: NodesRequest,
    job: sched.Job,
    submitted: sched.Submitted,
    status: sched.JobStatus,
    ranks: list[dict[str, Any]],
    out: TextIO,
) -> dict[str, Any]:
    checks = multinode.checks_of(ranks, req.shape)
    if status.exit_code != 0 and not any(c.status == "fail" for c in checks):
        checks.append(verify.Check("job", "fail", f"{status.state}, exit code {status.exit_code}: see {submitted.log}"))
    summary = multinode.summary(ranks, req.shape, checks)
    print(f"job {submitted.job_id} {status.state} (exit code {status.exit_code}); each rank:", file=out)
    print(multinode.rank_table(ranks), file=out)
    print(verify.render(checks), file=out)
    print(multinode.summary_line(summary), file=out)
    data = {
        **verify.report(checks, f"{req.shape.nodes} nodes x {req.shape.tasks_per_node} ranks"),
        **summary,
        "launcher": job.spec.job_launcher,
        "scheduler": job.spec.scheduler,
        "job_id": submitted.job_id,
        "job_state": status.state,
        "job_exit": status.exit_code,
        "log": str(submitted.log),
        "prefix": str(req.prefix),
        "ranks": ranks,
    }
    report = req.report or job.workdir / "verify-nodes.json"
    write_json(report, data, "verify report")
    print(f"report: {report}", file=out, flush=True)
    if not summary["ok"]:
        failed = ", ".join(c.name for c in checks if c.status == "fail")
        raise VerifyFailed(
            f"{req.shape.nodes}-node check: {failed}", hint=f"the report has each rank's detail: {report}"
        )
    return data
