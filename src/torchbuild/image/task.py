"""invoke image / base-image: toolchain images and local Debian base images."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context

from torchbuild.core.arch import Arch
from torchbuild.core.errors import UsageError
from torchbuild.core.safeio import user_path
from torchbuild.image.baseimage import DEFAULT_COMPONENTS, make_base_image
from torchbuild.image.host import build_image, default_lock_path, find_lock, lock_image, push_images
from torchbuild.profile.config import DEFAULT_PROFILE, BuildSpec, cache_dir, default_cache_dir
from torchbuild.runtime.engine import Engine
from torchbuild.runtime.tasks import HELP, handles_errors, spec_from, task


@task(
    help={
        **HELP,
        "rebuild": "rebuild from scratch (no layer cache), even when the image is current",
        "pull": "pull the base image again before building",
        "apt_option": "extra apt-get option inside the build (repeatable), e.g. -o Acquire::Check-Valid-Until=false",
        "push": "push the images and a multi-arch manifest list <image_name>:<profile>-<torch_version>",
        "lock": "pin what the image installs (apt name=version, pip with sha256s) in a lock file, then build "
        "from it; with --rebuild every package is resolved afresh",
        "lock_file": "the lock to use or write (default: <profile>.<arch>.lock beside the profile file)",
    },
    iterable=["set_", "apt_option"],
)
@handles_errors
def image(
    c: Context,
    profile: str = DEFAULT_PROFILE,
    arch: str = "",
    set_: list[str] | None = None,
    rebuild: bool = False,
    pull: bool = False,
    apt_option: list[str] | None = None,
    push: bool = False,
    lock: bool = False,
    lock_file: str = "",
) -> None:
    """Build the Docker toolchain image for a profile and arch (--arch all: both); a cache hit when nothing
    changed. With a lock file present (<profile>.<arch>.lock beside the profile), it installs exactly the lock;
    --lock writes (or refreshes) it."""

    specs = _image_specs(profile, set_, arch, lock_file)
    engine = Engine.connect()
    given = user_path(lock_file).absolute() if lock_file else None
    for spec in specs:
        if lock:
            _lock_and_build(spec, engine, given, rebuild=rebuild, pull=pull, apt_options=apt_option or [])
        else:
            _build_one(spec, engine, given, rebuild=rebuild, pull=pull, apt_options=apt_option or [])
    if push:
        print(f"pushed {push_images(engine, specs)} ({', '.join(s.arch.value for s in specs)})")


def _image_specs(profile: str, set_: list[str] | None, arch: str, lock_file: str) -> list[BuildSpec]:
    """The spec of each arch `invoke image` builds (--arch all: both), after checking --lock-file names one."""
    if lock_file and arch == "all":
        raise UsageError(
            "--lock-file names one lock, --arch all builds two",
            hint="leave --lock-file out: each arch uses <profile>.<arch>.lock beside the profile",
        )
    arches = [a.value for a in Arch] if arch == "all" else [arch]
    return [spec_from(profile, set_, a) for a in arches]


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


@task(
    name="base-image",
    help={
        "suite": "Debian suite: bookworm, trixie, sid (default trixie)",
        "arch": "x86_64 or aarch64 (a foreign arch needs qemu-user binfmt)",
        "mirror": "Debian mirror URL (default: debootstrap's own default)",
        "components": f"archive components, comma-separated (default {','.join(DEFAULT_COMPONENTS)})",
        "ignore_valid_until": "let apt in the image accept expired Release files (snapshot mirrors)",
        "rebuild": "make it again even if the tag exists",
        "cache_dir": "where the temporary root filesystem is made (default $XDG_CACHE_HOME/torchbuild, else ~/.cache/torchbuild)",
    },
)
@handles_errors
def base_image(
    c: Context,
    suite: str = "trixie",
    arch: str = "",
    mirror: str = "",
    components: str = ",".join(DEFAULT_COMPONENTS),
    ignore_valid_until: bool = False,
    rebuild: bool = False,
    cache_dir: str = "",
) -> None:
    """Make a local Debian base image (debootstrap + import) for hosts without registry access."""

    target = Arch.parse(arch) if arch else Arch.host()
    engine = Engine.connect()
    tag, made = make_base_image(
        engine,
        suite=suite,
        arch=target,
        work_dir=user_path(cache_dir or default_cache_dir()) / "rootfs",
        mirror=mirror or None,
        components=tuple(x for x in components.split(",") if x),
        ignore_valid_until=ignore_valid_until,
        rebuild=rebuild,
    )
    print(f"{tag} {'made' if made else 'already present (use --rebuild to make it again)'}")
