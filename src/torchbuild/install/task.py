"""invoke install and mpi-check: from the wheel to an environment on the cluster."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from invoke.context import Context

from torchbuild.core.errors import UsageError
from torchbuild.core.options import option, positional
from torchbuild.core.safeio import user_path
from torchbuild.install.host import install as install_env
from torchbuild.install.host import mpi_check as check_mpi
from torchbuild.runtime.tasks import Launch, launch_task

OUT_HELP = "the directory of built wheels (default ./out); staging files go there too"


@dataclasses.dataclass(frozen=True)
class InstallFlags:
    """`invoke install`'s own flags (the launch options' come with @launch_task): where the environment goes,
    the wheels, where pip may look, and the venv's interpreter and modulefile."""

    prefix: str = positional(
        "where the environment goes (a new or empty directory, or one torchbuild installed, with --force)"
    )
    wheel: tuple[str, ...] = option((), "a wheel to install (repeatable; default: every wheel in --out)")
    out: str = option("out", OUT_HELP)
    find_links: tuple[str, ...] = option(
        (), "a directory of wheels or sdists pip may use for dependencies and runtime_packages (repeatable)"
    )
    no_index: bool = option(
        False, "never ask a package index: dependencies and runtime_packages from --find-links only"
    )
    force: bool = option(False, "replace an environment torchbuild installed at --prefix")
    python: str = option(
        "",
        "the interpreter the venv is made from (default: the profile's install_python, else python3.X on "
        "PATH where it runs, for the wheels' cp3X tag; the profile's python_version for pure-Python wheels)",
    )
    module_name: str = option("", "the modulefile's name (default torch, or the first wheel's project)")


@launch_task(models={"given": InstallFlags})
def install(c: Context, launch: Launch, given: InstallFlags) -> None:
    """Make a venv of the built wheels with runtime_packages, mpi4py, activate and modulefiles.

    Its activate script and Lmod/Tcl modulefiles set runtime_env; a wheel linked to the NCCL of `invoke comms`
    brings it and the plugin along (copied in, first on LD_LIBRARY_PATH, NCCL_NET_PLUGIN; torch is checked to load
    them). Natively, in the toolchain image (--in-container) or in the SIF (--engine apptainer):
    the environment runs where it was made. See the docs' "After the build" (docs/guide/after-the-build.md)."""
    spec = launch.spec()
    install_env(
        spec,
        launch.backend(spec),
        prefix=Path(given.prefix),
        wheels=[Path(w) for w in given.wheel],
        out_dir=user_path(given.out).absolute(),
        find_links=[Path(f) for f in given.find_links],
        no_index=given.no_index,
        force=given.force,
        python=given.python,
        module_name=given.module_name,
    )


@dataclasses.dataclass(frozen=True)
class MpiCheckFlags:
    """`invoke mpi-check`'s own flags: the host MPI bound in, the interpreter checked, where the request goes."""

    host_mpi: tuple[str, ...] = option(
        (),
        "a host directory with the MPI library to bind in and put first on LD_LIBRARY_PATH "
        "(repeatable; default the profile's host_mpi; containers only)",
    )
    python: str = option(
        "", "check this interpreter (e.g. PREFIX/bin/python of an install, which imports mpi4py and torch)"
    )
    out: str = option("out", "where the step's request file goes (default ./out)")


@launch_task(models={"given": MpiCheckFlags}, name="mpi-check")
def mpi_check(c: Context, launch: Launch, given: MpiCheckFlags) -> None:
    """Print which MPI library a Python process really loads, and its version string.

    The path and MPI_Get_library_version, natively, in the image or in the SIF with the host's MPI bound in;
    fails when host MPI was asked for and another library was loaded."""
    spec = launch.spec()
    dirs = tuple(given.host_mpi or (spec.host_mpi if launch.runtime != "native" else ()))
    for d in dirs:
        if not Path(d).is_absolute() or not Path(d).is_dir():
            raise UsageError(
                f"--host-mpi {d} is not an existing absolute directory", hint="give the directory of libmpi.so.12"
            )
    check_mpi(spec, launch.backend(spec, host_mpi=dirs), out_dir=user_path(given.out).absolute(), python=given.python)
