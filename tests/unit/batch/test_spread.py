"""`invoke submit --nodes N` (batch/spread.py): the job script that starts distccd on the
allocation's other nodes through the scheduler, compiles through them and stops them. The
scripts are run for real in bash with stand-ins for scontrol, srun, pbsdsh and getent (which
record what they were asked and stay up as a daemon would); the real two-node Slurm run is in
tests/integration/test_spread_nodes.py."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import fake_sif as _fake_sif
from helpers import run_invoke
from test_scheduler import _executable, _lint

from torchbuild.batch.host import Runtime, spread_scheduler_for, submit_build
from torchbuild.batch.spread import check_nodes, slots_per_node, spread_jobs, spread_lines
from torchbuild.core.errors import UsageError
from torchbuild.profile.config import resolve
from torchbuild.runtime.options import BuildOptions
from torchbuild.runtime.scheduler import Job

ADDRESSES = {"node1": "10.9.0.1", "node2": "10.9.0.2", "node3": "10.9.0.3"}
# prints what the build would see of the spread, as JSON
SHOW_ENV = (
    "import json, os; print(json.dumps(dict({k: os.environ.get(k, '') for k in "
    "('DISTCC_HOSTS', 'CCACHE_PREFIX', 'APPTAINERENV_DISTCC_HOSTS', 'APPTAINERENV_CCACHE_PREFIX', "
    "'SINGULARITYENV_DISTCC_HOSTS', 'SINGULARITYENV_DISTCC_DIR', 'DISTCC_DIR')}, "
    "lock_dir=os.path.isdir(os.environ['DISTCC_DIR']), "
    "lock_dir_mode=oct(os.stat(os.environ['DISTCC_DIR']).st_mode & 0o777))))"
)


def _spec(*sets: str, profile: str = "cpu"):
    return resolve(profile, list(sets), arch="x86_64")


@pytest.fixture
def stand_ins(tmp_path, monkeypatch) -> Path:
    """scontrol (the nodelist's hostnames), getent (ADDRESSES), srun and pbsdsh (each records
    its argv and pid under calls/, then sleeps as a daemon would) first on PATH."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    calls.mkdir()
    _executable(bin_dir / "scontrol", '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && tr , "\\n" <<<"$3"\n')
    table = "\n".join(f"  {name}) echo '{addr}   STREAM {name}';;" for name, addr in ADDRESSES.items())
    # as the real one: exit 2 for a name it cannot resolve
    _executable(bin_dir / "getent", f'#!/bin/bash\ncase "$2" in\n{table}\n  *) exit 2;;\nesac\n')
    for tool in ("srun", "pbsdsh"):
        record = f'printf "%s\\n" "$@" > {calls}/{tool}-$$.args\n'
        _executable(bin_dir / tool, f"#!/bin/bash\n{record}exec sleep 300\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return calls


def _script(tmp_path: Path, scheduler: str, nodes: int, command: tuple[str, ...], *, sif: str = "") -> Path:
    spec = _spec(f"scheduler={scheduler}", "cpus=4", "mem=16G", "mem_per_job_gb=2", "walltime=01:00:00")
    sched = spread_scheduler_for(scheduler, nodes)
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    lines = spread_lines(
        scheduler,
        nodes,
        local_slots=4,
        remote_slots=4,
        walltime_s=3600,
        sif=sif,
        log_dir=str(out / "logs"),
        id_variable=sched.id_variable,
    )
    job = Job("torchbuild-spread-test", command, tmp_path, out, spec, "", spread=tuple(lines))
    script = tmp_path / f"job-{scheduler}.sh"
    script.write_text(sched.render(job))
    return script


def _after_daemons(calls: Path, count: int, *command: str) -> tuple[str, ...]:
    """command, once count stand-in daemons have recorded themselves (else the build could end
    and stop them before they started)."""
    wait = f'for _ in $(seq 200); do [ "$(ls {calls} | wc -l)" -ge {count} ] && break; sleep 0.05; done; exec "$@"'
    return ("bash", "-c", wait, "build", *command)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _daemons(calls: Path, tool: str) -> dict[int, list[str]]:
    return {int(p.stem.split("-")[1]): p.read_text().splitlines() for p in calls.glob(f"{tool}-*.args")}


def _wait_for_daemons(calls: Path, tool: str, count: int) -> dict[int, list[str]]:
    deadline = time.monotonic() + 20
    while len(_daemons(calls, tool)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return _daemons(calls, tool)


# -------------------------------------------------------------------- the script, run for real


def _daemon_argv(args: list[str]) -> list[str]:
    """What srun / pbsdsh was asked to run on the node: from `timeout` on."""
    return args[args.index("timeout") :]


def _run_on_node(args: list[str], tmp_path: Path, **env: str) -> list[str]:
    """Run a recorded daemon command as the node would (stand-in distccd printing its argv)."""
    fake = tmp_path / "node-bin"
    _executable(fake / "distccd", '#!/bin/bash\nprintf "%s\\n" "$@"\n')
    path = f"{fake}{os.pathsep}{os.environ['PATH']}"
    ran = subprocess.run(_daemon_argv(args), capture_output=True, text=True, env={**os.environ, "PATH": path, **env},
                         timeout=30, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.splitlines()


def test_slurm_job_starts_one_daemon_per_other_node_allowed_only_the_allocation_and_stops_it(tmp_path, stand_ins):
    script = _script(tmp_path, "slurm", 3, _after_daemons(stand_ins, 1, "python3", "-c", SHOW_ENV))
    _lint(script)
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2,node3", "SLURM_JOB_ID": "4242",
           "SLURM_CPUS_PER_TASK": "6"}  # fmt: skip
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    port = 20000 + 4242
    assert seen["DISTCC_HOSTS"] == f"localhost/4 10.9.0.2:{port}/4,lzo 10.9.0.3:{port}/4,lzo"
    assert seen["CCACHE_PREFIX"] == "distcc"
    # distcc makes no directory for its locks: without one it compiles every unit locally
    assert seen["lock_dir"] and seen["lock_dir_mode"] == "0o700"
    assert not Path(seen["DISTCC_DIR"]).exists()  # removed with the daemons
    (pid, args), *more = _daemons(stand_ins, "srun").items()
    assert not more  # one srun step starts them all
    assert args[:7] == ["--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node2,node3",
                        "--export=ALL", "--cpus-per-task=6"]  # fmt: skip
    allowed = [args[i + 1] for i, a in enumerate(args) if a == "--allow"]
    assert allowed == ["10.9.0.1/32", "10.9.0.2/32", "10.9.0.3/32"]  # the allocation's nodes, no other
    assert _daemon_argv(args)[:3] == ["timeout", "--kill-after=30", "3600"]  # bounded by the walltime
    assert args[args.index("--port") + 1] == str(port)
    assert not _alive(pid)  # stopped when the build ended
    # each daemon listens on its own node's address, as resolved on the first node
    for node, addr in (("node2", "10.9.0.2"), ("node3", "10.9.0.3")):
        argv = _run_on_node(args, tmp_path, SLURMD_NODENAME=node)
        assert argv[argv.index("--listen") + 1] == addr and argv.count("--listen") == 1


def test_srun_steps_ask_for_the_job_cpus_per_task_again(tmp_path, stand_ins):
    """Slurm 22.05 to 23.02: a step does not inherit SLURM_CPUS_PER_TASK, and with ConstrainCores
    each daemon's --jobs compiles would share one core."""
    script = _script(tmp_path, "slurm", 2, _after_daemons(stand_ins, 1, "true"))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "12", "SLURM_CPUS_PER_TASK": "16"}
    assert subprocess.run(["bash", str(script)], env=env, timeout=60, check=False).returncode == 0
    [args] = _daemons(stand_ins, "srun").values()
    assert "--cpus-per-task=16" in args[: args.index("timeout")]


def test_srun_steps_get_the_script_environment_under_export_none(tmp_path, stand_ins):
    """sbatch --export=NONE (export_env false) leaves SLURM_EXPORT_ENV=NONE in the job, which
    srun takes as its own --export: the step must ask for the script's environment (PATH, the
    module loads) itself."""
    script = _script(tmp_path, "slurm", 2, _after_daemons(stand_ins, 1, "true"))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "13", "SLURM_EXPORT_ENV": "NONE"}
    assert subprocess.run(["bash", str(script)], env=env, timeout=60, check=False).returncode == 0
    [args] = _daemons(stand_ins, "srun").values()
    assert "--export=ALL" in args[: args.index("timeout")]


