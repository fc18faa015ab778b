"""invoke doctor: what this host can do."""

from __future__ import annotations

import dataclasses

from invoke.context import Context

from torchbuild.core.options import like, option
from torchbuild.core.safeio import user_path
from torchbuild.doctor.host import need_build_section, render, run_checks
from torchbuild.profile.config import default_cache_dir
from torchbuild.runtime.options import ProfileChoice
from torchbuild.runtime.tasks import HELP, options_task, profile_name


@dataclasses.dataclass(frozen=True)
class DoctorChecks:
    """What `invoke doctor` checks beside the host: the cache's disk and, with --profile, the profile."""

    cache_dir: str = option(
        "",
        "cache directory whose free space is reported (default $XDG_CACHE_HOME/torchbuild, else ~/.cache/torchbuild)",
    )
    profile: str = like(ProfileChoice, "profile")


@options_task(
    models={"given": DoctorChecks},
    # --profile's help says what doctor does with the profile: ProfileChoice's help, and more
    help={
        "profile": HELP["profile"] + "; its ca_certificates and ccache_remote are checked, and whether it needs "
        "a source build at all (MPI, a build-time NCCL, patches, an arch list...) or the official wheel would do",
    },
)
def doctor(c: Context, given: DoctorChecks) -> None:
    """Report engine, BuildKit, Apptainer, qemu binfmt, cores, memory, disk, GPU, added host CAs and the
    profile's shared compile cache (ccache_remote); a verdict per task. With --profile, also which of the
    profile's choices need a source build, or the official-wheel route where none does."""
    cache = user_path(given.cache_dir or default_cache_dir())
    print(render(*run_checks(cache, profile=profile_name(given.profile))))
    if given.profile:
        print(f"\n{need_build_section(given.profile)}")
