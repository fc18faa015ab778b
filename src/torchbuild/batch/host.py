"""Batch jobs: the same build on a compute node, and run jobs, submitted to Slurm (sbatch) or
PBS Professional (qsub) through runtime/scheduler.py (the script, submitting, following).

    submit_build   check everything, get a git source here (compute nodes are often offline),
                   then the job: `python -m torchbuild build --resume ...` (after `torchbuild
                   comms` where the profile wants NCCL), over N nodes (spread.py) or over
                   allocations (rounds.py) where asked; the resolved profile is written beside
                   the script, so the job builds exactly what was submitted
    submit_run     `invoke submit --run`: a venv from a wheelhouse, then the user's script

Inside the job the planner takes cores and memory from the allocation (jobs.py), ccache
lives in the profile's cache_dir (a shared file system), and `--resume` skips the steps an
earlier job of the same request finished (resume.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import secrets
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from torchbuild import __version__
from torchbuild.batch import jobplaces
from torchbuild.batch.spread import check_nodes, slots_per_node, spread_jobs, spread_lines
from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.dirs import make_dirs
from torchbuild.core.errors import ImageNotFound, PathError, UsageError, named_os_errors, writable_dir
from torchbuild.core.options import flag_of, like, option, to_argv
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import BuildSpec, requirement_of, run_job_spec
from torchbuild.profile.config import wanted as comms_wanted
from torchbuild.runtime.backends import ENGINE_HELP, engine_for
from torchbuild.runtime.options import LaunchOptions
from torchbuild.runtime.scheduler import (
    CONTROL_CHARS,
    JOB_ID,
    Job,
    Pbs,
    PbsNodes,
    Scheduler,
    Slurm,
    SlurmNodes,
    Submitted,
    arg_lines,
    check_job_keys,
    directive_path,
    follow,
    job_account,
    memory_mb,
    scheduler_for,
    shell_words,
    submit,
    walltime_seconds,
)

if TYPE_CHECKING:
    from torchbuild.runtime.options import BuildOptions

# the largest job torchbuild asks a scheduler for (runtime/scheduler.py has the others)
# submit's --jobs: the same bound as the profile's max_jobs (configs/defaults.yaml)
MAX_JOBS = 4096
APPTAINER_MODES = ("auto", "host", "docker")


# -------------------------------------------------------------------- invoke submit


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Where the job runs the build: the SIF (default), the toolchain image, or natively. The
    option model of submit's --engine, --sif and --apptainer (core/options.py: the fields are
    the flags, their help and defaults); args() writes it as the LaunchOptions flags the job's
    build takes.

    --sif is LaunchOptions' own field (like(): the same default and help). --engine and
    --apptainer are declared here again, as the job's: its --engine defaults to apptainer (a
    launching task's to native) and its help and --apptainer's speak of the node, not this host;
    a field carries one default and one help, so the job's are their own declarations."""

    engine: str = option("apptainer", f"where the job builds on its node: {ENGINE_HELP}; default apptainer")
    sif: str = like(LaunchOptions, "sif")
    apptainer: str = option(
        "auto", "with --engine apptainer: auto (the node's apptainer, else the builder container), host, docker"
    )

    def args(self, spec: BuildSpec) -> list[str]:
        engine = engine_for(self.engine, default="apptainer")  # the same check and meaning as build's
        if engine in ("native", "docker"):
            if self.sif or self.apptainer != "auto":
                raise UsageError("--sif and --apptainer choose the SIF", hint="drop them, or use --engine apptainer")
            return [] if engine == "native" else to_argv(LaunchOptions(in_container=True, engine="docker"))
        if self.apptainer not in APPTAINER_MODES:
            raise UsageError(
                f"--apptainer {self.apptainer!r} is none of {', '.join(APPTAINER_MODES)}",
                hint="--apptainer auto (the node's apptainer, else the builder container), host or docker",
            )
        from torchbuild.runtime.apptainer import check_sif_header, default_sif

        given = flag_of(Runtime, "sif")  # --sif, named in the errors
        sif = user_path(self.sif or default_sif(spec), given).absolute()
        make = f"make it with `invoke sif --profile {spec.profile} --arch {spec.arch}` (or pass {given})"
        if not sif.is_file():
            raise ImageNotFound(f"SIF {sif} does not exist: the job would have nothing to build in", hint=make)
        check_sif_header(sif, given, make)
        where = LaunchOptions(in_container=True, engine="apptainer", sif=str(sif), apptainer=self.apptainer)
        return to_argv(dataclasses.replace(where, nv=bool(spec.gpus)))