def test_the_job_says_how_many_units_the_other_nodes_compiled(tmp_path, stand_ins):
    log = tmp_path / "out" / "logs" / "distcc-31-daemons.log"
    lines = "".join(f"distccd[9] (dcc_job_summary) client: 10.9.0.1:4{i} COMPILE_OK exit:0\n" for i in range(3))
    write = f"printf %s {shlex.quote(lines)} >> {shlex.quote(str(log))}"
    script = _script(tmp_path, "slurm", 2, _after_daemons(stand_ins, 1, "bash", "-c", write))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "31"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert f"the other nodes compiled 3 units (distccd's log: {log})" in run.stdout
    assert "warning" not in run.stderr


def test_the_job_warns_when_the_other_nodes_compiled_nothing(tmp_path, stand_ins):
    script = _script(tmp_path, "slurm", 2, _after_daemons(stand_ins, 1, "true"))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "32"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert "warning: the other nodes compiled no unit: every compile ccache missed ran on this node" in run.stderr


def test_nodes_that_resolve_to_loopback_get_no_compiles_and_the_first_allows_its_real_address(
    tmp_path, stand_ins, monkeypatch
):
    """Debian's /etc/hosts maps a node's own name to 127.0.1.1: node1's allowed address is then
    one of its others (hostname -I), and node3 resolving to loopback here is left out."""
    bin_dir = tmp_path / "bin"
    table = "\n".join(f"  {name}) echo '{addr}   STREAM {name}';;" for name, addr in
                      {"node1": "127.0.1.1", "node2": "10.9.0.2", "node3": "127.0.0.1"}.items())  # fmt: skip
    _executable(bin_dir / "getent", f'#!/bin/bash\ncase "$2" in\n{table}\n  *) exit 2;;\nesac\n')
    _executable(
        bin_dir / "hostname", '#!/bin/bash\n[ "$1" = -I ] && echo "127.0.1.1 10.9.0.1 fd00::1 " || echo node1\n'
    )
    script = _script(tmp_path, "slurm", 3, _after_daemons(stand_ins, 1, "python3", "-c", SHOW_ENV))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2,node3", "SLURM_JOB_ID": "33"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "node node3 resolves to the loopback address 127.0.0.1 here: no compiles go to it" in run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["DISTCC_HOSTS"] == "localhost/4 10.9.0.2:20033/4,lzo"
    [args] = _daemons(stand_ins, "srun").values()
    assert "--nodelist=node2" in args and "--nodes=1" in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--allow"] == ["10.9.0.1/32", "10.9.0.2/32"]


