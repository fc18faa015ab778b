"""invoke sif: an Apptainer SIF from the toolchain image."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from ..backends import Options, choose
from ..comms import comms as build_comms
from ..comms import wanted as comms_wanted
from ..config import DEFAULT_PROFILE, cache_dir
from ..engine import Engine
from ..sif import build_sif, locate
from .common import HELP, handles_errors, spec_from


@task(
    help={
        **HELP,
        "out": "directory for torch-build-<profile>-<arch>.sif (default: the current directory)",
        "apptainer": "auto (this host's apptainer, else the apptainer-builder container), host or docker",
        "rebuild": "convert again even when the SIF already comes from the current image",
        "compression": "squashfs compression, ALGORITHM[:LEVEL]: gzip (default, level 6; every Apptainer and "
        "Singularity runs it) or zstd (level 3; faster, but only Apptainer 1.4+ runs the SIF)",
    },
    iterable=["set_"],
)
@handles_errors
def sif(
    c: Context,
    profile: str = DEFAULT_PROFILE,
    arch: str = "",
    set_: list[str] | None = None,
    out: str = ".",
    apptainer: str = "auto",
    rebuild: bool = False,
    compression: str = "",
) -> None:
    """Convert the profile's toolchain image (built by `invoke image`) into an Apptainer SIF."""
    spec = spec_from(profile, set_, arch)
    engine = Engine.connect()
    runner = locate(spec, apptainer, engine=lambda: engine)
    carried = None
    if comms_wanted(spec):  # the SIF carries the NCCL and plugin built in its image
        made = build_comms(spec, choose(spec, "docker", Options()), out_dir=cache_dir(spec) / "comms-out")
        carried = (made.prefix, made.manifest)
    result = build_sif(
        spec, engine, runner, Path(out).expanduser(), rebuild=rebuild, comms=carried, compression=compression
    )
    ratio = result.size / result.image_size if result.image_size else 0.0
    state = "up to date (made from the current image)" if result.cached else f"written in {result.seconds:.1f} s"
    print(
        f"{result.path} {state}: {result.size / 2**20:.0f} MiB ({result.compression}), "
        f"{ratio:.2f} x the image ({spec.image_tag})"
    )
    if result.link:
        print(f"{result.link} -> {result.path.name}")
    if result.log:
        print(f"log: {result.log}")
    print(f"run it: apptainer run --bind SRC:/src,CACHE:/cache {result.path.name} build --preflight")