def local_source(source: str) -> str:
    """A local --source as the job will name it (absolute): it must exist here, as the node sees
    the same shared file system, and its path must be one line of text."""
    path = user_path(source).absolute()
    bad = CONTROL_CHARS.search(str(path))
    if bad:
        raise PathError(
            f"--source {str(path)!r} holds the control character {bad.group()!r}",
            hint="rename the directory or archive, or link it from a plain path",
        )
    if not path.exists():
        raise PathError(
            f"--source {path} does not exist: the job would fail on the node",
            hint="give an existing PyTorch tree, tarball or .dsc (on a file system the compute nodes share), or a git URL",
        )
    return str(path)


def submit_build(
    spec: BuildSpec,
    runtime: Runtime,
    *,
    source: str,
    ref: str,
    out_dir: str,
    options: BuildOptions,
    verify: bool,
    dependency: str = "",
    dry_run: bool = False,
    wait: bool = False,
    pythons: Sequence[str] = (),
    nodes: int = 1,
    out: TextIO = sys.stdout,
) -> Submitted | None:
    """`invoke submit`: check everything, get a git source here (compute nodes are often
    offline), then write and submit the job (or print it, --dry-run), and follow it (--wait).
    nodes > 1: the job holds that many nodes and spreads its compiles over them (spread.py)."""
    from torchbuild.source.fetch import looks_like_url

    scheduler, account, options, engine_args = _job_setup(spec, runtime, options, dependency, nodes)
    outp = user_path(out_dir or "out").absolute()
    directive_path(outp / "logs", scheduler.name)  # before anything is fetched
    cache = _check_job_places(spec, outp)
    git = not source or looks_like_url(source)
    if not git:  # checked here, where the node's failure would be named hours later
        job_source = _local_job_source(spec, source, ref)
    if not dry_run and shutil.which(scheduler.submit_tool) is None:
        raise scheduler.missing()
    if not dry_run:
        outp = writable_dir(outp, "--out")
    if git:
        job_source = _git_job_source(spec, source, ref, fetch=not dry_run, out=out)
    request = _JobRequest(spec, runtime, options, verify, tuple(pythons), job_source, outp, tuple(engine_args))
    job, profile_file = _make_job(request, account, dependency)
    if nodes > 1:
        job = dataclasses.replace(job, spread=_spread(scheduler, job, nodes, engine_args))
    if str(user_path(spec.cache_dir)).startswith("/tmp/"):
        print(
            f"warning: cache_dir {spec.cache_dir} is node-local on most clusters: ccache will not be shared", file=out
        )
    if dry_run:
        _print_dry_run(scheduler, job, out)
        return None
    if not engine_args:  # natively: the build venv made here, where PyPI answers
        jobplaces.make_build_venv(spec, job_source, cache, job.logs / f"{job.name}-buildenv.log", out)
    submitted = submit(scheduler, job, profile_file, out)
    if wait:
        follow(scheduler, submitted, out)
    return submitted


def _job_setup(
    spec: BuildSpec, runtime: Runtime, options: BuildOptions, dependency: str, nodes: int
) -> tuple[Scheduler, str, BuildOptions, list[str]]:
    """The job's checks before anything is fetched: its nodes, keys, required keys and where
    it builds; the scheduler (spread over nodes > 1, with the build options sized to them),
    the account and the build's engine flags."""
    check_nodes(nodes, runtime.engine, runtime.apptainer)
    scheduler, account = _check_job_request(spec, options, dependency)
    jobplaces.check_required(spec)
    engine_args = runtime.args(spec)
    if nodes > 1:
        scheduler = spread_scheduler_for(spec.scheduler, nodes)
        options = _spread_options(spec, options, nodes)
    return scheduler, account, options, engine_args