def test_a_node_without_an_address_is_named_in_the_log_before_the_job_stops(tmp_path, stand_ins):
    script = _script(tmp_path, "slurm", 2, ("touch", str(tmp_path / "built")))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,ghost", "SLURM_JOB_ID": "34"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 1
    assert "torchbuild: node ghost has no IPv4 address" in run.stderr
    assert not (tmp_path / "built").exists() and not _daemons(stand_ins, "srun")


def test_distcc_dir_is_the_job_own_fresh_directory(tmp_path, stand_ins):
    """Another user's (or an earlier job's) directory at a predictable path is neither used nor removed."""
    theirs = Path("/tmp/torchbuild-distcc-35")
    theirs.mkdir(exist_ok=True)
    (theirs / "keep").write_text("")
    try:
        script = _script(tmp_path, "slurm", 2, _after_daemons(stand_ins, 1, "python3", "-c", SHOW_ENV))
        env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "35"}
        run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
        assert run.returncode == 0, run.stderr
        seen = json.loads(run.stdout.strip().splitlines()[-1])
        assert seen["DISTCC_DIR"] != str(theirs) and seen["lock_dir"]
        assert not Path(seen["DISTCC_DIR"]).exists() and (theirs / "keep").exists()
    finally:
        (theirs / "keep").unlink()
        theirs.rmdir()


