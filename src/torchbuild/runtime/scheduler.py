"""The batch systems: Slurm (sbatch) and PBS Professional (qsub), driven the same way.

    render   a batch script: directives from the profile's job keys (scope: job in
             defaults.yaml), `module load`, then the job's command, every value shell-quoted;
             the resolved profile is written beside it, so the job runs exactly what was submitted
    submit   keep the script beside the logs (out/logs/<name>.sbatch | .pbs) and submit it
    follow   (--wait) print the job's log as it grows; at the end, exit with the job's code

Also: the schedulers' answers read (sbatch --parsable, scontrol, sacct, qstat -F json), the job
keys checked (walltime, mem), jobs over N nodes of M ranks (`SlurmNodes`, `PbsNodes`) and the
launcher's command line, a bounded wait that cancels, and the rounds record a job that goes on
over allocations starts from (its supervisor is batch/rounds.py). What a job runs is its
feature's: the build job and run jobs (batch/host.py), the multi-node check (verify/nodes.py).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import pwd
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

from torchbuild import __version__
from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.console import printable
from torchbuild.core.dirs import make_dirs
from torchbuild.core.errors import (
    BuildInterrupted,
    JobFailed,
    PathError,
    ProfileError,
    SubmissionRefused,
    ToolMissing,
    UsageError,
    named_os_errors,
)
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.profile.config import BuildSpec, check_value, profile_text

TAIL_LINES = 30
# characters a path may not hold to be named in a directive line (sbatch reads a double-quoted
# value; PBS reads up to whitespace, and host:path); Slurm's own filename patterns (%j) are escaped
_DIRECTIVE_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f]')
# PBS also reads -o as [host:]path: a colon would name a host
_PBS_UNSAFE = re.compile(r"[\s\"'\\#:\x00-\x1f\x7f]")
# a directive (the profile's `directives`, --directive) is one line of text: a NUL or another
# control character would be written into the script as it is
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
JOB_ID = re.compile(r"[A-Za-z0-9_.\[\]-]+")
_WALLTIME = re.compile(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)")
# Slurm's --time forms: days-hours[:minutes[:seconds]], or minutes[:seconds], hours:minutes:seconds
_SLURM_TIME = re.compile(r"(?:(\d+)-(\d+)(?::(\d+))?(?::(\d+))?|(\d+)(?::(\d+))?(?::(\d+))?)")
_MEM = re.compile(r"(\d+)([KMGT]?)")
# the largest job torchbuild asks a scheduler for: far above any one node (a job is one node),
# far below the numbers a scheduler would overflow on (Slurm's counts are 32-bit)
MAX_MEM_MB = 1024**3  # 1 PiB
MAX_WALLTIME_DAYS = 366
_MEM_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}


@dataclasses.dataclass(frozen=True)
class Job:
    """One batch job: what it asks the scheduler for and the command it runs."""

    name: str
    command: tuple[str, ...]  # argv run in the job
    workdir: Path  # the job starts here
    out_dir: Path  # the build's --out; the script and the job's log go to its logs/
    spec: BuildSpec  # the resolved profile: its job keys are the directives
    account: str  # the profile's, else $SLURM_ACCOUNT / $PBS_ACCOUNT
    dependency: str = ""  # run after this job id succeeded
    # argvs run first, in order, each stopping the job when it fails (`torchbuild comms`)
    first: tuple[tuple[str, ...], ...] = ()
    # shell lines run before the command (spread.spread_lines: daemons on the other nodes, stopped
    # by their trap when the script exits, so the command is not exec'd)
    spread: tuple[str, ...] = ()
    # the profile's job_rounds > 0: the rounds record beside the script (batch/rounds.py), and the
    # command runs under the rounds supervisor, in the background so the warning signal's trap runs
    rounds: Path | None = None

    @property
    def logs(self) -> Path:
        return self.out_dir / "logs"


@dataclasses.dataclass(frozen=True)
class JobStatus:
    state: str  # the scheduler's word: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...
    running: bool  # started (running or finishing)
    finished: bool
    exit_code: int | None = None  # of the batch script, once finished
    node: str = ""
    queued_s: float | None = None  # submission to start, by the scheduler's clock
    ran_s: float | None = None  # start to end (or now)


class Scheduler(abc.ABC):
    name: ClassVar[str]
    submit_tool: ClassVar[str]
    suffix: ClassVar[str]
    cancel_tool: ClassVar[str]

    # ---------------------------------------------------------------- the script
    def render(self, job: Job) -> str:
        spec = job.spec
        directives = self.directives(job)
        for line in directives:
            bad = CONTROL_CHARS.search(line)
            if bad:
                raise ProfileError(
                    f"the directive {line!r} holds the control character {bad.group()!r}",
                    hint="write each directive (--directive, the profile's `directives`) as one line of plain text",
                )
        lines = [
            "#!/bin/bash --login" if spec.modules else "#!/bin/bash",
            *directives,
            f"# torchbuild {__version__}: {job.name}, profile {spec.profile} (sha256 {spec.hash[:16]})",
            f"# submit it again with `{self.resubmit(job)}` (or the same `invoke submit`):",
            "# the build resumes, skipping the steps an earlier job finished.",
            "set -eo pipefail",
            f'echo "torchbuild: {self.name} job ${{{self.id_variable}:-?}} on $(hostname) at $(date -Is)"',
        ]
        if spec.purge_command:
            lines.append(spec.purge_command)
        if spec.modules:
            lines.append(shell_words(["module", "load", *spec.modules]))
            lines.append("module list 2>&1")
        lines.append(f"cd {shlex.quote(str(job.workdir))}")
        lines += [" \\\n  ".join(arg_lines(command)) for command in job.first]
        lines += job.spread
        if job.rounds is not None:
            return "\n".join([*lines, *_rounds_lines(job)]) + "\n"
        lines.append(("" if job.spread else "exec ") + " \\\n  ".join(arg_lines(job.command)))
        return "\n".join(lines) + "\n"

    @property
    @abc.abstractmethod
    def id_variable(self) -> str: ...

    def script_path(self, job: Job) -> Path:
        return job.logs / f"{job.name}{self.suffix}"

    def resubmit(self, job: Job) -> str:
        """The command line that submits the kept script again by hand."""
        args = self.submit_args(dataclasses.replace(job, dependency=""), self.script_path(job))
        return shell_words([a for a in args if a != "--parsable"])

    @abc.abstractmethod
    def directives(self, job: Job) -> list[str]: ...

    @abc.abstractmethod
    def log_path(self, job: Job, job_id: str = "") -> Path:
        """The job's output file; with job_id "" the pattern the directive names."""

    # ---------------------------------------------------------------- submitting
    @abc.abstractmethod
    def submit_args(self, job: Job, script: Path) -> list[str]: ...

    @abc.abstractmethod
    def parse_submitted(self, stdout: str) -> str: ...

    def submit(self, job: Job, script: Path) -> str:
        """Submit script; the job id, or SubmissionRefused with the scheduler's own words."""
        args = self.submit_args(job, script)
        try:
            done = run_captured(args, cwd=job.workdir)  # no deadline: a job a late answer submitted would run twice
        except FileNotFoundError:
            raise self.missing() from None
        if done.returncode != 0:
            said = _said(done.stderr or done.stdout)
            raise SubmissionRefused(
                f"{self.submit_tool} refused the job: {said or f'exit code {done.returncode}'}",
                hint=f"fix what {self.submit_tool} names (account, partition/queue, qos, limits) with --set or the "
                "submit options; --dry-run shows the script",
            )
        job_id = self.parse_submitted(done.stdout)
        if not JOB_ID.fullmatch(job_id):
            raise SubmissionRefused(f"{self.submit_tool} answered {done.stdout.strip()!r}, which names no job id")
        return job_id

    def missing(self) -> ToolMissing:
        return ToolMissing(
            f"{self.submit_tool} is not on PATH: this host cannot submit {self.name} jobs",
            hint=f"run on a login node of a {self.name} cluster (or `module load {self.name}`); "
            "--dry-run prints the script without submitting",
        )

    @abc.abstractmethod
    def active(self, name: str) -> list[str]:
        """Ids of this user's queued or running jobs named name (best effort: [] if unknown)."""

    # ---------------------------------------------------------------- following
    @abc.abstractmethod
    def status(self, job_id: str) -> JobStatus | None:
        """The job's state now; None when the scheduler no longer knows it."""