_MOUNTED_HINT = "move it to a file system the compute nodes mount (ARCHER2: your project's /work)"


def _local_job_source(spec: BuildSpec, source: str, ref: str) -> str:
    """A local --source as the job names it: no --ref, present here, on a file system the nodes mount."""
    if ref:
        raise UsageError(f"--ref {ref} applies to git sources only", hint="drop --ref")
    job_source = local_source(source)
    jobplaces.check_mounted(spec, [("--source", job_source, _MOUNTED_HINT)])
    return job_source


def _print_dry_run(scheduler: Scheduler, job: Job, out: TextIO) -> None:
    out.write(scheduler.render(job))
    args = shell_words(scheduler.submit_args(job, scheduler.script_path(job)))
    print(f"# dry run: nothing written or submitted; it would be: {args}", file=out)


def _check_job_places(spec: BuildSpec, out_dir: Path) -> Path:
    """The job's Python one its node can run, and its cache, --out, working directory, Python
    and torchbuild on file systems the nodes mount; the cache's absolute path."""
    jobplaces.job_python(spec)
    cache = user_path(spec.cache_dir, "cache_dir").absolute()
    places = [jobplaces.cache_place(spec, cache), *_job_places(out_dir), *jobplaces.runtime_places(spec)]
    jobplaces.check_mounted(spec, places)
    return cache


def _job_places(out_dir: Path) -> list[jobplaces.Place]:
    """--out and the directory the job starts in (this one)."""
    return [("--out", str(out_dir), _MOUNTED_HINT), ("the working directory", str(Path.cwd()), _MOUNTED_HINT)]


def _node_slots(spec: BuildSpec) -> tuple[int, int]:
    """The compiles the build's node runs at once (a CUDA build's nvcc units among them) and
    each other node's."""
    mem_mb = memory_mb(spec.mem) if spec.mem else 0
    return slots_per_node(spec, mem_mb, local=True), slots_per_node(spec, mem_mb)


def _spread_options(spec: BuildSpec, options: BuildOptions, nodes: int) -> BuildOptions:
    """The build's options over nodes: MAX_JOBS sized to every node's slots unless --jobs is given.
    The heavy units keep their pool on the job's node all the same (jobs.plan_for's spread, which
    the build knows from CCACHE_PREFIX), sized from that node's memory, compiled there."""
    if options.jobs:
        return options
    return dataclasses.replace(options, jobs=min(MAX_JOBS, spread_jobs(nodes, *_node_slots(spec))))


def _spread(scheduler: Scheduler, job: Job, nodes: int, engine_args: Sequence[str]) -> tuple[str, ...]:
    """The job script's lines that start and stop the daemons (spread.spread_lines)."""
    sif = next((arg.split("=", 1)[1] for arg in engine_args if arg.startswith("--sif=")), "")
    local_slots, remote_slots = _node_slots(job.spec)
    lines = spread_lines(
        scheduler.name,
        nodes,
        local_slots=local_slots,
        remote_slots=remote_slots,
        walltime_s=walltime_seconds(job.spec.walltime),
        sif=sif,
        log_dir=str(job.logs),
        id_variable=scheduler.id_variable,
    )
    return tuple(lines)


def _check_job_request(spec: BuildSpec, options: BuildOptions, dependency: str) -> tuple[Scheduler, str]:
    """The profile's scheduler and the job's account, once the job keys, --jobs and
    --dependency are checked."""
    scheduler = scheduler_for(spec.scheduler)
    check_job_keys(spec)
    if options.jobs > MAX_JOBS:
        raise UsageError(
            f"--jobs {options.jobs} is more compile jobs than any node has cores (at most {MAX_JOBS})",
            hint="leave --jobs out: the job plans them from its cores and memory",
        )
    account = job_account(spec)
    if dependency and not JOB_ID.fullmatch(dependency):
        raise UsageError(f"--dependency {dependency!r} is no job id", hint="pass the id sbatch or qsub printed")
    return scheduler, account


