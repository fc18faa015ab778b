"""invoke install and mpi-check: from the wheel to an environment on the cluster."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context

from torchbuild.core.errors import UsageError
from torchbuild.core.safeio import user_path
from torchbuild.install.host import install as install_env
from torchbuild.install.host import mpi_check as check_mpi
from torchbuild.runtime.tasks import Launch, launch_task

OUT_HELP = "the directory of built wheels (default ./out); staging files go there too"


@launch_task(
    help={
        "prefix": "where the environment goes (a new or empty directory, or one torchbuild installed, with --force)",
        "wheel": "a wheel to install (repeatable; default: every wheel in --out)",
        "out": OUT_HELP,
        "find_links": "a directory of wheels or sdists pip may use for dependencies and runtime_packages (repeatable)",
        "no_index": "never ask a package index: dependencies and runtime_packages from --find-links only",
        "force": "replace an environment torchbuild installed at --prefix",
        "python": "the interpreter the venv is made from (default: the profile's install_python, else python3.X on "
        "PATH where it runs, for the wheels' cp3X tag; the profile's python_version for pure-Python wheels)",
        "module_name": "the modulefile's name (default torch, or the first wheel's project)",
    },
    iterable=["wheel", "find_links"],
)
def install(
    c: Context,
    launch: Launch,
    prefix: str,
    wheel: list[str] | None = None,
    out: str = "out",
    find_links: list[str] | None = None,
    no_index: bool = False,
    force: bool = False,
    python: str = "",
    module_name: str = "",
) -> None:
    """Make a venv of the built wheels with runtime_packages, mpi4py, activate and modulefiles.

    Its activate script and Lmod/Tcl modulefiles set runtime_env; a wheel linked to the NCCL of `invoke comms`
    brings it and the plugin along (copied in, first on LD_LIBRARY_PATH, NCCL_NET_PLUGIN; torch is checked to load
    them). Natively, in the toolchain image (--in-container) or in the SIF (--engine apptainer):
    the environment runs where it was made. See the docs' "After the build" (docs/guide/after-the-build.md)."""
    spec = launch.spec()
    install_env(
        spec,
        launch.backend(spec),
        prefix=Path(prefix),
        wheels=[Path(w) for w in wheel or []],
        out_dir=user_path(out).absolute(),
        find_links=[Path(f) for f in find_links or []],
        no_index=no_index,
        force=force,
        python=python,
        module_name=module_name,
    )


@launch_task(
    name="mpi-check",
    help={
        "host_mpi": "a host directory with the MPI library to bind in and put first on LD_LIBRARY_PATH "
        "(repeatable; default the profile's host_mpi; containers only)",
        "python": "check this interpreter (e.g. PREFIX/bin/python of an install, which imports mpi4py and torch)",
        "out": "where the step's request file goes (default ./out)",
    },
    iterable=["host_mpi"],
)
def mpi_check(
    c: Context, launch: Launch, host_mpi: list[str] | None = None, python: str = "", out: str = "out"
) -> None:
    """Print which MPI library a Python process really loads, and its version string.

    The path and MPI_Get_library_version, natively, in the image or in the SIF with the host's MPI bound in;
    fails when host MPI was asked for and another library was loaded."""
    spec = launch.spec()
    dirs = tuple(host_mpi or (spec.host_mpi if launch.runtime != "native" else ()))
    for d in dirs:
        if not Path(d).is_absolute() or not Path(d).is_dir():
            raise UsageError(
                f"--host-mpi {d} is not an existing absolute directory", hint="give the directory of libmpi.so.12"
            )
    check_mpi(spec, launch.backend(spec, host_mpi=dirs), out_dir=user_path(out).absolute(), python=python)
