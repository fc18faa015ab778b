"""invoke doctor: what this host can do."""

from __future__ import annotations

from invoke.context import Context

from torchbuild.core.safeio import user_path
from torchbuild.doctor.host import need_build_section, render, run_checks
from torchbuild.profile.config import default_cache_dir
from torchbuild.runtime.tasks import HELP, handles_errors, profile_name, task


@task(
    help={
        "cache_dir": "cache directory whose free space is reported (default $XDG_CACHE_HOME/torchbuild, else ~/.cache/torchbuild)",
        "profile": HELP["profile"] + "; its ca_certificates and ccache_remote are checked, and whether it needs "
        "a source build at all (MPI, a build-time NCCL, patches, an arch list...) or the official wheel would do",
    }
)
@handles_errors
def doctor(c: Context, cache_dir: str = "", profile: str = "") -> None:
    """Report engine, BuildKit, Apptainer, qemu binfmt, cores, memory, disk, GPU, added host CAs and the
    profile's shared compile cache (ccache_remote); a verdict per task. With --profile, also which of the
    profile's choices need a source build, or the official-wheel route where none does."""
    print(render(*run_checks(user_path(cache_dir or default_cache_dir()), profile=profile_name(profile))))
    if profile:
        print(f"\n{need_build_section(profile)}")