def _git_job_source(spec: BuildSpec, source: str, ref: str, *, fetch: bool, out: TextIO) -> str:
    """The tree a git source is checked out to; with fetch (not --dry-run), fetched and patched
    here, as compute nodes are often offline."""
    from torchbuild.builder.host import describe_patches, patch_tree
    from torchbuild.source.fetch import default_tree, get_source

    tree = default_tree(spec, ref or spec.git_ref)
    if fetch:
        info = get_source(spec, source, ref, out=out)
        tree = info.path
        series, result = patch_tree(spec, tree)
        print(describe_patches(series, result), file=out)
    return str(tree)


@dataclasses.dataclass(frozen=True)
class _JobRequest:
    """What the job builds, and how."""

    spec: BuildSpec
    runtime: Runtime
    options: BuildOptions
    verify: bool
    pythons: tuple[str, ...]
    source: str  # as the job names it
    out: Path
    engine_args: tuple[str, ...]


def _make_job(request: _JobRequest, account: str, dependency: str) -> tuple[Job, Path]:
    """The job (its name from the build's key, its `torchbuild build --resume` command) and the
    profile file it reads."""
    from torchbuild.builder.host import BuildInputs, BuildRun, Places, key_of

    spec, outp, pythons = request.spec, request.out, request.pythons
    places = Places(request.source, outp, Path())
    key = key_of(spec, places, "", request.options, request.runtime.engine, ",".join(pythons))
    name = f"torchbuild-{spec.profile}-{key[:8]}"
    profile_file = outp / ".torchbuild" / "jobs" / key / f"{spec.profile}.yaml"
    # the build's flags from its models (runtime.options LaunchOptions and BuildOptions, builder.host
    # BuildInputs and BuildRun): to_argv
    where = BuildInputs(source=request.source, out=str(outp))
    run = BuildRun(progress="lines", verify=request.verify, resume=True, python=",".join(pythons))
    command = [jobplaces.job_python(spec), "-m", "torchbuild", "build", *_profile_argv(profile_file)]
    command += [*to_argv(where), *request.engine_args, *to_argv(request.options), *to_argv(run)]
    job = Job(
        name, tuple(command), Path.cwd(), outp, spec, account, dependency, first=_comms_first(request, profile_file)
    )
    if spec.job_rounds:
        job = dataclasses.replace(job, rounds=profile_file.parent / "rounds.json")
    return job, profile_file


def _profile_argv(profile_file: Path) -> list[str]:
    """--profile of the job's steps: the profile file written beside the script (LaunchOptions' flag)."""
    return to_argv(LaunchOptions(profile=str(profile_file)))


def _comms_first(request: _JobRequest, profile_file: Path) -> tuple[tuple[str, ...], ...]:
    """`torchbuild comms` where the job builds, before the build: NCCL and the plugin against
    the node's libfabric_prefix (bound read-only into the SIF), a no-op when they are built. The
    build's own comms step then finds them and links torch to that NCCL; a failure here stops
    the job with the comms step's error, not hours into the build."""
    if not comms_wanted(request.spec):
        return ()
    from torchbuild.builder.host import BuildInputs
    from torchbuild.runtime.options import BuildOptions

    command = [jobplaces.job_python(request.spec), "-m", "torchbuild", "comms", *_profile_argv(profile_file)]
    # comms's --out is the build's (the same directory, the same flag): BuildInputs writes it
    command += [*to_argv(BuildInputs(out=str(request.out))), *request.engine_args]
    # the two build options comms takes (--jobs, --no-retry), as the build's argv writes them
    command += to_argv(BuildOptions(jobs=request.options.jobs, oom_retry=request.options.oom_retry))
    return (tuple(command),)


