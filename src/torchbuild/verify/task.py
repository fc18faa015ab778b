"""invoke verify: check a built wheel (or an installed torch) in a fresh venv, natively, in the
toolchain image or in the SIF; with --nodes N, an install's distributed checks across N nodes
as a batch job (verify/nodes.py)."""

from __future__ import annotations

from collections.abc import Mapping

from invoke.context import Context

from torchbuild.core.safeio import user_path
from torchbuild.runtime.flags import key_flags
from torchbuild.runtime.tasks import Launch, launch_task
from torchbuild.verify.host import verify_with

# the job options of `invoke submit` (the profile keys with a flag) that --nodes takes too, each
# a --set of its key; not the scheduler (the profile's)
NODES_NOT_JOB_OPTIONS = ("scheduler",)
NODES_WALLTIME = "00:15:00"  # the check's job, unless --walltime: not the build's hours


# `invoke verify`'s own flags (the launch options' come with @launch_task), as `invoke --help verify` shows them
_FLAG_HELP = {
    "wheel": "the wheel to verify (its directory also gets <wheel>.verify.json)",
    "installed": "verify this already-installed package instead (e.g. torch from the image's distribution)",
    "expect_version": "the version the package must report (default: the profile's, e.g. 2.6.0+gh200)",
    "report": "where to write the JSON report (default <wheel>.verify.json; --installed: none; "
    "--nodes: <out>/verify-nodes/<run>/verify-nodes.json)",
    "nodes": "N > 0: submit a batch job (the profile's scheduler) that runs gloo, MPI and NCCL all_reduce "
    "across N nodes with the profile's `launcher`, in the runtime env of --prefix",
    "tasks_per_node": "with --nodes: ranks per node (default 1; e.g. 4 for one per GPU)",
    "prefix": "with --nodes: the install `invoke install` made, on a file system the nodes share",
    "out": "with --nodes: where the job's run directory goes, shared with the nodes (default ./out)",
    "timeout": "with --nodes: seconds to wait for the job, queueing included (default 1800); then it is cancelled",
    "dry_run": "with --nodes: print the job's script and the submit command; write and submit nothing",
    **{key: f"with --nodes: {text}" for key, text in key_flags(NODES_NOT_JOB_OPTIONS).items()},
    "walltime": f"with --nodes: the job's time limit (default {NODES_WALLTIME})",
    "gpus": "with --nodes: GPUs per node (default: the profile's `gpus`); NCCL is checked where GPUs are visible",
}


@launch_task(
    help=_FLAG_HELP,
    keys="job",
    exclude=NODES_NOT_JOB_OPTIONS,
)
def verify(
    c: Context,
    launch: Launch,
    wheel: str = "",
    installed: str = "",
    expect_version: str = "",
    report: str = "",
    nodes: int = 0,
    tasks_per_node: int = 1,
    prefix: str = "",
    out: str = "",
    timeout: float = 1800.0,
    dry_run: bool = False,
    *,
    job: Mapping[str, str],
) -> None:
    """Verify a wheel: tags, version, fresh-venv install, import; for torch also its configuration,
    tensor/autograd, 2-process gloo all_reduce and broadcast, CUDA when a GPU is visible.
    With --nodes N --prefix DIR: the install's gloo, MPI and NCCL all_reduce across N nodes."""
    _check_flags(nodes, wheel, installed, expect_version, prefix, out, dry_run)
    if nodes:
        _verify_nodes(launch, nodes, tasks_per_node, prefix, out, report, timeout, dry_run, job)
        return
    spec = launch.spec()
    verify_with(
        spec,
        launch.backend(spec),
        wheel=user_path(wheel).resolve() if wheel else None,
        installed=installed,
        expect_version=expect_version,
        report=user_path(report).resolve() if report else None,
    )


def _check_flags(
    nodes: int, wheel: str, installed: str, expect_version: str, prefix: str, out: str, dry_run: bool
) -> None:
    """A UsageError for flags that do not go together: --nodes with a wheel, --nodes' own flags without it, and
    not exactly one of --wheel and --installed."""
    from torchbuild.core.errors import UsageError

    if nodes:
        if wheel or installed or expect_version:
            raise UsageError("--nodes checks an install (--prefix), not --wheel or --installed",
                             hint="invoke verify --nodes 2 --prefix /shared/envs/torch")  # fmt: skip
        return
    if prefix or out or dry_run:
        raise UsageError("--prefix, --out and --dry-run go with --nodes N", hint="invoke verify --nodes 2 --prefix DIR")
    if bool(wheel) == bool(installed):
        raise UsageError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")


def _verify_nodes(
    launch: Launch,
    nodes: int,
    tasks_per_node: int,
    prefix: str,
    out: str,
    report: str,
    timeout: float,
    dry_run: bool,
    job: Mapping[str, str],
) -> None:
    from torchbuild.core.errors import UsageError
    from torchbuild.runtime.tasks import spec_from
    from torchbuild.verify.multinode import Shape
    from torchbuild.verify.nodes import NodesRequest, verify_nodes

    if not prefix:
        raise UsageError("--nodes needs --prefix: the install to check", hint="invoke verify --nodes 2 --prefix DIR")
    job = {**job, "walltime": job["walltime"] or NODES_WALLTIME}
    sets = [*launch.set_, *(f"{key}={value}" for key, value in job.items() if value)]
    request = NodesRequest(
        spec=spec_from(launch.profile, sets, launch.arch),
        prefix=user_path(prefix, "--prefix").absolute(),
        shape=Shape(nodes, tasks_per_node),
        out_dir=user_path(out or "out", "--out").absolute(),
        report=user_path(report, "--report").absolute() if report else None,
        timeout=timeout,
        dry_run=dry_run,
    )
    verify_nodes(request)
