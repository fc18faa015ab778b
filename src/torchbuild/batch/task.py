"""invoke submit: the build as a batch job on a compute node (Slurm or PBS)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping, Sequence

from invoke.context import Context

from torchbuild.batch.host import (
    RunRequest,
    Runtime,
    check_run_request,
    run_requirements,
    submit_build,
    submit_run,
)
from torchbuild.builder.host import SOURCE_HELP, BuildInputs, BuildRun, pythons_option
from torchbuild.core.console import printable
from torchbuild.core.errors import UsageError
from torchbuild.core.options import option, to_argv
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import RUN_JOB_KEYS, BuildSpec
from torchbuild.profile.keys import key_option
from torchbuild.runtime.options import BuildOptions, ProfileChoice
from torchbuild.runtime.tasks import options_task, spec_from


@dataclasses.dataclass(frozen=True)
class JobHow:
    """submit's own options about the job: its directives and modules (where it builds is the
    job's Runtime, batch/host.py)."""

    directive: tuple[str, ...] = option(
        (), "a further scheduler directive, as written after #SBATCH / #PBS (repeatable; adds to the profile's)"
    )
    module: tuple[str, ...] = option(
        (),
        "an environment module to load in the job (repeatable; replaces the profile's `modules`, "
        "with --run its `runtime_modules`)",
    )
    module_purge: bool = key_option("module_purge")  # the key's switch: its help is declared with the key


@dataclasses.dataclass(frozen=True)
class JobRun:
    """submit's options about the job's run: nodes, dependency, and the run job (--run)."""

    nodes: int = option(
        1,
        "nodes for the build (default 1): over 2 or more, distccd on the others compiles with the job's "
        "node (ccache first), MAX_JOBS sized to them all; the daemons stop with the build",
    )
    dependency: str = option("", "start only after this job id finished successfully (afterok)")
    dry_run: bool = option(False, "print the script and the submit command; write and submit nothing")
    wait: bool = option(False, "follow the job's log until it ends, then exit with the build's exit code")
    run: str = option(
        "",
        "submit a run job instead of a build: a venv in $SLURM_TMPDIR from --wheelhouse, runtime_env, then "
        "this script (a .py runs with python; its argv after `--`, or --arg)",
    )
    wheelhouse: str = option(
        "", "with --run: the wheelhouse the job's `pip install --no-index --find-links` installs from"
    )
    package: tuple[str, ...] = option(
        (),
        "with --run: what the job installs from the wheelhouse (repeatable; default torch; "
        "runtime_packages and mpi4py are added)",
    )
    arg: tuple[str, ...] = option(
        (), "with --run: an argument for the script (repeatable, kept exactly; words after `--` are added too)"
    )


# submit's option models, by the parameter that takes each (its signature orders the flags)
_MODELS: dict[str, type] = {
    "choice": ProfileChoice,
    "how": JobHow,
    "runtime": Runtime,
    "where": BuildInputs,
    "options": BuildOptions,
    "build_run": BuildRun,
    "job_run": JobRun,
}


@options_task(
    models=_MODELS,
    keys="job",
    exclude=("progress", "resume"),  # the job's build shows lines and always resumes
    help={
        "source": SOURCE_HELP + "; a git source is fetched and patched here, before submitting",
        "out": "output directory for the wheel, manifest, logs and the job's script (default ./out)",
        "preflight": "the job runs the preflight (configure, targets, canaries) instead of the wheel build",
        "clean": "remove the tree's build/ directory first (the job then does not resume)",
        "cpus": "cores for the job (default: the profile's `cpus`; with --run, run_job's)",
        "gpus": "GPUs for the job (default: the profile's `gpus`); with the SIF, > 0 adds --nv",
    },
)
def submit(
    c: Context,
    choice: ProfileChoice,
    *,
    job: Mapping[str, str],
    how: JobHow,
    runtime: Runtime,
    where: BuildInputs,
    options: BuildOptions,
    build_run: BuildRun,
    job_run: JobRun,
) -> None:
    """Run the build on a compute node: render a Slurm or PBS batch script and submit it.

    With --run SCRIPT, a run job instead (the Alliance's pytorch-test.sh): the profile's runtime modules, a venv in
    $SLURM_TMPDIR from --wheelhouse with --no-index, runtime_env, then the script."""
    run = job_run.run
    if run or job_run.wheelhouse or job_run.package or job_run.arg:
        build_flags = [*to_argv(where, ("out",)), *to_argv(options), *to_argv(build_run, ("progress",))]
        _check_run_options(runtime, job_run, build_flags)  # --out is the run job's too
    modules = {"runtime_modules" if run else "modules": list(how.module)}
    spec = _job_spec(choice, job, modules=modules, module_purge=how.module_purge, directive=how.directive)
    if run:
        return _submit_run(spec, job_run, where.out, c.remainder or "")
    submit_build(
        spec,
        runtime,
        source=where.source,
        ref=where.ref,
        out_dir=where.out,
        options=options,
        verify=build_run.verify,
        dependency=job_run.dependency,
        dry_run=job_run.dry_run,
        wait=job_run.wait,
        pythons=pythons_option(spec, build_run.python),
        nodes=job_run.nodes,
    )


def _submit_run(spec: BuildSpec, given: JobRun, out_dir: str, remainder: str) -> None:
    """--run: the run job of the script, from the wheelhouse; its argv --arg, then the words after `--`."""
    args = (*given.arg, *_remainder_words(remainder))
    requirements = run_requirements(spec, list(given.package))
    script, house = check_run_request(spec, given.run, given.wheelhouse, requirements)
    out = user_path(out_dir or "out").absolute()
    request = RunRequest(script, args, house, tuple(requirements), out)
    submit_run(spec, request, dependency=given.dependency, dry_run=given.dry_run, wait=given.wait)


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


def _check_run_options(runtime: Runtime, given: JobRun, build_flags: list[str]) -> None:
    """--run with the build's options (build_flags: those given, as to_argv writes them), or the
    run's options without --run, is a UsageError."""
    if not given.run:
        raise UsageError("--wheelhouse, --package and --arg belong to a run job", hint="add --run SCRIPT")
    used = list(dict.fromkeys(flag.split("=", 1)[0] for flag in build_flags))
    used += [*(["--sif"] if runtime.sif else []), *(["--nodes"] if given.nodes != 1 else [])]
    if runtime.engine != "apptainer" or runtime.apptainer != "auto":
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
    choice: ProfileChoice,
    job_options: Mapping[str, str],
    *,
    modules: Mapping[str, list[str]],
    module_purge: bool,
    directive: Sequence[str],
) -> BuildSpec:
    """The profile with --set, then each job option given (a profile key with a flag) as a --set of its key;
    --module replaces the profile's modules (runtime_modules for a run job: the key modules names),
    --directive adds to its directives."""
    profile, arch, sets = choice.profile, choice.arch, list(choice.set_)
    run = "runtime_modules" in modules  # a run job: its own cpus, mem... are run_job's entries
    sets += [f"{_job_key(key, run)}={value}" for key, value in job_options.items() if value]
    sets += [f"{key}={json.dumps(given)}" for key, given in modules.items() if given]
    if module_purge:
        sets.append("module_purge=true")
    spec = spec_from(profile, sets, arch)
    if directive:  # added to the profile's, and validated as the key's items are
        spec = spec_from(profile, [*sets, f"directives={json.dumps([*spec.directives, *directive])}"], arch)
    return spec