class SlurmSpread(SlurmNodes):
    """A build's job over N nodes, one task each (the daemons' step): the build's own comment.
    Whole nodes: distccd has no per-user authentication, and another user's job on an allowed
    node could run compilers (and so code) as this job's user through it."""

    def directives(self, job: Job) -> list[str]:
        return [*super().directives(job), "#SBATCH --exclusive"]

    def render(self, job: Job) -> str:
        return Slurm.render(self, job)


class PbsSpread(PbsNodes):
    """A build's job over N PBS chunks (nodes), one rank each: the build's own comment. Whole
    nodes, one chunk on each (scatter: select=N alone may put chunks on one host), as SlurmSpread."""

    def directives(self, job: Job) -> list[str]:
        return [*super().directives(job), "#PBS -l place=scatter:excl"]

    def render(self, job: Job) -> str:
        return Pbs.render(self, job)


def spread_scheduler_for(name: str, nodes: int) -> Scheduler:
    """The profile's scheduler, its build job holding `nodes` nodes (spread.py)."""
    kinds: dict[str, type[SlurmSpread] | type[PbsSpread]] = {"slurm": SlurmSpread, "pbs": PbsSpread}
    scheduler_for(name)
    return kinds[name](nodes, 1)


# -------------------------------------------------------------------- run jobs (invoke submit --run)
# The Alliance's pytorch-test.sh, rendered from the profile: its job keys as directives, the
# runtime modules, a venv in the job's node-local $SLURM_TMPDIR (a private temporary directory,
# removed at the end, where the site sets none), torch and runtime_packages from the wheelhouse
# with --no-index (mpi4py among them as the wheel built once: --only-binary, never compiled in
# the job), runtime_env, then the user's script.


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What a run job runs, and from which wheelhouse it installs."""

    script: Path  # absolute; python runs a .py, anything else runs as a program
    args: tuple[str, ...]  # its argv
    wheelhouse: Path  # absolute: --find-links of the job's pip
    packages: tuple[str, ...]  # what the job's pip installs (default torch), runtime_packages after them
    out: Path  # the script and the job's log go to its logs/


def run_requirements(spec: BuildSpec, packages: Sequence[str]) -> list[str]:
    """The requirements the job installs: packages (default torch), runtime_packages, and mpi4py
    where the profile has MPI (its wheel from the wheelhouse)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from torchbuild.install.host import mpi4py_requirement, wants_mpi4py

    # a runtime_packages mapping's requirement alone: the wheelhouse holds its built wheel, which
    # installs without the pip options and variables its build took (its check is the install's)
    wanted = [*(packages or ["torch"]), *(requirement_of(p) for p in spec.runtime_packages)]
    for item in wanted:
        try:
            Requirement(item)
        except InvalidRequirement as exc:
            raise UsageError(f"--package {item!r} is no requirement: {exc}", hint="e.g. --package torch") from None
    names = {canonicalize_name(Requirement(r).name) for r in wanted}
    if wants_mpi4py(spec) and "mpi4py" not in names:
        wanted.append(mpi4py_requirement(spec))
    return list(dict.fromkeys(wanted))