def _rounds_lines(job: Job) -> list[str]:
    """The build under the rounds supervisor (batch/rounds.py): in the background, so that bash
    runs the trap that hands Slurm's warning signal (--signal=B:USR1, to the batch shell only) on
    to it; the script ends with the supervisor's exit code (bash keeps a reaped child's status)."""
    assert job.rounds is not None
    command = [sys.executable, "-m", "torchbuild.batch.rounds", str(job.rounds), "--", *job.command]
    return [
        "# the build goes on in a new allocation when the walltime comes (profile key job_rounds)",
        "trap 'kill -USR1 \"$tb_pid\" 2>/dev/null' USR1",
        " \\\n  ".join(arg_lines(command)) + " &",
        "tb_pid=$!",
        'while kill -0 "$tb_pid" 2>/dev/null; do wait "$tb_pid" || :; done',
        'wait "$tb_pid"',
    ]


def _query(args: list[str]) -> list[str]:
    """The words a query tool prints; [] when it is missing or fails (best effort)."""
    try:
        done = run_captured(args, timeout=QUERY_TIMEOUT)
    except OSError:
        return []
    return done.stdout.split() if done.returncode == 0 else []


def shell_words(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def arg_lines(command: Sequence[str]) -> list[str]:
    """The command as lines for the script: the program and task on the first, then each
    option with its value."""
    lines: list[str] = []
    for word in command:
        quoted = shlex.quote(word)
        value = not word.startswith("--")
        if lines and value and (len(lines) == 1 or (lines[-1].startswith("--") and " " not in lines[-1])):
            lines[-1] += " " + quoted
        else:
            lines.append(quoted)
    return lines


def _said(text: str) -> str:
    """The scheduler's message, without its program prefixes, on one line."""
    parts = [re.sub(r"^(sbatch|qsub)(: error)?:\s*", "", ln.strip()) for ln in text.splitlines() if ln.strip()]
    return "; ".join(parts)


def directive_path(path: Path, scheduler: str) -> str:
    text = str(path)
    bad = (_PBS_UNSAFE if scheduler == "pbs" else _DIRECTIVE_UNSAFE).search(text)
    if bad:
        raise PathError(
            f"--out {path} cannot be named in a {scheduler} directive: it holds {bad.group()!r}",
            hint="choose an output directory without quotes, backslashes or control characters"
            + (" (PBS: nor whitespace, # or :, which PBS reads as host:path)" if scheduler == "pbs" else ""),
        )
    return text


class Slurm(Scheduler):
    name = "slurm"
    submit_tool = "sbatch"
    suffix = ".sbatch"
    cancel_tool = "scancel"
    id_variable = "SLURM_JOB_ID"

    def directives(self, job: Job) -> list[str]:
        s = job.spec
        # Slurm expands %-patterns in the whole path: the directory's own % are doubled
        log = directive_path(job.logs, "slurm").replace("%", "%%") + "/" + self.log_path(job).name
        d = [
            f"--job-name={job.name}",
            f'--output="{log}"',
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={s.cpus}",
            f"--time={s.walltime}",
        ]
        if s.mem:
            d.append(f"--mem={s.mem}")
        if job.account:
            d.append(f"--account={job.account}")
        if s.partition:
            d.append(f"--partition={s.partition}")
        if s.qos:
            d.append(f"--qos={s.qos}")
        if s.gpus:
            d.append(f"--gres=gpu:{s.gpu_type + ':' if s.gpu_type else ''}{s.gpus}")
        if s.constraint:
            d.append(f"--constraint={s.constraint}")
        if s.reservation:
            d.append(f"--reservation={s.reservation}")
        if job.rounds is not None:
            # the warning before the limit goes to the batch shell (B:), whose trap hands it to the
            # rounds supervisor; requeued, the job keeps its id and appends to the same log
            d += [f"--signal=B:USR1@{s.job_round_warning_s}", "--requeue", "--open-mode=append"]
        d += s.directives
        return [f"#SBATCH {x}" for x in d]

    def log_path(self, job: Job, job_id: str = "") -> Path:
        return job.logs / f"{job.name}-{job_id or '%j'}.log"

    def submit_args(self, job: Job, script: Path) -> list[str]:
        args = ["sbatch", "--parsable"]
        if not job.spec.export_env:
            # on the command line: some sites (ARCHER2) ignore --export written in the script
            args.append("--export=NONE")
        if job.dependency:
            args.append(f"--dependency=afterok:{job.dependency}")
        return [*args, str(script)]

    def parse_submitted(self, stdout: str) -> str:
        return stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"

    def active(self, name: str) -> list[str]:
        user = os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name
        return _query(["squeue", "-h", f"--user={user}", f"--name={name}", "-o", "%i"])

    def status(self, job_id: str) -> JobStatus | None:
        shown = run_captured(["scontrol", "show", "job", "-o", job_id], timeout=QUERY_TIMEOUT)
        if shown.returncode == 0 and "JobState=" in shown.stdout:
            return slurm_status(scontrol_fields(shown.stdout))
        acct = run_captured(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList"], timeout=QUERY_TIMEOUT
        )
        rows = [r.split("|") for r in acct.stdout.splitlines() if r.count("|") == 2] if acct.returncode == 0 else []
        if not rows:
            return None
        state, code, node = rows[0]
        return slurm_status({"JobState": (state.split() or ["UNKNOWN"])[0], "ExitCode": code, "NodeList": node})


def scontrol_fields(text: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (values may hold spaces: Command=, WorkDir=)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:^|\s)([A-Za-z:/]+)=(.*?)(?=\s[A-Za-z:/]+=|\s*$)", text)}


_SLURM_WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
_SLURM_ACTIVE = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}


