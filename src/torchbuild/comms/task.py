"""invoke comms: NCCL from source and the aws-ofi-nccl plugin, for the profile."""

from __future__ import annotations

import dataclasses
import shlex

from invoke.context import Context

from torchbuild.comms.host import comms as build_comms
from torchbuild.core.options import option
from torchbuild.core.problems import Problems
from torchbuild.core.safeio import user_path
from torchbuild.runtime.backends.apptainer import ApptainerBackend
from torchbuild.runtime.options import NOT_COMPILE_OPTIONS, BuildOptions
from torchbuild.runtime.tasks import Launch, launch_task


@dataclasses.dataclass(frozen=True)
class CommsOut:
    """`invoke comms`' own option: where its request file goes (--jobs and --no-retry are BuildOptions')."""

    out: str = option("out", "where the step's request file goes (default ./out); the libraries go into the cache")


@launch_task(models={"given": CommsOut, "options": BuildOptions}, exclude=NOT_COMPILE_OPTIONS)
def comms(c: Context, launch: Launch, given: CommsOut, *, options: BuildOptions, problems: Problems) -> None:
    """Build NCCL for the profile's cuda_arch_list and the aws-ofi-nccl plugin against libfabric.

    Into <cache_dir>/comms/<versions>-<key>: a rerun with the same inputs is a no-op. Natively, in the image
    (--in-container) or in the SIF (--in-container --engine apptainer: at the site, against its
    libfabric_prefix bound read-only; the SIF then gets the prefix bound at /opt/torchbuild/comms, and the
    --bind to give it is printed); `invoke build` and `invoke submit`'s job run it first. See the docs' "NCCL
    and the Slingshot plugin" (docs/guide/nccl.md)."""
    spec = problems.check(launch.spec)  # a bad --jobs (in problems) and a bad profile named at once
    problems.raise_any()
    assert spec is not None
    backend = launch.backend(spec)
    out_dir = user_path(given.out).absolute()
    done = build_comms(spec, backend, out_dir=out_dir, jobs=options.jobs, oom_retry=options.oom_retry)
    print(f"prefix: {done.prefix}\nmanifest: {done.prefix / 'torchbuild-comms.json'}")
    if isinstance(backend, ApptainerBackend):  # the SIF finds them where it would find carried ones
        binds = ",".join(backend.comms_binds)
        print(
            f"run torch in the SIF with them: apptainer exec --bind {shlex.quote(binds)} {shlex.quote(str(backend.sif))} ..."
        )