def check_run_request(spec: BuildSpec, script: str, wheelhouse: str, requirements: Sequence[str]) -> tuple[Path, Path]:
    """The script (an existing file; a program unless a .py) and the wheelhouse (a directory
    holding a wheel of every requirement), as absolute paths the job names."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from torchbuild.install.host import scan

    path = user_path(script, "--run").absolute()
    if not path.is_file():
        raise PathError(f"--run {path} is no file", hint="give the script the job runs (a .py, or a program)")
    if path.suffix != ".py" and not os.access(path, os.X_OK):
        raise PathError(f"--run {path} is neither a .py nor executable", hint=f"chmod +x {shlex.quote(str(path))}")
    if not wheelhouse:
        raise UsageError("--run needs --wheelhouse DIR", hint="the wheelhouse the job's pip installs from")
    house = user_path(wheelhouse, "--wheelhouse").absolute()
    if not house.is_dir():
        raise PathError(f"--wheelhouse {house} is no directory", hint="give the directory `invoke wheelhouse` wrote")
    held = {w.name for w in scan(house)}
    for item in requirements:
        name = canonicalize_name(Requirement(item).name)
        if name not in held:
            make = (
                f"invoke wheelhouse --add-mpi4py --profile {shlex.quote(spec.profile)}"
                if name == "mpi4py"
                else "invoke wheelhouse --wheel W"
            )
            raise PathError(
                f"the wheelhouse {house} holds no {name} wheel: the job's `pip install --no-index` would fail",
                hint=f"add it with `{make} --dest {shlex.quote(str(house))}`",
            )
    for what, p in (("--run", path), ("--wheelhouse", house)):
        bad = CONTROL_CHARS.search(str(p))
        if bad:
            raise PathError(f"{what} {str(p)!r} holds the control character {bad.group()!r}", hint="rename it")
    return path, house


def _run_token() -> str:
    """What makes each run job's name its own: when it was submitted, and a random part."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _run_name(spec: BuildSpec, script: Path, token: str) -> str:
    """The run job's name, its kept script's and (PBS, which has no job id in -o) its log's:
    the script's stem in plain characters (with a digest of the real one where any was
    replaced: `a b.py` and `a_b.py` stay apart) and token, so no two jobs share a file."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", script.stem)[:40] or "script"
    if stem != script.stem:
        stem += "-" + hashlib.sha256(os.fsencode(script.stem)).hexdigest()[:6]
    return f"torchbuild-run-{spec.profile}-{stem}-{token}"


def run_job(spec: BuildSpec, request: RunRequest, account: str, dependency: str = "", token: str = "") -> Job:
    """The job: directives from the profile; command is the user's script and its argv; a name
    of its own (token, default _run_token())."""
    lead = ("python",) if request.script.suffix == ".py" else ()
    command = (*lead, str(request.script), *request.args)
    name = _run_name(spec, request.script, token or _run_token())
    return Job(name, command, Path.cwd(), request.out, spec, account, dependency)


def render_run(scheduler: Scheduler, job: Job, request: RunRequest) -> str:
    """The run job's script (pytorch-test.sh's steps), every value shell-quoted."""
    spec = job.spec
    site = "SLURM_TMPDIR" if scheduler.name == "slurm" else "TMPDIR"
    lines = [
        "#!/bin/bash --login" if spec.runtime_modules else "#!/bin/bash",
        *scheduler.directives(job),
        f"# torchbuild {__version__}: {job.name}, profile {spec.profile} (sha256 {spec.hash[:16]}):",
        "# a venv from the wheelhouse in the job's node-local directory, then the script; submit it again",
        f"# with `{scheduler.resubmit(job)}`",
        "set -eo pipefail",
        f'echo "torchbuild: {scheduler.name} run job ${{{scheduler.id_variable}:-?}} on $(hostname) at $(date -Is)"',
    ]
    if spec.purge_command:
        lines.append(spec.purge_command)
    if spec.runtime_modules:
        lines += [shell_words(["module", "load", *spec.runtime_modules]), "module list 2>&1"]
    lines += [f"cd {shlex.quote(str(job.workdir))}", *_venv_lines(spec, site), *_install_lines(spec, request)]
    lines += [
        f"echo {shlex.quote('torchbuild: running ' + shell_words(job.command))}",
        " \\\n  ".join(arg_lines(job.command)),
    ]
    return "\n".join(lines) + "\n"


def _venv_lines(spec: BuildSpec, site: str) -> list[str]:
    """A venv in $site (the site's per-job directory), else in a private temporary directory;
    removed when the script ends, however it ends."""
    python = shlex.quote(f"python{spec.python_version}")
    return [
        f'if [ -n "${{{site}:-}}" ] && [ -d "${site}" ]; then',
        f'  torchbuild_tmp=$(mktemp -d "${site}/torchbuild-run.XXXXXX")',
        "else",
        f'  echo "torchbuild: {site} is not set: the venv goes in a private temporary directory"',
        '  torchbuild_tmp=$(mktemp -d "${TMPDIR:-/tmp}/torchbuild-run.XXXXXX")',
        "fi",
        "trap 'rm -rf -- \"$torchbuild_tmp\"' EXIT",
        f'{python} -m venv -- "$torchbuild_tmp/env"',
        'source "$torchbuild_tmp/env/bin/activate"',
        'echo "torchbuild: venv $VIRTUAL_ENV ($(python --version 2>&1))"',
    ]


def _install_lines(spec: BuildSpec, request: RunRequest) -> list[str]:
    """pip from the wheelhouse only (mpi4py as its wheel, never compiled here), then runtime_env."""
    from torchbuild.runtime.environment import runtime_env

    pip = ["python", "-m", "pip", "install", "--no-index", "--find-links", str(request.wheelhouse)]
    pip += ["--only-binary", "mpi4py", "--disable-pip-version-check", "--", *request.packages]
    lines = [" \\\n  ".join(arg_lines(pip))]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(runtime_env(spec).items())]
    return lines


def submit_run(
    spec: BuildSpec,
    request: RunRequest,
    *,
    dependency: str = "",
    dry_run: bool = False,
    wait: bool = False,
    out: TextIO = sys.stdout,
) -> Submitted | None:
    """`invoke submit --run`: write the run job's script beside the logs and submit it (or print
    it, --dry-run); with wait, follow its log and exit with the script's code. The job asks for
    the build's job keys with the profile's run_job over them (the Alliance's pytorch-test.sh)."""
    spec = run_job_spec(spec)
    scheduler = scheduler_for(spec.scheduler)
    check_job_keys(spec)
    account = job_account(spec)
    if dependency and not JOB_ID.fullmatch(dependency):
        raise UsageError(f"--dependency {dependency!r} is no job id", hint="pass the id sbatch or qsub printed")
    directive_path(request.out / "logs", scheduler.name)
    places = [("--run", str(request.script), _MOUNTED_HINT), ("--wheelhouse", str(request.wheelhouse), _MOUNTED_HINT)]
    jobplaces.check_mounted(spec, [*places, *_job_places(request.out)])
    job = run_job(spec, request, account, dependency)
    text = render_run(scheduler, job, request)
    if dry_run:
        out.write(text)
        args = shell_words(scheduler.submit_args(job, scheduler.script_path(job)))
        print(f"# dry run: nothing written or submitted; it would be: {args}", file=out)
        return None
    if shutil.which(scheduler.submit_tool) is None:
        raise scheduler.missing()
    writable_dir(request.out, "--out")
    submitted = _submit_run_script(scheduler, job, text)
    print(
        f"submitted {scheduler.name} job {submitted.job_id}: {job.name}\n  script {submitted.script}\n  log    {submitted.log}",
        file=out,
    )
    if wait:
        follow(scheduler, submitted, out)
    return submitted


def _submit_run_script(scheduler: Scheduler, job: Job, text: str) -> Submitted:
    """The run job's script written beside its logs (never over another job's) and submitted;
    the script is removed again when the submission fails."""
    script = scheduler.script_path(job)
    with named_os_errors(job.logs, "writing the batch script"):
        if script.exists() or scheduler.log_path(job).exists():  # another job's: never overwritten
            raise PathError(
                f"{script} already exists: the kept script of another run job has this job's name",
                hint="submit again: each run job's name has the time and a random part of its own",
            )
        make_dirs(script.parent)
        atomic_write_text(script, text, mode=0o755)
    try:
        job_id = scheduler.submit(job, script)
    except BaseException:
        script.unlink(missing_ok=True)
        raise
    return Submitted(job_id, script, scheduler.log_path(job, job_id))
