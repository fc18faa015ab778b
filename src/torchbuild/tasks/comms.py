"""invoke comms: NCCL from source and the aws-ofi-nccl plugin, for the profile."""

from __future__ import annotations

import shlex

from invoke.context import Context

from torchbuild.core.problems import Problems
from torchbuild.core.safeio import user_path
from torchbuild.inputs.config import parse_jobs_option
from torchbuild.launch.backends.apptainer import ApptainerBackend
from torchbuild.launch.comms import comms as build_comms
from torchbuild.tasks.common import Launch, launch_task


@launch_task(
    help={
        "out": "where the step's request file goes (default ./out); the libraries go into the cache",
        "jobs": "parallel compile jobs, an integer >= 1 (default: planned from cores and memory)",
        "no_retry": "fail with OutOfMemory at the first out-of-memory kill instead of resuming with fewer jobs",
    }
)
def comms(c: Context, launch: Launch, out: str = "out", jobs: str = "", no_retry: bool = False) -> None:
    """Build NCCL for the profile's cuda_arch_list and the aws-ofi-nccl plugin against libfabric.

    Into <cache_dir>/comms/<versions>-<key>: a rerun with the same inputs is a no-op. Natively, in the image
    (--in-container) or in the SIF (--in-container --engine apptainer: at the site, against its
    libfabric_prefix bound read-only; the SIF then gets the prefix bound at /opt/torchbuild/comms, and the
    --bind to give it is printed); `invoke build` and `invoke submit`'s job run it first. See the docs' "NCCL
    and the Slingshot plugin" (docs/guide/nccl.md)."""
    problems = Problems()  # a bad --jobs and a bad profile named at once
    max_jobs = problems.check(lambda: parse_jobs_option(jobs))
    spec = problems.check(launch.spec)
    problems.raise_any()
    assert spec is not None and max_jobs is not None
    backend = launch.backend(spec)
    done = build_comms(spec, backend, out_dir=user_path(out).absolute(), jobs=max_jobs, oom_retry=not no_retry)
    print(f"prefix: {done.prefix}\nmanifest: {done.prefix / 'torchbuild-comms.json'}")
    if isinstance(backend, ApptainerBackend):  # the SIF finds them where it would find carried ones
        binds = ",".join(backend.comms_binds)
        print(
            f"run torch in the SIF with them: apptainer exec --bind {shlex.quote(binds)} {shlex.quote(str(backend.sif))} ..."
        )
