"""The option models the tasks of several features share (core/options.py turns each field into
a flag with its help, and a batch job's argv back): where a step runs (LaunchOptions: every task
that launches a step) and what a compile asks (BuildOptions: build, and comms and develop less
NOT_COMPILE_OPTIONS). Here, under the features, so that runtime/tasks.py and comms/devloop take
them without importing builder/. ProfileChoice (the profile, its arch and --set overrides) is
LaunchOptions' first three fields, and the whole of what a task that only resolves the profile
takes (config, source, patches: models={"choice": ProfileChoice})."""

from __future__ import annotations

import dataclasses
import os

from torchbuild.core.errors import ProfileError
from torchbuild.core.options import option
from torchbuild.profile.config import DEFAULT_PROFILE, BuildSpec, find_profile, parse_jobs_option, resolve
from torchbuild.runtime.backends import ENGINE_HELP

_PROFILE_HELP = (
    "profile name (configs/profiles) or path to a .yaml file; default $TORCHBUILD_PROFILE, else " + DEFAULT_PROFILE
)
_RETRY_HELP = "fail with OutOfMemory at the first out-of-memory kill instead of resuming with fewer jobs"


def profile_name(profile: str) -> str:
    """--profile, else the profile baked into the image or SIF ($TORCHBUILD_PROFILE), else the default."""
    return profile or os.environ.get("TORCHBUILD_PROFILE") or DEFAULT_PROFILE


def spec_from(profile: str, set_: list[str] | None, arch: str | None) -> BuildSpec:
    name = profile_name(profile)
    if not profile and os.environ.get("TORCHBUILD_PROFILE"):
        try:
            find_profile(name)
        except ProfileError as exc:  # say where the name came from: no --profile was given
            raise ProfileError(f"$TORCHBUILD_PROFILE: {exc.message}", hint=exc.hint) from None
    return resolve(name, set_ or [], arch=arch or None)


@dataclasses.dataclass(frozen=True)
class ProfileChoice:
    """The profile a task resolves: its name or file, the arch and the --set overrides. In this
    order: LaunchOptions inherits them as its first fields, and invoke picks a task's short flags
    in the order of its parameters."""

    profile: str = option("", _PROFILE_HELP)
    arch: str = option(
        "", "target architecture: x86_64 or aarch64 (default: the profile's, else this host's); image takes all"
    )
    set_: tuple[str, ...] = option(
        (), "override a profile key: --set key=value (repeatable; maps: --set switches.USE_MPI=1)"
    )

    def spec(self) -> BuildSpec:
        """The resolved profile (spec_from)."""
        return spec_from(self.profile, list(self.set_), self.arch)


@dataclasses.dataclass(frozen=True)
class NamedProfileChoice(ProfileChoice):
    """ProfileChoice whose --profile defaults to the default profile by its name rather than to ""
    (which spec_from reads as $TORCHBUILD_PROFILE, else the default): `invoke image` and `invoke sif`
    have always defaulted so: they run on the host, where no image or SIF has baked a profile in.
    The same flag and place among the fields; its help names that default."""

    profile: str = option(
        DEFAULT_PROFILE, "profile name (configs/profiles) or path to a .yaml file; default " + DEFAULT_PROFILE
    )


@dataclasses.dataclass(frozen=True)
class LaunchOptions(ProfileChoice):
    """The options of every task that runs a step natively, in the image or in the SIF: the
    profile, its overrides (ProfileChoice's fields, first) and where the step runs
    (runtime/tasks.py Launch; a batch job passes where its build runs on as to_argv of these)."""

    in_container: bool = option(
        False, "run in a container: short for --engine docker (default: natively, on this machine)"
    )
    engine: str = option("", f"where it runs: {ENGINE_HELP}; default native, docker with --in-container")
    sif: str = option("", "with --engine apptainer: the SIF (default ./torch-build-<profile>-<arch>.sif)")
    apptainer: str = option(
        "auto", "with --engine apptainer: auto (this host's apptainer, else the builder container), host, docker"
    )
    nv: bool = option(False, "with --engine apptainer: pass --nv (NVIDIA driver and GPUs into the SIF; for GPU nodes)")
    user: str = option("", "uid:gid the container runs as (default: yours; --engine docker only)")
    memory: str = option("", "memory limit of the container, e.g. 8g (default: none; not natively)")
    rebuild_image: bool = option(
        False, "with --engine docker: rebuild the toolchain image when it was built from other inputs"
    )


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What `invoke build` asks of the build itself (BuildRequest's knobs)."""

    preflight: bool = option(False, "configure and build only the preflight targets and canaries (minutes, not hours)")
    targets: tuple[str, ...] = option(
        (), "preflight CMake target (repeatable; default: the profile's preflight_targets)", flag="target"
    )
    canaries: tuple[str, ...] = option(
        (), "preflight canary source file (repeatable; default: the profile's canaries)", flag="canary"
    )
    clean: bool = option(False, "remove the tree's build/ directory first (ccache still helps)")
    jobs: int = option(
        0, "parallel compile jobs, an integer >= 1 (default: planned from cores and memory)", parse=parse_jobs_option
    )
    oom_retry: bool = option(True, _RETRY_HELP, flag="no_retry")


# what a step that compiles but builds no wheel takes of BuildOptions (comms, develop): --jobs, --no-retry
NOT_COMPILE_OPTIONS = ("preflight", "targets", "canaries", "clean")
