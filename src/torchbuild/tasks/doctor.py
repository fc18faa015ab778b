"""invoke doctor: what this host can do."""

from __future__ import annotations

from invoke.context import Context

from torchbuild.core.safeio import user_path
from torchbuild.launch.doctor import render, run_checks
from torchbuild.tasks.common import handles_errors, task


@task(help={"cache_dir": "cache directory whose free space is reported (default ~/.cache/torchbuild)"})
@handles_errors
def doctor(c: Context, cache_dir: str = "~/.cache/torchbuild") -> None:
    """Report engine, BuildKit, Apptainer, qemu binfmt, cores, memory, disk, GPU and added host CAs; a verdict per task."""
    print(render(*run_checks(user_path(cache_dir))))
