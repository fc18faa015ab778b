"""invoke submit: the build as a batch job on a compute node (Slurm or PBS)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from invoke.context import Context

from torchbuild.core.console import printable
from torchbuild.core.errors import UsageError
from torchbuild.core.safeio import user_path
from torchbuild.inputs.config import RUN_JOB_KEYS, BuildSpec
from torchbuild.launch.backends import ENGINE_HELP
from torchbuild.launch.runner import pythons_option
from torchbuild.launch.scheduler import (
    RunRequest,
    Runtime,
    check_run_request,
    run_requirements,
    submit_build,
    submit_run,
)
from torchbuild.tasks.build import SOURCE_HELP, build_options
from torchbuild.tasks.common import HELP, handles_errors, spec_from, task

# options that set the profile key of the same name: given on the command line, each is a --set
# of that key, so it is validated like the profile's own value and recorded in the resolved
# profile the job builds
JOB_OPTIONS = ("scheduler", "account", "partition", "qos", "walltime", "cpus", "mem", "gpus", "gpu_type", "constraint")


@task(
    help={
        **HELP,
        "scheduler": "slurm (sbatch) or pbs (qsub); default: the profile's `scheduler`",
        "account": "project to charge (default: the profile's, else $SLURM_ACCOUNT / $PBS_ACCOUNT)",
        "partition": "Slurm partition or PBS queue (default: the profile's, else the site's)",
        "qos": "Slurm QoS (default: the profile's)",
        "walltime": "time limit in Slurm's forms: HH:MM:SS, D-HH[:MM[:SS]], MM:SS, minutes (default: the profile's)",
        "cpus": "cores for the job (default: the profile's `cpus`; with --run, run_job's)",
        "mem": "memory for the job, e.g. 64G (default: the profile's `mem`, else the site's)",
        "gpus": "GPUs for the job (default: the profile's `gpus`); with the SIF, > 0 adds --nv",
        "gpu_type": "GPU model, e.g. a100 (default: the profile's `gpu_type`)",
        "constraint": "Slurm --constraint, or PBS select resources name=value[:...] (default: the profile's)",
        "directive": "a further scheduler directive, as written after #SBATCH / #PBS (repeatable; adds to the profile's)",
        "module": "an environment module to load in the job (repeatable; replaces the profile's `modules`, "
        "with --run its `runtime_modules`)",
        "module_purge": "`module purge` in the job before loading the modules",
        "engine": f"where the job builds on its node: {ENGINE_HELP}; default apptainer",
        "sif": "with --engine apptainer: the SIF (default ./torch-build-<profile>-<arch>.sif)",
        "apptainer": "with --engine apptainer: auto (the node's apptainer, else the builder container), host, docker",
        "source": SOURCE_HELP + "; a git source is fetched and patched here, before submitting",
        "ref": "git tag, branch or commit (default: the profile's torch_ref, else v<torch_version>)",
        "out": "output directory for the wheel, manifest, logs and the job's script (default ./out)",
        "preflight": "the job runs the preflight (configure, targets, canaries) instead of the wheel build",
        "target": "preflight CMake target (repeatable)",
        "canary": "preflight canary source file (repeatable)",
        "clean": "remove the tree's build/ directory first (the job then does not resume)",
        "jobs": "parallel compile jobs (default: planned in the job from its cores and memory)",
        "no_retry": "fail at the first out-of-memory kill instead of resuming with fewer jobs",
        "no_verify": "skip verifying the wheel in the job",
        "python": "X.Y[,X.Y...] or all: a wheel per Python in the one job (as invoke build --python)",
        "nodes": "nodes for the build (default 1): over 2 or more, distccd on the others compiles with the job's "
        "node (ccache first), MAX_JOBS sized to them all; the daemons stop with the build",
        "dependency": "start only after this job id finished successfully (afterok)",
        "dry_run": "print the script and the submit command; write and submit nothing",
        "wait": "follow the job's log until it ends, then exit with the build's exit code",
        "run": "submit a run job instead of a build: a venv in $SLURM_TMPDIR from --wheelhouse, runtime_env, then "
        "this script (a .py runs with python; its argv after `--`, or --arg)",
        "wheelhouse": "with --run: the wheelhouse the job's `pip install --no-index --find-links` installs from",
        "package": "with --run: what the job installs from the wheelhouse (repeatable; default torch; "
        "runtime_packages and mpi4py are added)",
        "arg": "with --run: an argument for the script (repeatable, kept exactly; words after `--` are added too)",
    },
    iterable=["set_", "directive", "module", "target", "canary", "package", "arg"],
)
@handles_errors
def submit(
    c: Context,
    profile: str = "",
    arch: str = "",
    set_: list[str] | None = None,
    scheduler: str = "",
    account: str = "",
    partition: str = "",
    qos: str = "",
    walltime: str = "",
    cpus: str = "",
    mem: str = "",
    gpus: str = "",
    gpu_type: str = "",
    constraint: str = "",
    directive: list[str] | None = None,
    module: list[str] | None = None,
    module_purge: bool = False,
    engine: str = "apptainer",
    sif: str = "",
    apptainer: str = "auto",
    source: str = "",
    ref: str = "",
    out: str = "",
    preflight: bool = False,
    target: list[str] | None = None,
    canary: list[str] | None = None,
    clean: bool = False,
    jobs: str = "",
    no_retry: bool = False,
    no_verify: bool = False,
    nodes: int = 1,
    dependency: str = "",
    dry_run: bool = False,
    wait: bool = False,
    python: str = "",
    run: str = "",
    wheelhouse: str = "",
    package: list[str] | None = None,
    arg: list[str] | None = None,
) -> None:
    """Run the build on a compute node: render a Slurm or PBS batch script and submit it.

    With --run SCRIPT, a run job instead (the Alliance's pytorch-test.sh): the profile's runtime modules, a venv in
    $SLURM_TMPDIR from --wheelhouse with --no-index, runtime_env, then the script."""
    given = locals()
    job_options = {key: given[key] for key in JOB_OPTIONS}
    if run or wheelhouse or package or arg:
        _check_run_options(given)
    modules = {"runtime_modules" if run else "modules": module}
    spec = _job_spec(profile, arch, set_, job_options, modules=modules, module_purge=module_purge, directive=directive)
    if run:
        return _submit_run(spec, given, c.remainder or "")
    _submit_build(spec, given)


def _submit_build(spec: BuildSpec, given: Mapping[str, Any]) -> None:
    """The build as a batch job (submit_build), with the task's options."""
    g = given
    options = build_options(g["preflight"], g["clean"], g["jobs"], g["target"], g["canary"], "lines", g["no_retry"])
    submit_build(
        spec,
        Runtime(g["engine"], g["sif"], g["apptainer"]),
        source=g["source"],
        ref=g["ref"],
        out_dir=g["out"],
        options=options,
        verify=not g["no_verify"],
        dependency=g["dependency"],
        dry_run=g["dry_run"],
        wait=g["wait"],
        pythons=pythons_option(spec, g["python"]),
        nodes=g["nodes"],
    )


def _submit_run(spec: BuildSpec, given: Mapping[str, Any], remainder: str) -> None:
    """--run: the run job of the script, from the wheelhouse; its argv --arg, then the words after `--`."""
    args = (*(given["arg"] or []), *_remainder_words(remainder))
    requirements = run_requirements(spec, given["package"] or [])
    script, house = check_run_request(spec, given["run"], given["wheelhouse"], requirements)
    out = user_path(given["out"] or "out").absolute()
    request = RunRequest(script, args, house, tuple(requirements), out)
    submit_run(spec, request, dependency=given["dependency"], dry_run=given["dry_run"], wait=given["wait"])


def _remainder_words(remainder: str) -> list[str]:
    """The words after `--` (invoke hands them over joined by spaces; they are split again as a
    shell would); UsageError for an unbalanced quote, which shlex refuses with ValueError."""
    try:
        return shlex.split(remainder)
    except ValueError as exc:
        raise UsageError(
            f"the words after `--` cannot be split into arguments ({exc}): {printable(remainder[:80])!r}",
            hint="quote each argument once for the shell, or give it with --arg (kept exactly, repeatable)",
        ) from None


# build options a run job has no use for
_BUILD_ONLY = (
    "source",
    "ref",
    "preflight",
    "target",
    "canary",
    "clean",
    "jobs",
    "no_retry",
    "no_verify",
    "python",
    "sif",
)
# a run job's --nodes is not a spread build's: refused with the build-only options
_BUILD_ONLY_NUMBERS = {"nodes": 1}


def _check_run_options(given: Mapping[str, Any]) -> None:
    """--run with the build's options, or the run's options without --run, is a UsageError."""
    if not given["run"]:
        raise UsageError("--wheelhouse, --package and --arg belong to a run job", hint="add --run SCRIPT")
    used = [f"--{k.replace('_', '-')}" for k in _BUILD_ONLY if given[k]]
    used += [f"--{k}" for k, default in _BUILD_ONLY_NUMBERS.items() if given[k] != default]
    if given["engine"] != "apptainer" or given["apptainer"] != "auto":
        used.append("--engine/--apptainer")
    if used:
        raise UsageError(
            f"{', '.join(used)} choose how a build runs: --run runs a script", hint="drop them, or drop --run"
        )


def _job_key(key: str, run: bool) -> str:
    """The profile key a job option sets: with --run, cpus, mem, gpus, gpu_type and walltime
    are the run job's (run_job.KEY), over what the profile's run_job says."""
    return f"run_job.{key}" if run and key in RUN_JOB_KEYS else key


def _job_spec(
    profile: str,
    arch: str,
    set_: list[str] | None,
    job_options: Mapping[str, str],
    *,
    modules: Mapping[str, list[str] | None],
    module_purge: bool,
    directive: list[str] | None,
) -> BuildSpec:
    """The profile with --set, then each job option given (JOB_OPTIONS) as a --set of its key;
    --module replaces the profile's modules (runtime_modules for a run job: the key modules names),
    --directive adds to its directives."""
    sets = list(set_ or [])
    run = "runtime_modules" in modules  # a run job: its own cpus, mem... are run_job's entries
    sets += [f"{_job_key(key, run)}={value}" for key, value in job_options.items() if value]
    sets += [f"{key}={json.dumps(given)}" for key, given in modules.items() if given]
    if module_purge:
        sets.append("module_purge=true")
    spec = spec_from(profile, sets, arch)
    if directive:  # added to the profile's, and validated as the key's items are
        spec = spec_from(profile, [*sets, f"directives={json.dumps([*spec.directives, *directive])}"], arch)
    return spec
