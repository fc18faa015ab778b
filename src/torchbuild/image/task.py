"""invoke image / base-image: toolchain images and local Debian base images."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from invoke.context import Context

from torchbuild.core.arch import Arch
from torchbuild.core.errors import UsageError
from torchbuild.core.options import option
from torchbuild.core.safeio import user_path
from torchbuild.image.baseimage import DEFAULT_COMPONENTS, make_base_image
from torchbuild.image.host import build_image, default_lock_path, find_lock, lock_image, push_images
from torchbuild.profile.config import BuildSpec, cache_dir, default_cache_dir
from torchbuild.runtime.engine import Engine
from torchbuild.runtime.options import NamedProfileChoice
from torchbuild.runtime.tasks import options_task


@dataclasses.dataclass(frozen=True)
class ImageFlags:
    """`invoke image`'s own flags (the profile's are NamedProfileChoice's): how the image is built, its lock,
    and the push."""

    rebuild: bool = option(False, "rebuild from scratch (no layer cache), even when the image is current")
    pull: bool = option(False, "pull the base image again before building")
    apt_option: tuple[str, ...] = option(
        (), "extra apt-get option inside the build (repeatable), e.g. -o Acquire::Check-Valid-Until=false"
    )
    push: bool = option(False, "push the images and a multi-arch manifest list <image_name>:<profile>-<torch_version>")
    lock: bool = option(
        False,
        "pin what the image installs (apt name=version, pip with sha256s) in a lock file, then build "
        "from it; with --rebuild every package is resolved afresh",
    )
    lock_file: str = option("", "the lock to use or write (default: <profile>.<arch>.lock beside the profile file)")


@options_task(models={"choice": NamedProfileChoice, "given": ImageFlags})
def image(c: Context, choice: NamedProfileChoice, given: ImageFlags) -> None:
    """Build the Docker toolchain image for a profile and arch (--arch all: both); a cache hit when nothing
    changed. With a lock file present (<profile>.<arch>.lock beside the profile), it installs exactly the lock;
    --lock writes (or refreshes) it."""

    specs = _image_specs(choice, given.lock_file)
    engine = Engine.connect()
    lock_file = user_path(given.lock_file).absolute() if given.lock_file else None
    rebuild, pull, apt_options = given.rebuild, given.pull, list(given.apt_option)
    for spec in specs:
        if given.lock:
            _lock_and_build(spec, engine, lock_file, rebuild=rebuild, pull=pull, apt_options=apt_options)
        else:
            _build_one(spec, engine, lock_file, rebuild=rebuild, pull=pull, apt_options=apt_options)
    if given.push:
        print(f"pushed {push_images(engine, specs)} ({', '.join(s.arch.value for s in specs)})")


def _image_specs(choice: NamedProfileChoice, lock_file: str) -> list[BuildSpec]:
    """The spec of each arch `invoke image` builds (--arch all: both), after checking --lock-file names one."""
    arch = choice.arch
    if lock_file and arch == "all":
        raise UsageError(
            "--lock-file names one lock, --arch all builds two",
            hint="leave --lock-file out: each arch uses <profile>.<arch>.lock beside the profile",
        )
    arches = [a.value for a in Arch] if arch == "all" else [arch]
    return [dataclasses.replace(choice, arch=a).spec() for a in arches]


def _lock_and_build(
    spec: BuildSpec, engine: Engine, given: Path | None, *, rebuild: bool, pull: bool, apt_options: list[str]
) -> None:
    """`invoke image --lock` for one arch: write the lock, build from it, and print both builds and the lock."""
    logs = cache_dir(spec) / "logs"
    done = lock_image(
        spec,
        engine,
        path=given or default_lock_path(spec),
        logs_dir=logs,
        rebuild=rebuild,
        pull=pull,
        apt_options=apt_options,
    )
    for what, step in (("without the lock", done.unlocked), ("from the lock", done.locked)):
        state = "up to date (cache hit)" if step.cached else "built"
        print(f"{step.tag} {what} {state}: {step.image_id[:19]} in {step.seconds:.1f} s")
    print(
        f"lock written: {done.path} ({done.apt} apt and {done.pip} pip pins, {done.size} bytes, "
        f"sha256 {done.sha256[:16]}...): both images list the same packages"
    )


def _build_one(
    spec: BuildSpec, engine: Engine, given: Path | None, *, rebuild: bool, pull: bool, apt_options: list[str]
) -> None:
    """`invoke image` for one arch: build it (from its lock when there is one) and print the result."""
    result = build_image(
        spec,
        engine,
        logs_dir=cache_dir(spec) / "logs",
        rebuild=rebuild,
        pull=pull,
        apt_options=apt_options,
        locked=find_lock(spec, given),
    )
    state = "up to date (cache hit)" if result.cached else "built"
    print(f"{result.tag} {state}: {result.image_id[:19]} in {result.seconds:.1f} s")
    if result.log:
        print(f"build log: {result.log}")


@dataclasses.dataclass(frozen=True)
class BaseImageFlags:
    """`invoke base-image`'s flags: the Debian suite, arch and mirror, and where the root filesystem is made."""

    suite: str = option("trixie", "Debian suite: bookworm, trixie, sid (default trixie)")
    arch: str = option("", "x86_64 or aarch64 (a foreign arch needs qemu-user binfmt)")
    mirror: str = option("", "Debian mirror URL (default: debootstrap's own default)")
    components: str = option(
        ",".join(DEFAULT_COMPONENTS), f"archive components, comma-separated (default {','.join(DEFAULT_COMPONENTS)})"
    )
    ignore_valid_until: bool = option(False, "let apt in the image accept expired Release files (snapshot mirrors)")
    rebuild: bool = option(False, "make it again even if the tag exists")
    cache_dir: str = option(
        "",
        "where the temporary root filesystem is made (default $XDG_CACHE_HOME/torchbuild, else ~/.cache/torchbuild)",
    )


@options_task(models={"given": BaseImageFlags}, name="base-image")
def base_image(c: Context, given: BaseImageFlags) -> None:
    """Make a local Debian base image (debootstrap + import) for hosts without registry access."""

    target = Arch.parse(given.arch) if given.arch else Arch.host()
    engine = Engine.connect()
    tag, made = make_base_image(
        engine,
        suite=given.suite,
        arch=target,
        work_dir=user_path(given.cache_dir or default_cache_dir()) / "rootfs",
        mirror=given.mirror or None,
        components=tuple(x for x in given.components.split(",") if x),
        ignore_valid_until=given.ignore_valid_until,
        rebuild=given.rebuild,
    )
    print(f"{tag} {'made' if made else 'already present (use --rebuild to make it again)'}")