def slurm_status(fields: Mapping[str, str]) -> JobStatus:
    state = fields.get("JobState", "UNKNOWN")
    finished = state not in _SLURM_WAITING | _SLURM_ACTIVE
    code: int | None = None
    exit_field = fields.get("ExitCode", "")
    if finished and re.fullmatch(r"\d+:\d+", exit_field):
        status, signal = (int(x) for x in exit_field.split(":"))
        code = 128 + signal if signal and not status else status
    node = fields.get("NodeList", "")
    started = state in _SLURM_ACTIVE or finished
    queued = _between(fields.get("SubmitTime", ""), fields.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S")
    return JobStatus(
        state,
        started,
        finished,
        code,
        "" if node in ("(null)", "None assigned") else node,
        queued if started else None,
        _duration(fields.get("RunTime") or fields.get("Elapsed", "")),
    )


def _between(first: str, second: str, fmt: str) -> float | None:
    try:
        return max(0.0, time.mktime(time.strptime(second, fmt)) - time.mktime(time.strptime(first, fmt)))
    except ValueError:
        return None


def _duration(text: str) -> float | None:
    """[D-]HH:MM:SS (Slurm's RunTime, PBS's walltime used) in seconds."""
    m = _WALLTIME.fullmatch(text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(x or 0) for x in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


class Pbs(Scheduler):
    """PBS Professional (and OpenPBS): qsub, qstat -f -F json."""

    name = "pbs"
    submit_tool = "qsub"
    suffix = ".pbs"
    cancel_tool = "qdel"
    id_variable = "PBS_JOBID"

    def directives(self, job: Job) -> list[str]:
        s = job.spec
        chunk = f"select=1:ncpus={s.cpus}"
        if s.gpus:
            chunk += f":ngpus={s.gpus}"
            if s.gpu_type:
                chunk += f":gpu_type={s.gpu_type}"
        if s.mem:
            chunk += f":mem={pbs_memory(s.mem)}"
        if s.constraint:
            if not re.fullmatch(r"[A-Za-z_][\w.-]*=[\w.-]+(:[A-Za-z_][\w.-]*=[\w.-]+)*", s.constraint):
                raise UsageError(
                    f"constraint {s.constraint!r} is no PBS chunk resource list",
                    hint="with scheduler pbs, constraint is extra select resources: name=value[:name=value...]",
                )
            chunk += f":{s.constraint}"
        d = [f"-N {pbs_name(job.name)}"]
        if job.account:
            d.append(f"-A {job.account}")
        if s.reservation or s.partition:  # a PBS reservation is a queue of its own
            d.append(f"-q {s.reservation or s.partition}")
        d += [f"-l {chunk}", f"-l walltime={pbs_walltime(s.walltime)}", "-j oe"]
        d.append(f"-o {directive_path(self.log_path(job), 'pbs')}")
        d += s.directives
        return [f"#PBS {x}" for x in d]

    def log_path(self, job: Job, job_id: str = "") -> Path:
        return job.logs / f"{job.name}.log"  # PBS has no job id pattern for -o

    def submit_args(self, job: Job, script: Path) -> list[str]:
        args = ["qsub"]  # never -V: the job starts from the node's login environment
        if job.dependency:
            args += ["-W", f"depend=afterok:{job.dependency}"]
        return [*args, str(script)]

    def parse_submitted(self, stdout: str) -> str:
        return stdout.strip()  # "1234.server"

    def active(self, name: str) -> list[str]:
        user = os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name
        return _query(["qselect", "-u", user, "-N", pbs_name(name), "-s", "QHRWT"])

    def status(self, job_id: str) -> JobStatus | None:
        shown = run_captured(["qstat", "-x", "-f", "-F", "json", job_id], timeout=QUERY_TIMEOUT)
        if shown.returncode != 0:
            return None
        return pbs_status(shown.stdout, job_id)


_PBS_STATES = {"Q": "QUEUED", "H": "HELD", "W": "WAITING", "T": "MOVING", "B": "BEGUN", "S": "SUSPENDED"}
_PBS_STATES |= {"R": "RUNNING", "E": "EXITING", "F": "FINISHED", "X": "FINISHED"}


def pbs_status(qstat_json: str, job_id: str) -> JobStatus | None:
    """`qstat -x -f -F json ID`: job_state, Exit_status (>= 256: killed by signal - 256), exec_host."""
    try:
        jobs = json.loads(qstat_json).get("Jobs", {})
    except ValueError:
        return None
    info = jobs.get(job_id) or next(iter(jobs.values()), None)
    if not isinstance(info, dict):
        return None
    letter = str(info.get("job_state", "?"))
    finished = letter in ("F", "X")
    code = info.get("Exit_status")
    exit_code = None
    if finished and isinstance(code, int):
        exit_code = 128 + code - 256 if code >= 256 else code
    state = _PBS_STATES.get(letter, letter)
    if finished:
        state = "COMPLETED" if exit_code == 0 else "FAILED"
    node = str(info.get("exec_host", "")).split("/")[0]
    started = letter in ("R", "E") or finished
    queued = _between(str(info.get("qtime", "")), str(info.get("stime", "")), "%a %b %d %H:%M:%S %Y")
    used = info.get("resources_used")
    ran = _duration(str(used.get("walltime", ""))) if isinstance(used, dict) else None
    return JobStatus(state, started, finished, exit_code, node, queued if started else None, ran)


def pbs_walltime(walltime: str) -> str:
    """[D-]HH:MM:SS as PBS takes it: HH:MM:SS (days become hours)."""
    total = walltime_seconds(walltime)
    return f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def pbs_memory(mem: str) -> str:
    """Slurm's memory syntax (64G; a bare number is MB) in PBS units (64gb)."""
    number, unit = _memory(mem)
    return f"{number}{unit.lower()}b"


def pbs_name(name: str) -> str:
    """PBS job names: at most 236 characters, starting with a letter."""
    return name[:236] if name[:1].isalpha() else f"t{name}"[:236]


SCHEDULERS: dict[str, type[Scheduler]] = {"slurm": Slurm, "pbs": Pbs}


def scheduler_for(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise UsageError(f"unknown scheduler {name!r}", hint=f"use one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]()


def job_account(spec: BuildSpec, environ: Mapping[str, str] | None = None) -> str:
    """The profile's account, else the scheduler's own variable ($SLURM_ACCOUNT, $PBS_ACCOUNT)."""
    env = os.environ if environ is None else environ
    if spec.account:
        return spec.account
    variable = "SLURM_ACCOUNT" if spec.scheduler == "slurm" else "PBS_ACCOUNT"
    value = env.get(variable, "").strip()
    if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@+-]*", value):
        raise UsageError(f"${variable} is {value!r}, which is no account name", hint="unset it or pass --account")
    return value


def walltime_seconds(walltime: str) -> int:
    """A walltime in Slurm's forms (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in
    seconds; UsageError for other text."""
    m = _SLURM_TIME.fullmatch(walltime)
    if not m:
        raise UsageError(
            f"walltime {walltime[:40]!r} is none of Slurm's time forms",
            hint="e.g. --walltime 04:00:00 (HH:MM:SS), 0-03:00 (D-HH:MM) or 90 (minutes)",
        )
    if any(len(x or "") > 9 for x in m.groups()):  # int() of thousands of digits is an error of its own
        raise UsageError(f"walltime {walltime[:40]}... is out of range", hint="e.g. --walltime 2-00:00:00")
    if m.group(1) is not None:  # days-hours[:minutes[:seconds]]
        days, hours, minutes, seconds = (int(x or 0) for x in m.groups()[:4])
    else:  # minutes | minutes:seconds | hours:minutes:seconds
        parts = [int(x) for x in m.groups()[4:] if x is not None]
        days, (hours, minutes, seconds) = 0, {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _memory(mem: str) -> tuple[str, str]:
    """Slurm's memory syntax (64G; a bare number is MB): the number and the unit (K, M, G, T)."""
    m = _MEM.fullmatch(mem)
    if not m:
        raise UsageError(f"mem {mem[:40]!r} is not a size like 64G", hint="e.g. --mem 64G")
    if len(m.group(1)) > 18:
        raise UsageError(f"mem {mem[:40]}... is out of range", hint="e.g. --mem 64G")
    return m.group(1), m.group(2) or "M"


def memory_mb(mem: str) -> float:
    """Slurm's memory syntax in MiB; UsageError for other text."""
    number, unit = _memory(mem)
    return int(number) * _MEM_MB[unit]


def check_job_keys(spec: BuildSpec) -> None:
    """What defaults.yaml's types and ranges cannot say about the job keys (cpus and gpus have
    their min and max there): walltime and mem within what one node can be asked for (a number
    past it is a typo, and would overflow the scheduler's own fields)."""
    for key in ("cpus", "gpus"):  # resolve checked them; a spec made otherwise is checked again
        check_value(key, getattr(spec, key), "the job")
    if walltime_seconds(spec.walltime) == 0:
        raise UsageError(f"walltime {spec.walltime} gives the job no time", hint="e.g. --walltime 04:00:00")
    if walltime_seconds(spec.walltime) > MAX_WALLTIME_DAYS * 86400:
        raise UsageError(
            f"walltime {spec.walltime[:40]} is more than {MAX_WALLTIME_DAYS} days",
            hint="--walltime [D-]HH:MM:SS within the partition's limit; a resubmitted job resumes where it stopped",
        )
    if spec.mem and memory_mb(spec.mem) > MAX_MEM_MB:
        raise UsageError(
            f"mem {spec.mem[:40]} is more than 1 PiB, more memory than any node has",
            hint="--mem N[K|M|G|T] with the node's memory, e.g. --mem 64G",
        )
    for directive in spec.directives:
        bad = CONTROL_CHARS.search(directive)
        if bad:
            raise ProfileError(
                f"directive {directive!r} holds the control character {bad.group()!r}",
                hint="write each directive (--directive, the profile's `directives`) as one line of plain text",
            )
    if spec.scheduler == "pbs" and spec.reservation and spec.partition:
        raise UsageError(
            f"reservation {spec.reservation} and partition {spec.partition}: under PBS both name the job's queue",
            hint="drop partition: the job runs in the reservation's queue",
        )
    if spec.gpu_type and not spec.gpus:
        raise UsageError(f"gpu_type {spec.gpu_type} without gpus", hint="add --gpus N, or drop gpu_type")
    if spec.job_rounds and spec.job_round_warning_s >= walltime_seconds(spec.walltime):
        raise UsageError(
            f"job_round_warning_s {spec.job_round_warning_s} leaves no time of the walltime {spec.walltime} to build",
            hint="a round stops the build that many seconds before its walltime: lower job_round_warning_s or raise walltime",
        )


# -------------------------------------------------------------------- submit and follow


@dataclasses.dataclass(frozen=True)
class Submitted:
    job_id: str
    script: Path
    log: Path


def write_job(scheduler: Scheduler, job: Job, profile_file: Path) -> Path:
    """The resolved profile and the script (and a fresh rounds record where the job goes on over
    allocations), written atomically; the script's path."""
    script = scheduler.script_path(job)
    # the profile is the job's input, credentials and all: readable by its owner alone
    files: list[tuple[Path, str, int | None]] = [
        (profile_file, profile_text(job.spec), 0o600),
        (script, scheduler.render(job), 0o755),
    ]
    if job.rounds is not None:
        files.append((job.rounds, rounds_record(scheduler, job, script), None))
    with named_os_errors(job.logs, "writing the batch script"):
        for path, text, mode in files:
            make_dirs(path.parent)
            atomic_write_text(path, text, mode=mode)
    return script


def new_state(
    *, max_rounds: int, warning_s: int, walltime_s: int, scheduler: str, submit: Sequence[str]
) -> dict[str, Any]:
    """What `invoke submit` writes beside the job script: the limits and how to go on."""
    return {
        "max_rounds": max_rounds,
        "warning_s": warning_s,
        "walltime_s": walltime_s,
        "scheduler": scheduler,
        "submit": list(submit),
        "rounds": [],
    }


def rounds_record(scheduler: Scheduler, job: Job, script: Path) -> str:
    """The rounds supervisor's record before the first round: its limits and how the next round
    is submitted (Slurm requeues the job itself; PBS submits the kept script again)."""
    s = job.spec
    if scheduler.name == "slurm":
        submit = ["scontrol", "requeue", "{job}"]
    else:
        submit = scheduler.submit_args(dataclasses.replace(job, dependency=""), script)
    state = new_state(
        max_rounds=s.job_rounds,
        warning_s=s.job_round_warning_s,
        walltime_s=walltime_seconds(s.walltime),
        scheduler=scheduler.name,
        submit=submit,
    )
    return json.dumps(state, indent=2) + "\n"


def submit(scheduler: Scheduler, job: Job, profile_file: Path, out: TextIO = sys.stdout) -> Submitted:
    """Write the script and the profile beside the logs and submit; on a refusal both are
    removed again (nothing is left of a job that never existed)."""
    if shutil.which(scheduler.submit_tool) is None:
        raise scheduler.missing()
    running = [] if job.dependency else scheduler.active(job.name)
    if running:
        raise SubmissionRefused(
            f"job {', '.join(running)} of this same request ({job.name}) is still queued or running: "
            "a second one would build the same tree at the same time",
            hint=f"wait for it (or `{scheduler.cancel_tool} {running[0]}`), or chain after it with --dependency {running[0]}",
        )
    script = write_job(scheduler, job, profile_file)
    try:
        job_id = scheduler.submit(job, script)
    except BaseException:
        script.unlink(missing_ok=True)
        profile_file.unlink(missing_ok=True)
        raise
    log = scheduler.log_path(job, job_id)
    print(f"submitted {scheduler.name} job {job_id}: {job.name}\n  script {script}\n  log    {log}", file=out)
    return Submitted(job_id, script, log)


def follow(
    scheduler: Scheduler,
    submitted: Submitted,
    out: TextIO = sys.stdout,
    *,
    poll: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobStatus:
    """Print the job's log as it grows until the job ends; JobFailed unless it exited 0."""
    t0, started, pos = clock(), False, 0
    job_id = submitted.job_id
    try:
        while True:
            status = scheduler.status(job_id)
            if status is None:
                _print_new(submitted.log, pos, out)
                raise JobFailed(
                    f"{scheduler.name} job {job_id} is no longer known to the scheduler",
                    hint=f"its log, if it ran: {submitted.log}",
                )
            if status.running and not started:
                started = True
                queued = status.queued_s if status.queued_s is not None else clock() - t0
                where = f" on {status.node}" if status.node else ""
                print(f"job {job_id} started{where}, {queued:.0f} s after submission", file=out, flush=True)
            pos = _print_new(submitted.log, pos, out)
            if status.finished:
                break
            sleep(poll)
    except KeyboardInterrupt:
        raise BuildInterrupted(
            f"stopped following {scheduler.name} job {job_id}; the job itself goes on",
            hint=f"follow its log with `tail -f {submitted.log}`; cancel it with `{scheduler.cancel_tool} {job_id}`",
        ) from None
    _print_new(submitted.log, pos, out)
    _check_ended(scheduler, submitted, status, out)
    return status


def _check_ended(scheduler: Scheduler, submitted: Submitted, status: JobStatus, out: TextIO) -> None:
    """Print how the finished job ended; JobFailed, with its log's tail, unless it completed with exit code 0."""
    job_id = submitted.job_id
    ran = f" after {status.ran_s:.0f} s" if status.ran_s is not None else ""
    print(f"job {job_id} {status.state} (exit code {status.exit_code}){ran}", file=out, flush=True)
    if status.state != "COMPLETED" or status.exit_code != 0:  # cancelled while pending: 0:0
        raise JobFailed(
            f"{scheduler.name} job {job_id} {status.state}, exit code {status.exit_code}; "
            f"the last {TAIL_LINES} lines of {submitted.log}:\n{tail(submitted.log)}",
            hint=f"fix what the log names, then submit again: finished steps are skipped (script: {submitted.script})",
            job_exit=status.exit_code,
        )


def _print_new(log: Path, pos: int, out: TextIO) -> int:
    """Print what log gained since pos (whole lines); the new position."""
    try:
        with log.open("rb") as f:
            f.seek(pos)
            data = f.read()
    except OSError:
        return pos
    end = data.rfind(b"\n") + 1
    if end:  # the job's output as text, its escape sequences inert (a log is no terminal program)
        out.write(printable(data[:end].decode("utf-8", "replace").replace("\r\n", "\n")))
        out.flush()
    return pos + end


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"  | (no log: {exc.strerror})"
    return "\n".join(f"  | {printable(ln)}" for ln in text.splitlines()[-lines:])


# -------------------------------------------------------------------- multi-node jobs
# (`invoke verify --nodes N`): the same directives as a build's job, for N nodes of
# tasks_per_node ranks each, in new classes so the build's one-node job stays as it is


def _check_script(script: str) -> str:
    """A build job's script as the multi-node check's: its comment says what running it again does."""
    return script.replace(
        "(or the same `invoke submit`):\n# the build resumes, skipping the steps an earlier job finished.",
        "(or the same `invoke verify --nodes`):\n# the check runs again, its ranks' results replacing these.",
    )


class SlurmNodes(Slurm):
    """Slurm's directives for N nodes of tasks_per_node ranks each (the ranks share the node's cpus)."""

    def __init__(self, nodes: int, tasks_per_node: int) -> None:
        self.nodes, self.tasks_per_node = nodes, tasks_per_node

    def directives(self, job: Job) -> list[str]:
        per_task = max(1, job.spec.cpus // self.tasks_per_node)
        swap = {
            "#SBATCH --nodes=1": f"#SBATCH --nodes={self.nodes}",
            "#SBATCH --ntasks=1": f"#SBATCH --ntasks-per-node={self.tasks_per_node}",
            f"#SBATCH --cpus-per-task={job.spec.cpus}": f"#SBATCH --cpus-per-task={per_task}",
        }
        return [swap.get(line, line) for line in super().directives(job)]

    def render(self, job: Job) -> str:
        return _check_script(super().render(job))


class PbsNodes(Pbs):
    """PBS's select for N chunks (nodes) of tasks_per_node MPI ranks each."""

    def __init__(self, nodes: int, tasks_per_node: int) -> None:
        self.nodes, self.tasks_per_node = nodes, tasks_per_node

    def directives(self, job: Job) -> list[str]:
        def chunk(line: str) -> str:
            if not line.startswith("#PBS -l select=1:"):
                return line
            rest = line.removeprefix("#PBS -l select=1:")
            return f"#PBS -l select={self.nodes}:{rest}:mpiprocs={self.tasks_per_node}"

        return [chunk(line) for line in super().directives(job)]

    def render(self, job: Job) -> str:
        return _check_script(super().render(job))


def nodes_scheduler_for(name: str, nodes: int, tasks_per_node: int) -> Scheduler:
    """The profile's scheduler, its jobs asking for `nodes` nodes of `tasks_per_node` ranks."""
    kinds: dict[str, type[SlurmNodes] | type[PbsNodes]] = {"slurm": SlurmNodes, "pbs": PbsNodes}
    scheduler_for(name)  # the same UsageError for an unknown one
    return kinds[name](nodes, tasks_per_node)


def launcher_command(launcher: str, nodes: int, tasks_per_node: int) -> list[str]:
    """The launcher's argv that starts nodes x tasks_per_node ranks of the command after it:
    srun (inside the allocation it takes its shape from the job), mpiexec as MPICH's Hydra
    and Cray PALS read -n/-ppn, mpirun as Open MPI reads --map-by ppr:N:node."""
    total = str(nodes * tasks_per_node)
    if launcher == "srun":
        return ["srun", f"--nodes={nodes}", f"--ntasks={total}", f"--ntasks-per-node={tasks_per_node}"]
    if launcher == "mpiexec":
        return ["mpiexec", "-n", total, "-ppn", str(tasks_per_node)]
    if launcher == "mpirun":
        return ["mpirun", "-np", total, "--map-by", f"ppr:{tasks_per_node}:node"]
    raise UsageError(f"launcher {launcher!r} is none of srun, mpiexec, mpirun", hint="--set launcher=srun")


def cancel(scheduler: Scheduler, job_id: str) -> None:
    """Cancel the job (best effort: it may have ended meanwhile)."""
    with contextlib.suppress(OSError):
        run_captured([scheduler.cancel_tool, job_id], timeout=60)


def wait_bounded(
    scheduler: Scheduler,
    job_id: str,
    timeout: float,
    *,
    poll: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobStatus:
    """The job's status once it finished; JobFailed when the scheduler forgets it, or when it has
    not finished within timeout seconds (queued or running: it is cancelled then)."""
    deadline = clock() + timeout
    while True:
        status = scheduler.status(job_id)
        if status is None:
            raise JobFailed(f"{scheduler.name} job {job_id} is no longer known to the scheduler")
        if status.finished:
            return status
        if clock() >= deadline:
            cancel(scheduler, job_id)
            where = "still waiting for its nodes" if not status.running else "still running"
            raise JobFailed(
                f"{scheduler.name} job {job_id} was {where} ({status.state}) after {timeout:.0f} s: cancelled",
                hint="raise --timeout, or check the nodes and partition (sinfo / pbsnodes -a)",
            )
        sleep(poll)
