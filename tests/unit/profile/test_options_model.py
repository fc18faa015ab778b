"""Each option declared once (issue 43, item 2): the flags of `invoke build` and `invoke submit`,
their help, the typed request and the argv a batch job passes on to the build all come from the
option models (builder/host.py, batch/task.py, batch/host.py's Runtime) and the profile keys
(profile/keys.py). What a user asks of `invoke submit` is what the build on the node gets: request -> argv -> request."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from invoke.parser import Parser

from torchbuild.batch.host import Runtime, _JobRequest, _make_job
from torchbuild.batch.task import JobHow, JobRun
from torchbuild.builder.host import BuildInputs, BuildRun
from torchbuild.core.options import flags, from_flags, to_argv
from torchbuild.profile.config import resolve
from torchbuild.profile.keys import flag_keys
from torchbuild.runtime.options import BuildOptions, LaunchOptions
from torchbuild.runtime.scheduler import scheduler_for
from torchbuild.tasks import ns

# every option of each model away from its default; values with spaces, '=' and a leading '/'
EVERY = {
    BuildInputs: BuildInputs(source="/src/py torch", ref="v2.6.0", out="/out dir/x=1"),
    BuildOptions: BuildOptions(
        preflight=True,
        targets=("c10", "torch cpu"),
        canaries=("a b.cpp", "k=v.cu"),
        clean=True,
        jobs=3,
        oom_retry=False,
    ),
    BuildRun: BuildRun(progress="raw", verify=False, resume=True, python="3.12,3.13"),
    LaunchOptions: LaunchOptions(
        profile="/p/my site.yaml",
        arch="aarch64",
        set_=("env.A=b c", 'python_versions=["3.12"]'),
        in_container=True,
        engine="apptainer",
        sif="/s/my sif.sif",
        apptainer="docker",
        nv=True,
        user="1:1",
        memory="8g",
        rebuild_image=True,
    ),
    JobHow: JobHow(
        directive=("--reservation=R", "-l job_priority=regular"),
        module=("gcc/13", "cuda/12.6"),
        module_purge=True,
    ),
    Runtime: Runtime(engine="docker", sif="/s/t.sif", apptainer="host"),
    JobRun: JobRun(
        nodes=3,
        dependency="123",
        dry_run=True,
        wait=True,
        run="/t/s.py",
        wheelhouse="/w",
        package=("torch", "numpy<2"),
        arg=("a b", "epochs=3"),
    ),
}
BUILD_MODELS = (BuildInputs, BuildOptions, BuildRun, LaunchOptions)


def _parsed(task: str, argv: list[str]) -> dict[str, object]:
    """The task's flags as invoke's parser reads argv (the parser `invoke TASK` uses): by name."""
    contexts = Parser(contexts=ns.to_contexts()).parse_argv([task, *argv])
    (context,) = [c for c in contexts if c.name == task]
    return dict(context.as_kwargs)


@pytest.mark.parametrize("model", list(EVERY), ids=lambda m: m.__name__)
def test_every_option_of_a_model_is_set_in_the_round_trip_request(model):
    request = EVERY[model]
    unset = [f.name for f in flags(model) if getattr(request, f.field) == f.default]
    assert not unset, f"add {unset} to EVERY[{model.__name__}] so the round trip covers them"


@pytest.mark.parametrize("model", BUILD_MODELS, ids=lambda m: m.__name__)
def test_a_build_request_round_trips_through_its_argv_and_invokes_parser(model):
    request = EVERY[model]
    argv = to_argv(request)
    assert all(word.startswith("--") for word in argv)  # each value joined to its flag: never read as one
    assert from_flags(model, _parsed("build", argv)) == request


@pytest.mark.parametrize(
    "model", [BuildInputs, BuildOptions, BuildRun, JobHow, Runtime, JobRun], ids=lambda m: m.__name__
)
def test_submit_takes_the_same_flags_into_the_same_request(model):
    """submit's flags are the build's (less --progress and --resume, which its job fixes) and its own."""
    exclude = ("progress", "resume")
    request = EVERY[model]
    given = _parsed("submit", to_argv(request, exclude))
    expected = dataclasses.replace(model(), **{f.field: getattr(request, f.field) for f in flags(model, exclude)})
    assert from_flags(model, given, exclude) == expected


def test_submits_profile_key_flags_are_the_keys_that_declare_one():
    keyed = set(flag_keys())
    assert keyed == {"scheduler", "account", "partition", "qos", "walltime", "cpus", "mem", "gpus", "gpu_type"} | {
        "constraint",
        "module_purge",  # a bool key: its switch is JobHow's key_option field
    }
    given = _parsed("submit", ["--account=proj-1", "--gpu-type=a100", "--cpus=8", "--module-purge"])
    assert {k: given[k] for k in keyed if given[k]} == {
        "account": "proj-1",
        "gpu_type": "a100",
        "cpus": "8",
        "module_purge": True,
    }
    assert from_flags(JobHow, given) == JobHow(module_purge=True)
    assert [f.help for f in flags(JobHow) if f.name == "module_purge"] == [flag_keys()["module_purge"].flag]


@pytest.mark.parametrize("task", ["build", "submit"])
def test_every_flag_of_a_derived_task_has_its_help(task):
    args = ns[task].get_arguments()
    missing = [a.name for a in args if not a.help]
    assert not missing, missing
    names = {a.name for a in args}
    for model in (BuildInputs, BuildOptions, BuildRun):
        assert {f.name for f in flags(model, ("progress", "resume"))} <= names


def test_the_job_passes_the_users_build_request_on_to_the_build_on_the_node(tmp_path: Path):
    """The build command a batch job runs, read back by `build`'s own parser, is the request
    `invoke submit` was given: each option, the source and --out with spaces, each target."""
    options = EVERY[BuildOptions]
    request = _JobRequest(
        resolve("cpu"), Runtime("native"), options, False, ("3.12",), "/src/py torch", tmp_path / "out dir", ()
    )
    job, profile_file = _make_job(request, "", "")
    command = list(job.command)
    argv = command[command.index("build") + 1 :]
    given = _parsed("build", argv)
    assert from_flags(BuildOptions, given) == options
    assert from_flags(BuildInputs, given) == BuildInputs(source="/src/py torch", out=str(tmp_path / "out dir"))
    assert from_flags(BuildRun, given) == BuildRun(progress="lines", verify=False, resume=True, python="3.12")
    assert from_flags(LaunchOptions, given) == LaunchOptions(profile=str(profile_file))
    # and the script's shell reads that command back word for word
    script = scheduler_for("slurm").render(job)
    lines = script[script.index(shlex.quote(command[0])) :].replace("\\\n", " ")
    assert shlex.split(lines.splitlines()[0]) == command


@pytest.mark.parametrize("argv", [["mpi", "/o u/r.json"], ["--name=mpi", "--request=/o u/r.json"]])
def test_a_positional_field_is_invokes_positional_argument(argv):
    """inside.step's model (positional fields, as the backends pass NAME FILE): invoke reads
    them by position, or by name as to_argv writes them."""
    from torchbuild.tasks.inside import StepFile

    request = StepFile(name="mpi", request="/o u/r.json")
    assert [f.positional for f in flags(StepFile)] == [True, True]
    assert ns["inside.step"].positional == ["name", "request"]
    assert from_flags(StepFile, _parsed("inside.step", argv)) == request
    assert from_flags(StepFile, _parsed("inside.step", to_argv(request))) == request


def test_the_jobs_sif_is_launch_options_sif():
    """Runtime's --sif is declared once, as LaunchOptions' field (core/options.py like())."""
    (job,) = [f for f in flags(Runtime) if f.field == "sif"]
    (launch,) = [f for f in flags(LaunchOptions) if f.field == "sif"]
    assert (job.name, job.help, job.default, job.parse) == (launch.name, launch.help, launch.default, launch.parse)
