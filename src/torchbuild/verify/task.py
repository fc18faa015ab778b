"""invoke verify: check a built wheel (or an installed torch) in a fresh venv, natively, in the
toolchain image or in the SIF; with --nodes N, an install's distributed checks across N nodes
as a batch job (verify/nodes.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from invoke.context import Context

from torchbuild.core.options import option
from torchbuild.core.safeio import user_path
from torchbuild.runtime.flags import key_flags
from torchbuild.runtime.tasks import Launch, launch_task
from torchbuild.verify.host import verify_with

# the job options of `invoke submit` (the profile keys with a flag) that --nodes takes too, each
# a --set of its key; not the scheduler (the profile's)
NODES_NOT_JOB_OPTIONS = ("scheduler",)
NODES_WALLTIME = "00:15:00"  # the check's job, unless --walltime: not the build's hours


@dataclasses.dataclass(frozen=True)
class VerifyFlags:
    """`invoke verify`'s own flags (the launch options' come with @launch_task, the job options with keys=): the
    wheel or installed package, the report, and --nodes' check of an install."""

    wheel: str = option("", "the wheel to verify (its directory also gets <wheel>.verify.json)")
    installed: str = option(
        "", "verify this already-installed package instead (e.g. torch from the image's distribution)"
    )
    expect_version: str = option("", "the version the package must report (default: the profile's, e.g. 2.6.0+gh200)")
    report: str = option(
        "",
        "where to write the JSON report (default <wheel>.verify.json; --installed: none; "
        "--nodes: <out>/verify-nodes/<run>/verify-nodes.json)",
    )
    nodes: int = option(
        0,
        "N > 0: submit a batch job (the profile's scheduler) that runs gloo, MPI and NCCL all_reduce "
        "across N nodes with the profile's `launcher`, in the runtime env of --prefix",
    )
    tasks_per_node: int = option(1, "with --nodes: ranks per node (default 1; e.g. 4 for one per GPU)")
    prefix: str = option("", "with --nodes: the install `invoke install` made, on a file system the nodes share")
    out: str = option("", "with --nodes: where the job's run directory goes, shared with the nodes (default ./out)")
    timeout: float = option(
        1800.0, "with --nodes: seconds to wait for the job, queueing included (default 1800); then it is cancelled"
    )
    dry_run: bool = option(
        False, "with --nodes: print the job's script and the submit command; write and submit nothing"
    )


@launch_task(
    models={"given": VerifyFlags},
    # the job options (the profile keys with a flag) are --nodes' job's: their help says so, and
    # two say what differs for this job (its walltime default, gpus per node), real differences
    # from the keys' own help, which `invoke submit` shows
    help={
        **{key: f"with --nodes: {text}" for key, text in key_flags(NODES_NOT_JOB_OPTIONS).items()},
        "walltime": f"with --nodes: the job's time limit (default {NODES_WALLTIME})",
        "gpus": "with --nodes: GPUs per node (default: the profile's `gpus`); NCCL is checked where GPUs are visible",
    },
    keys="job",
    exclude=NODES_NOT_JOB_OPTIONS,
)
def verify(c: Context, launch: Launch, given: VerifyFlags, *, job: Mapping[str, str]) -> None:
    """Verify a wheel: tags, version, fresh-venv install, import; for torch also its configuration,
    tensor/autograd, 2-process gloo all_reduce and broadcast, CUDA when a GPU is visible.
    With --nodes N --prefix DIR: the install's gloo, MPI and NCCL all_reduce across N nodes."""
    _check_flags(given)
    if given.nodes:
        _verify_nodes(launch, given, job)
        return
    spec = launch.spec()
    verify_with(
        spec,
        launch.backend(spec),
        wheel=user_path(given.wheel).resolve() if given.wheel else None,
        installed=given.installed,
        expect_version=given.expect_version,
        report=user_path(given.report).resolve() if given.report else None,
    )


def _check_flags(given: VerifyFlags) -> None:
    """A UsageError for flags that do not go together: --nodes with a wheel, --nodes' own flags without it, and
    not exactly one of --wheel and --installed."""
    from torchbuild.core.errors import UsageError

    wheel, installed = given.wheel, given.installed
    if given.nodes:
        if wheel or installed or given.expect_version:
            raise UsageError("--nodes checks an install (--prefix), not --wheel or --installed",
                             hint="invoke verify --nodes 2 --prefix /shared/envs/torch")  # fmt: skip
        return
    if given.prefix or given.out or given.dry_run:
        raise UsageError("--prefix, --out and --dry-run go with --nodes N", hint="invoke verify --nodes 2 --prefix DIR")
    if bool(wheel) == bool(installed):
        raise UsageError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")


def _verify_nodes(launch: Launch, given: VerifyFlags, job: Mapping[str, str]) -> None:
    from torchbuild.core.errors import UsageError
    from torchbuild.runtime.tasks import spec_from
    from torchbuild.verify.multinode import Shape
    from torchbuild.verify.nodes import NodesRequest, verify_nodes

    prefix, out, report = given.prefix, given.out, given.report
    if not prefix:
        raise UsageError("--nodes needs --prefix: the install to check", hint="invoke verify --nodes 2 --prefix DIR")
    job = {**job, "walltime": job["walltime"] or NODES_WALLTIME}
    sets = [*launch.set_, *(f"{key}={value}" for key, value in job.items() if value)]
    request = NodesRequest(
        spec=spec_from(launch.profile, sets, launch.arch),
        prefix=user_path(prefix, "--prefix").absolute(),
        shape=Shape(given.nodes, given.tasks_per_node),
        out_dir=user_path(out or "out", "--out").absolute(),
        report=user_path(report, "--report").absolute() if report else None,
        timeout=given.timeout,
        dry_run=given.dry_run,
    )
    verify_nodes(request)
