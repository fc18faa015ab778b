"""invoke comms: NCCL from source and the aws-ofi-nccl plugin, for the profile."""

from __future__ import annotations

from invoke.context import Context

from ..comms import comms as build_comms
from ..safeio import user_path
from .common import Launch, launch_task


@launch_task(help={"out": "where the step's request file goes (default ./out); the libraries go into the cache"})
def comms(c: Context, launch: Launch, out: str = "out") -> None:
    """Build NCCL for the profile's cuda_arch_list and the aws-ofi-nccl plugin against libfabric.

    Into <cache_dir>/comms/<versions>-<key>: a rerun with the same inputs is a no-op. Natively, in the image
    (--in-container) or in the SIF (--engine apptainer); `invoke build` runs it first when the profile has
    nccl: source. See README "NCCL and the Slingshot plugin"."""
    spec = launch.spec()
    done = build_comms(spec, launch.backend(spec), out_dir=user_path(out).absolute())
    print(f"prefix: {done.prefix}\nmanifest: {done.prefix / 'torchbuild-comms.json'}")
