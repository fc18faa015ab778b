"""invoke sif: an Apptainer SIF from the toolchain image, or from its recipe with Apptainer alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from invoke.context import Context

from torchbuild.comms.host import comms as build_comms
from torchbuild.core.errors import EngineUnavailable, ToolMissing, UsageError
from torchbuild.core.options import like, option
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import BuildSpec, cache_dir
from torchbuild.profile.config import wanted as comms_wanted
from torchbuild.runtime.apptainer import host_apptainer, locate, sif_filename
from torchbuild.runtime.backends import Options, choose
from torchbuild.runtime.engine import Engine
from torchbuild.runtime.options import LaunchOptions, NamedProfileChoice
from torchbuild.runtime.tasks import options_task
from torchbuild.sif.host import SifResult, build_sif
from torchbuild.sif.recipe import bootstrap_for, build_from_recipe, write_definition


@dataclasses.dataclass(frozen=True)
class SifFlags:
    """`invoke sif`'s own flags (the profile's are NamedProfileChoice's): where the SIF goes, which apptainer
    makes it, and how."""

    out: str = option(".", "directory for torch-build-<profile>-<arch>.sif (default: the current directory)")
    apptainer: str = like(LaunchOptions, "apptainer")
    rebuild: bool = option(False, "convert again even when the SIF already comes from the current image")
    compression: str = option(
        "",
        "squashfs compression, ALGORITHM[:LEVEL]: gzip (default, level 6; every Apptainer and "
        "Singularity runs it) or zstd (level 3; faster, but only Apptainer 1.4+ runs the SIF)",
    )
    from_recipe: bool = option(
        False,
        "build the SIF from the toolchain recipe with Apptainer alone (no Docker, no image): "
        "the profile's sif_bootstrap says whether the base comes from a registry (docker) or a Debian/Ubuntu "
        "mirror (debootstrap)",
    )
    write_definition_: str = option(
        "",
        "with --from-recipe: write the Apptainer definition and its build context to this "
        "directory and stop (to review it, or build it by hand there)",
    )


@options_task(
    models={"choice": NamedProfileChoice, "given": SifFlags},
    # a real difference, not a second declaration: sif has no --engine, and its builder is the
    # apptainer-builder container, so --apptainer's help says so instead of LaunchOptions'
    help={"apptainer": "auto (this host's apptainer, else the apptainer-builder container), host or docker"},
)
def sif(c: Context, choice: NamedProfileChoice, given: SifFlags) -> None:
    """Convert the profile's toolchain image (built by `invoke image`) into an Apptainer SIF, or
    build the SIF from the toolchain recipe with Apptainer alone (--from-recipe)."""
    spec = choice.spec()
    out, apptainer, rebuild, compression = given.out, given.apptainer, given.rebuild, given.compression
    if given.write_definition_ and not given.from_recipe:
        raise UsageError("--write-definition writes the recipe's definition", hint="add --from-recipe")
    if given.from_recipe:
        _from_recipe(spec, user_path(out), apptainer, rebuild, compression, given.write_definition_)
        return
    _from_image(spec, out, apptainer, rebuild, compression)


def _from_image(spec: BuildSpec, out: str, apptainer: str, rebuild: bool, compression: str) -> None:
    """Convert the profile's toolchain image (with the comms stack built in it, when the profile wants one) into
    the SIF and print what was made."""
    engine = Engine.connect()
    runner = locate(spec, apptainer, engine=lambda: engine)
    carried = None
    if comms_wanted(spec):  # the SIF carries the NCCL and plugin built in its image
        made = build_comms(spec, choose(spec, "docker", Options()), out_dir=cache_dir(spec) / "comms-out")
        carried = (made.prefix, made.manifest)
    result = build_sif(spec, engine, runner, user_path(out), rebuild=rebuild, comms=carried, compression=compression)
    ratio = result.size / result.image_size if result.image_size else 0.0
    state = "up to date (made from the current image)" if result.cached else f"written in {result.seconds:.1f} s"
    _report(result, state, f"{ratio:.2f} x the image ({spec.image_tag})")


def _report(result: SifResult, state: str, made_from: str) -> None:
    print(f"{result.path} {state}: {result.size / 2**20:.0f} MiB ({result.compression}), {made_from}")
    if result.link:
        print(f"{result.link} -> {result.path.name}")
    if result.log:
        print(f"log: {result.log}")
    print(f"run it: apptainer run --bind SRC:/src,CACHE:/cache {result.path.name} build --preflight")


def _from_recipe(
    spec: BuildSpec, out: Path, apptainer: str, rebuild: bool, compression: str, definition_dir: str
) -> None:
    if definition_dir:
        deffile = write_definition(spec, user_path(definition_dir).absolute(), compression)
        print(f"{deffile} written, its build context beside it")
        print(f"build it: apptainer build --fakeroot {sif_filename(spec)} {deffile}")
        return
    if apptainer == "auto" and not host_apptainer():
        try:
            engine = Engine.connect(timeout=30)
        except EngineUnavailable:
            raise ToolMissing(
                "neither apptainer nor singularity is on PATH, and there is no Docker engine for the apptainer-builder",
                hint="`module load apptainer` (or install Apptainer 1.1 or later), then run this again",
            ) from None
        runner = locate(spec, apptainer, engine=lambda: engine)  # the builder on the engine just reached
    else:
        runner = locate(spec, apptainer)
    result = build_from_recipe(spec, runner, out, rebuild=rebuild, compression=compression)
    state = "up to date (made from the current recipe)" if result.cached else f"built in {result.seconds:.1f} s"
    _report(result, state, f"from the recipe ({bootstrap_for(spec)})")
    if comms_wanted(spec):  # the SIF has their tools; they are built where the site's libfabric is
        print(
            f"NCCL and the plugin: `invoke comms --profile {spec.profile} --in-container --engine apptainer "
            f"--sif {result.path}` on the site's node (`invoke submit` runs it first), then bind what it prints"
        )
