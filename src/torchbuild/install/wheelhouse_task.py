"""invoke wheelhouse: publish built wheels into a wheelhouse, list it as the Alliance's
`avail_wheels` does, and add an mpi4py wheel built once against the site's MPI."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from invoke.context import Context

from torchbuild.core import console
from torchbuild.core.errors import PathError, UsageError
from torchbuild.core.options import like, option, positional
from torchbuild.core.safeio import user_path
from torchbuild.install.task import InstallFlags
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
from torchbuild.runtime.options import ProfileChoice
from torchbuild.runtime.tasks import options_task, spec_from


@dataclasses.dataclass(frozen=True)
class WheelhouseFlags:
    """`invoke wheelhouse`'s flags: the house, the wheels added to it, --list's filters, --add-mpi4py, and the
    site profile (its floor, its MPI; no --arch: --arch here filters --list)."""

    dest: str = positional("the wheelhouse directory (created if missing; wheels already there stay)")
    wheel: tuple[str, ...] = option((), "a wheel to add (repeatable; default: every wheel in --out)")
    out: str = like(InstallFlags, "out")
    mix_local_versions: bool = option(
        False, "allow one project with several local labels (2.6.0+gh200 next to 2.6.0+cpu)"
    )
    list_: bool = option(
        False, "list the wheels in --dest as avail_wheels does (name, version, python, arch); adds nothing"
    )
    name: tuple[str, ...] = option((), "with --list: a name or glob to show (repeatable; default all)")
    version: tuple[str, ...] = option((), "with --list: a version or glob to show (repeatable), e.g. '2.6*'")
    python: str = option(
        "", "with --list: only wheels Python X.Y installs (cp311, py3); with --add-mpi4py: the interpreter"
    )
    arch: str = option("", "with --list: x86_64, aarch64, ... (pure-Python wheels, arch generic, are shown for any)")
    all_versions: bool = option(False, "with --list: every version of each name, not only the newest")
    add_mpi4py: bool = option(
        False, "build an mpi4py wheel with the profile's MPI (its mpicc, on PATH) and add it to --dest"
    )
    find_links: tuple[str, ...] = option(
        (), "with --add-mpi4py: a directory holding the mpi4py sdist, for a host without an index"
    )
    profile: str = like(ProfileChoice, "profile")
    set_: tuple[str, ...] = like(ProfileChoice, "set_")


@options_task(models={"given": WheelhouseFlags})
def wheelhouse(c: Context, given: WheelhouseFlags) -> None:
    """Collect built wheels into a directory with a PEP 503 simple index, or list it (--list).

    `pip install --no-index --find-links DEST torch` (or --index-url file://DEST/simple). --list prints what the
    Alliance's avail_wheels prints; --add-mpi4py builds mpi4py once against the site's MPI for jobs and installs."""
    target = user_path(given.dest, "--dest").absolute()
    if given.list_:
        wanted = ListFilter(given.name, given.version, given.python, given.arch, given.all_versions)
        _print_listing(target, wanted)
        return
    if given.name or given.version or given.arch or given.all_versions:
        raise UsageError("--name, --version, --arch and --all-versions filter --list", hint="add --list")
    profile, set_ = given.profile, list(given.set_)
    if given.add_mpi4py:
        spec = spec_from(profile, set_, None)
        links = [Path(f) for f in given.find_links]
        added = build_mpi4py_wheel(spec, target, python=given.python, find_links=links)
    else:
        wheel = list(given.wheel)
        added = _add_built_wheels(target, wheel, given.out, profile, set_, mix_local_versions=given.mix_local_versions)
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