def test_a_failed_build_still_stops_the_daemons_and_keeps_its_exit_code(tmp_path, stand_ins):
    script = _script(tmp_path, "slurm", 2, _after_daemons(stand_ins, 1, "bash", "-c", "exit 7"))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "5"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 7, run.stderr
    [pid] = _daemons(stand_ins, "srun")
    assert not _alive(pid)


def test_a_cancelled_job_stops_the_daemons(tmp_path, stand_ins):
    # the build marks that it runs, then sleeps: the cancel comes while the build runs, as scancel's
    # does; a TERM in the instant bash forks the build reaches the child before its exec, which
    # drops it (bash's own window: Slurm's KillWait SIGKILL ends such a job), and this test waited
    # 30 s on it under load
    started = tmp_path / "build-started"
    build = ("bash", "-c", f"touch {started}; exec sleep 300")
    script = _script(tmp_path, "slurm", 2, build)
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "6"}
    job = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    try:
        [pid] = _wait_for_daemons(stand_ins, "srun", 1)
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGTERM)  # as scancel signals the batch step's processes
        assert job.wait(timeout=30) != 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_pbs_job_reads_the_node_file_once_per_node_and_starts_a_daemon_on_each_other(tmp_path, stand_ins):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node1\nnode1\nnode2\nnode2\nnode3\nnode3\n")  # PBS: a line per rank
    script = _script(tmp_path, "pbs", 3, _after_daemons(stand_ins, 2, "python3", "-c", SHOW_ENV))
    _lint(script)
    env = {**os.environ, "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "77.pbs01"}  # PBS's ids: NNNN.server
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["DISTCC_HOSTS"] == "localhost/4 10.9.0.2:20077/4,lzo 10.9.0.3:20077/4,lzo"
    log = str(tmp_path / "out" / "logs" / "distcc-77-daemons.log")  # the id's number names the log
    daemons = _daemons(stand_ins, "pbsdsh")
    assert all(args[args.index("timeout") - 1] == log for args in daemons.values())  # each task writes it
    assert sorted(args[:2] for args in daemons.values()) == [["-n", "1"], ["-n", "2"]]
    for pid, args in daemons.items():
        assert [args[i + 1] for i, a in enumerate(args) if a == "--allow"] == [
            "10.9.0.1/32", "10.9.0.2/32", "10.9.0.3/32"]  # fmt: skip
        assert not _alive(pid)
        argv = _run_on_node(args, tmp_path)  # pbsdsh's task: its own node's address, as an argument
        assert argv[argv.index("--listen") + 1] == {"1": "10.9.0.2", "2": "10.9.0.3"}[args[1]]


def test_pbs_tasks_write_their_daemons_output_into_the_log_and_find_the_runtime_without_the_path(tmp_path, stand_ins):
    """pbsdsh passes none of a task's output back and gives it the job's starting environment,
    not the script's module-loaded PATH: its stand-in here runs the task so, and each daemon
    (in the SIF, through a runtime only the script's PATH has) still logs its compile."""
    bin_dir, log = tmp_path / "bin", tmp_path / "out" / "logs" / "distcc-78-daemons.log"
    record = f'printf "%s\\n" "$@" > {stand_ins}/pbsdsh-$$.args\n'
    # -n I --, then the task, without the script's PATH and with its output dropped
    _executable(
        bin_dir / "pbsdsh", f'#!/bin/bash\n{record}shift 3\nexec env -i PATH=/usr/bin:/bin "$@" >/dev/null 2>&1\n'
    )
    daemon = 'echo "distccd[1] (dcc_job_summary) client: 10.9.0.1:1 COMPILE_OK exit:0" >&2; exec sleep 300'
    _executable(bin_dir / "apptainer", f"#!/bin/bash\n{daemon}\n")
    wait = (
        f'for _ in $(seq 200); do [ "$(grep -c COMPILE_OK {shlex.quote(str(log))})" -ge 2 ] && break; sleep 0.05; done'
    )
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node1\nnode2\nnode3\n")
    script = _script(tmp_path, "pbs", 3, ("bash", "-c", wait), sif="/shared/torch.sif")
    _lint(script)
    env = {**os.environ, "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "78.pbs01"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"the other nodes compiled 2 units (distccd's log: {log})" in run.stdout, run.stderr
    assert not any(_alive(pid) for pid in _daemons(stand_ins, "pbsdsh"))


def test_an_allocation_with_fewer_nodes_than_asked_stops_before_the_build(tmp_path, stand_ins):
    script = _script(tmp_path, "slurm", 3, ("touch", str(tmp_path / "built")))
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "8"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 1
    assert "the allocation lists 2 nodes, not 3" in run.stderr
    assert not (tmp_path / "built").exists() and not _daemons(stand_ins, "srun")


@pytest.mark.parametrize(("runtime", "prefix"), [("apptainer", "APPTAINERENV"), ("singularity", "SINGULARITYENV")])
def test_the_daemons_run_in_the_sif_through_the_runtime_the_node_has(tmp_path, stand_ins, runtime, prefix):
    _executable(tmp_path / "bin" / runtime, "#!/bin/bash\nexit 0\n")
    command = _after_daemons(stand_ins, 1, "python3", "-c", SHOW_ENV)
    script = _script(tmp_path, "slurm", 2, command, sif="/shared/torch.sif")
    _lint(script)
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "9"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    [args] = _daemons(stand_ins, "srun").values()
    start = args.index("-c") + 4  # after bash -c's script, its $0 and the nodes' addresses
    found = str(tmp_path / "bin" / runtime)  # its path: a PBS task lacks the script's module-loaded PATH
    assert args[start : start + 5] == [found, "exec", "--cleanenv", "/shared/torch.sif", "distccd"]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    other = "SINGULARITYENV" if prefix == "APPTAINERENV" else "APPTAINERENV"
    assert seen[f"{prefix}_DISTCC_HOSTS"] == seen["DISTCC_HOSTS"]  # reaches the build in the SIF
    assert not seen[f"{other}_DISTCC_HOSTS"]  # apptainer warns of SINGULARITYENV_*
    if prefix == "SINGULARITYENV":
        assert seen["SINGULARITYENV_DISTCC_DIR"] == seen["DISTCC_DIR"]


def test_the_daemons_in_the_sif_need_a_container_runtime_on_the_node(tmp_path, stand_ins, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin")
    script = _script(tmp_path, "slurm", 2, ("touch", str(tmp_path / "built")), sif="/shared/torch.sif")
    env = {**os.environ, "SLURM_JOB_NODELIST": "node1,node2", "SLURM_JOB_ID": "10"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 1
    assert "neither apptainer nor singularity is on PATH" in run.stderr
    assert not (tmp_path / "built").exists() and not _daemons(stand_ins, "srun")


# -------------------------------------------------------------------- sizing and the job's shape


def test_slots_follow_cores_unless_memory_allows_fewer():
    assert slots_per_node(_spec("cpus=16", "mem_per_job_gb=2"), 64 * 1024) == 16
    assert slots_per_node(_spec("cpus=16", "mem_per_job_gb=4"), 32 * 1024) == 8
    assert slots_per_node(_spec("cpus=16"), 0) == 16  # no memory asked for: the cores
    assert spread_jobs(4, 8, 8) == 32
    assert spread_jobs(3, 2, 8) == 18  # the build's node's own slots, then each other's


def test_a_numeric_max_jobs_caps_each_nodes_slots(tmp_path):
    """Without --nodes max_jobs caps the build; with them it caps every node's slots (16 each
    on 64 cores), where it was ignored (MAX_JOBS was nodes x cores)."""
    assert slots_per_node(_spec("cpus=64", "max_jobs=16"), 0) == 16
    assert slots_per_node(_spec("cpus=8", "max_jobs=16"), 0) == 8  # the cores stay a bound
    script = _dry(tmp_path, 3, "scheduler=slurm", "cpus=64", "mem=256G", "max_jobs=16")
    assert "--jobs=48" in script and 'DISTCC_HOSTS="localhost/16 ' in script and "/16,lzo" in script


def test_a_cuda_spread_sizes_the_build_node_for_nvcc_and_the_others_for_cxx(tmp_path):
    """nvcc's .cu units never leave the build's node: 64 cores, 256 GiB, CUDA peak 5 GiB gives
    it 51 slots (as the one-node plan), not 64 (320 GiB); the other node keeps 64 at 1.5 GiB."""
    spec = _spec("cpus=64", "mem=256G", "mem_per_job_gb=1.5", "mem_per_cuda_job_gb=5", profile="cuda")
    assert slots_per_node(spec, 256 * 1024, local=True) == 51
    assert slots_per_node(spec, 256 * 1024) == 64
    cpu = _spec("cpus=64", "mem=256G", "mem_per_job_gb=1.5", "mem_per_cuda_job_gb=5")
    assert slots_per_node(cpu, 256 * 1024, local=True) == 64  # no nvcc: the C++ peak everywhere
    script = _dry(tmp_path, 2, "scheduler=slurm", "cpus=64", "mem=256G", "mem_per_cuda_job_gb=5", profile="cuda")
    assert "--jobs=115" in script  # 51 here + 64 on the other node
    assert 'DISTCC_HOSTS="localhost/51 ' in script and "/64,lzo" in script and "--jobs 64 --log-stderr" in script


def _dry(
    tmp_path: Path, nodes: int, *sets: str, jobs: int = 0, runtime: Runtime | None = None, profile: str = "cpu"
) -> str:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    out = io.StringIO()
    submit_build(
        _spec(*sets, profile=profile), runtime or Runtime("native"), source=str(src), ref="", out_dir=str(tmp_path / "out"),
        options=BuildOptions(jobs=jobs), verify=True, dry_run=True, nodes=nodes, out=out,
    )  # fmt: skip
    text = out.getvalue().split("# dry run:", 1)[0]
    return text[text.index("#!/bin/bash") :]


def test_submit_nodes_asks_slurm_for_the_nodes_and_sizes_max_jobs_to_them(tmp_path):
    script = _dry(tmp_path, 3, "scheduler=slurm", "cpus=8", "mem=32G", "mem_per_job_gb=2")
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    assert "#SBATCH --cpus-per-task=8\n" in script
    assert "#SBATCH --exclusive\n" in script  # distccd has no per-user auth: nobody else on the nodes
    assert "--jobs=24" in script  # 3 nodes x 8 slots
    assert "\nexec " not in script  # the trap must outlive the build
    assert "the build resumes" in script  # still a build's job (not verify's comment)
    path = tmp_path / "job.sh"
    path.write_text(script)
    _lint(path)


def test_submit_nodes_keeps_a_given_jobs_and_pbs_asks_for_the_chunks(tmp_path):
    script = _dry(tmp_path, 2, "scheduler=pbs", "cpus=8", jobs=5)
    assert "#PBS -l select=2:ncpus=8" in script and ":mpiprocs=1" in script
    assert "#PBS -l place=scatter:excl\n" in script  # whole nodes, each chunk on its own
    assert "--jobs=5" in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    _lint(path)


def test_submit_nodes_apptainer_runs_the_daemons_from_the_sif(tmp_path):
    sif = _fake_sif(tmp_path / "t.sif")
    script = _dry(tmp_path, 2, "scheduler=slurm", runtime=Runtime("apptainer", str(sif)))
    assert f'"$tb_runtime" exec --cleanenv {sif} distccd' in script


def test_one_node_job_is_unchanged(tmp_path):
    script = _dry(tmp_path, 1, "scheduler=slurm")
    assert "#SBATCH --nodes=1\n" in script and "distcc" not in script and "\nexec " in script
    assert "--exclusive" not in script


@pytest.mark.parametrize(("nodes", "engine", "apptainer"), [(0, "native", "auto"), (2, "docker", "auto"),
                                                            (2, "apptainer", "docker")])  # fmt: skip
def test_nodes_no_spread_can_use_is_a_usage_error(nodes, engine, apptainer):
    with pytest.raises(UsageError):
        check_nodes(nodes, engine, apptainer)


def test_invoke_submit_nodes_with_docker_says_what_to_do(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    res = run_invoke("submit", "--dry-run", "--nodes", "2", "--engine", "docker", "--source", str(src), timeout=120)
    assert res.returncode != 0
    assert "--nodes spreads compiles" in res.stderr and "Traceback" not in res.stderr
