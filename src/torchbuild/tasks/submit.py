"""invoke submit: the build as a batch job on a compute node (Slurm or PBS)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from invoke.context import Context

from torchbuild.inputs.config import BuildSpec
from torchbuild.launch.backends import ENGINE_HELP
from torchbuild.launch.runner import pythons_option
from torchbuild.launch.scheduler import Runtime, submit_build
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
        "walltime": "time limit, [D-]HH:MM:SS (default: the profile's, 04:00:00)",
        "cpus": "cores for the job (default: the profile's `cpus`)",
        "mem": "memory for the job, e.g. 64G (default: the profile's `mem`, else the site's)",
        "gpus": "GPUs for the job (default: the profile's `gpus`); with the SIF, > 0 adds --nv",
        "gpu_type": "GPU model, e.g. a100 (default: the profile's `gpu_type`)",
        "constraint": "Slurm --constraint, or PBS select resources name=value[:...] (default: the profile's)",
        "directive": "a further scheduler directive, as written after #SBATCH / #PBS (repeatable; adds to the profile's)",
        "module": "an environment module to load in the job (repeatable; replaces the profile's `modules`)",
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
        "dependency": "start only after this job id finished successfully (afterok)",
        "dry_run": "print the script and the submit command; write and submit nothing",
        "wait": "follow the job's log until it ends, then exit with the build's exit code",
    },
    iterable=["set_", "directive", "module", "target", "canary"],
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
    dependency: str = "",
    dry_run: bool = False,
    wait: bool = False,
    python: str = "",
) -> None:
    """Run the build on a compute node: render a Slurm or PBS batch script and submit it."""
    given = locals()
    job_options = {key: given[key] for key in JOB_OPTIONS}
    spec = _job_spec(profile, arch, set_, job_options, module=module, module_purge=module_purge, directive=directive)
    options = build_options(preflight, clean, jobs, target, canary, "lines", no_retry)
    submit_build(
        spec,
        Runtime(engine, sif, apptainer),
        source=source,
        ref=ref,
        out_dir=out,
        options=options,
        verify=not no_verify,
        dependency=dependency,
        dry_run=dry_run,
        wait=wait,
        pythons=pythons_option(spec, python),
    )


def _job_spec(
    profile: str,
    arch: str,
    set_: list[str] | None,
    job_options: Mapping[str, str],
    *,
    module: list[str] | None,
    module_purge: bool,
    directive: list[str] | None,
) -> BuildSpec:
    """The profile with --set, then each job option given (JOB_OPTIONS) as a --set of its key;
    --module replaces the profile's modules, --directive adds to its directives."""
    sets = list(set_ or [])
    sets += [f"{key}={value}" for key, value in job_options.items() if value]
    if module:
        sets.append(f"modules={json.dumps(module)}")
    if module_purge:
        sets.append("module_purge=true")
    spec = spec_from(profile, sets, arch)
    if directive:  # added to the profile's, and validated as the key's items are
        spec = spec_from(profile, [*sets, f"directives={json.dumps([*spec.directives, *directive])}"], arch)
    return spec
