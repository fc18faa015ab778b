"""invoke wheelhouse: publish built wheels into a wheelhouse, list it as the Alliance's
`avail_wheels` does, and add an mpi4py wheel built once against the site's MPI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from invoke.context import Context

from torchbuild.core import console
from torchbuild.core.errors import PathError, UsageError
from torchbuild.core.safeio import user_path
from torchbuild.install.wheelhouse import (
    COLUMNS,
    ListFilter,
    add_wheels,
    build_mpi4py_wheel,
    listing,
    plain_columns,
    wheels_in,
    wheels_in_house,
)
from torchbuild.runtime.tasks import HELP, handles_errors, spec_from, task

OUT_HELP = "the directory of built wheels (default ./out); staging files go there too"


# `invoke wheelhouse`'s flags, as `invoke --help wheelhouse` shows them
_FLAG_HELP = {
    "dest": "the wheelhouse directory (created if missing; wheels already there stay)",
    "wheel": "a wheel to add (repeatable; default: every wheel in --out)",
    "out": OUT_HELP,
    "mix_local_versions": "allow one project with several local labels (2.6.0+gh200 next to 2.6.0+cpu)",
    "list_": "list the wheels in --dest as avail_wheels does (name, version, python, arch); adds nothing",
    "name": "with --list: a name or glob to show (repeatable; default all)",
    "version": "with --list: a version or glob to show (repeatable), e.g. '2.6*'",
    "python": "with --list: only wheels Python X.Y installs (cp311, py3); with --add-mpi4py: the interpreter",
    "arch": "with --list: x86_64, aarch64, ... (pure-Python wheels, arch generic, are shown for any)",
    "all_versions": "with --list: every version of each name, not only the newest",
    "add_mpi4py": "build an mpi4py wheel with the profile's MPI (its mpicc, on PATH) and add it to --dest",
    "find_links": "with --add-mpi4py: a directory holding the mpi4py sdist, for a host without an index",
    "profile": HELP["profile"],
    "set_": HELP["set_"],
}


@task(
    help=_FLAG_HELP,
    iterable=["wheel", "name", "version", "find_links", "set_"],
)
@handles_errors
def wheelhouse(
    c: Context,
    dest: str,
    wheel: list[str] | None = None,
    out: str = "out",
    mix_local_versions: bool = False,
    list_: bool = False,
    name: list[str] | None = None,
    version: list[str] | None = None,
    python: str = "",
    arch: str = "",
    all_versions: bool = False,
    add_mpi4py: bool = False,
    find_links: list[str] | None = None,
    profile: str = "",
    set_: list[str] | None = None,
) -> None:
    """Collect built wheels into a directory with a PEP 503 simple index, or list it (--list).

    `pip install --no-index --find-links DEST torch` (or --index-url file://DEST/simple). --list prints what the
    Alliance's avail_wheels prints; --add-mpi4py builds mpi4py once against the site's MPI for jobs and installs."""
    target = user_path(dest, "--dest").absolute()
    if list_:
        wanted = ListFilter(tuple(name or ()), tuple(version or ()), python, arch, all_versions)
        _print_listing(target, wanted)
        return
    if name or version or arch or all_versions:
        raise UsageError("--name, --version, --arch and --all-versions filter --list", hint="add --list")
    if add_mpi4py:
        spec = spec_from(profile, set_, None)
        links = [Path(f) for f in find_links or []]
        added = build_mpi4py_wheel(spec, target, python=python, find_links=links)
    else:
        added = _add_built_wheels(target, wheel, out, profile, set_, mix_local_versions=mix_local_versions)
    _print_added(target, added)


def _add_built_wheels(
    target: Path, wheel: list[str] | None, out: str, profile: str, set_: list[str] | None, *, mix_local_versions: bool
) -> list[Path]:
    """Add --wheel (default: every wheel in --out) to the house, above the site profile's floor where one is named."""
    wheels = [Path(w) for w in wheel or []] or [w.path for w in wheels_in(user_path(out).absolute())]
    if not wheels:
        raise UsageError(f"no wheels in {out}", hint="build one first, or give --wheel W")
    # the house's floor: the site profile's, where one is given
    named = profile or set_ or os.environ.get("TORCHBUILD_PROFILE")
    house = spec_from(profile, set_, None) if named else None
    floor = (house.glibc_floor, house.libstdcxx_floor) if house else ("", "")
    return add_wheels(target, wheels, allow_mixed=mix_local_versions, floor=floor)


def _print_added(target: Path, added: list[Path]) -> None:
    """Name each wheel added, then the house's size, its index and how to install from it."""
    for p in added:
        print(f"added {console.printable(p.name)}")
    print(console.printable(f"{len(wheels_in_house(target))} wheels in {target}; index: {target / 'simple'}"))
    print(f"use: pip install --no-index --find-links {target} <name>")


def _print_listing(target: Path, wanted: ListFilter) -> None:
    """The table on a terminal, plain columns in a pipe; files that are no wheels on stderr."""
    if not target.is_dir():
        raise PathError(f"--dest {target} is no directory", hint="give the wheelhouse directory")
    problems: list[str] = []
    rows = [w.row() for w in listing(target, wanted, problems)]
    for problem in problems:
        print(f"warning: {console.printable(problem)}", file=sys.stderr)
    if not rows:
        print(f"no wheels in {target} match", file=sys.stderr)
        return
    if sys.stdout.isatty():
        print(console.table(COLUMNS, rows))
    else:
        print(plain_columns([[console.printable(v) for v in r] for r in rows]))
