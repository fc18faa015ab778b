"""A wheelhouse: built wheels in one directory with a PEP 503 simple index, so that both
`pip install --no-index --find-links DIR torch` and `--index-url file://DIR/simple` work.

Wheel names and versions go through packaging. A project may hold several public versions,
but one local label only (2.6.0+gh200 and 2.6.0+cpu side by side make pip's choice depend
on sort order), unless the caller asks for the mix. Wheels are copied under a temporary name
and renamed; the index is rewritten from what is in the directory, each page atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import html
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.errors import (
    FloorError,
    InstallFailed,
    PathError,
    ToolMissing,
    TorchbuildError,
    UsageError,
    WheelhouseConflict,
    named_os_errors,
)
from torchbuild.core.process import run_streamed
from torchbuild.core.safeio import MiB, read_text, sha256_file, user_path
from torchbuild.profile.config import BuildSpec
from torchbuild.verify.host import check_wheel_file

SIMPLE = "simple"
PARTIAL = ".partial-"


@dataclasses.dataclass(frozen=True)
class WheelFile:
    path: Path
    project: NormalizedName
    version: Version
    tags: frozenset[Tag] = frozenset()  # the interpreters and platforms it installs on

    @classmethod
    def read(cls, path: Path, what: str = "--wheel", hint: str | None = None) -> WheelFile:
        """WheelError unless path is a wheel (its name and its zip's *.dist-info/WHEEL); what
        and hint: where the file came from and what to do, for the message (check_wheel_file)."""
        check_wheel_file(path, what, hint)
        name, version, _build, tags = parse_wheel_filename(path.name)
        return cls(path, name, version, tags)

    @property
    def local(self) -> str:
        return self.version.local or ""


def wheels_in(directory: Path, what: str = "the file", hint: str | None = None) -> list[WheelFile]:
    """The wheels directly in directory (partial copies left out), sorted by file name; a *.whl
    there that is no wheel is a WheelError saying `what` it is (the file, the wheelhouse's
    file), never `--wheel`, which the user did not give."""
    with named_os_errors(directory, "reading the wheel directory"):
        names = sorted(p for p in directory.glob("*.whl") if not p.name.startswith((".", PARTIAL)))
    hint = hint or f"remove it from {directory}, or name the wheels with --wheel W"
    return [WheelFile.read(p, what, hint) for p in names]


def wheels_in_house(dest: Path) -> list[WheelFile]:
    """wheels_in for a wheelhouse: a damaged file already there is named as the wheelhouse's."""
    return wheels_in(
        dest,
        "the wheelhouse's file",
        hint=f"remove or replace it: {dest} must hold only wheels pip can install (its index lists them all)",
    )


def check_mix(wheels: Iterable[WheelFile], *, allow_mixed: bool = False, what: str = "the wheelhouse") -> None:
    """WheelhouseConflict when a project comes with more than one local label (2.6.0+gh200
    next to 2.6.0+cpu, or next to a plain 2.6.0) and allow_mixed is false, or when two files
    of one project and version share a tag (the same Python and platform: only a build number
    or the name would tell them apart). One version for several Pythons (cp313 and cp314, what
    `invoke build --python 3.13,3.14` writes) is fine: each interpreter installs only its own."""
    by_project: dict[str, dict[str, list[WheelFile]]] = {}
    seen: dict[tuple[str, Version], list[WheelFile]] = {}
    for w in wheels:
        for twin in seen.get((w.project, w.version), []):
            shared = twin.tags & w.tags
            if twin.path.name != w.path.name and shared:
                raise WheelhouseConflict(
                    f"{what} would hold two wheels of {w.project} {w.version} for {min(map(str, shared))}: "
                    f"{twin.path.name} and {w.path.name}",
                    hint="keep one of them; a wheel for the same Python and platform goes in another wheelhouse",
                )
        seen.setdefault((w.project, w.version), []).append(w)
        by_project.setdefault(w.project, {}).setdefault(w.local, []).append(w)
    if allow_mixed:
        return
    for project, locals_ in by_project.items():
        if len(locals_) > 1:
            shown = "; ".join(
                f"+{label or '(none)'}: {', '.join(x.path.name for x in ws)}" for label, ws in locals_.items()
            )
            raise WheelhouseConflict(
                f"{what} would mix local versions of {project}: {shown}",
                hint="use one wheelhouse per build flavour, or pass --mix-local-versions if that is what you want",
            )


def add_wheels(
    dest: Path,
    wheels: Sequence[Path],
    *,
    allow_mixed: bool = False,
    link: bool = True,
    floor: tuple[str, str] = ("", ""),
) -> list[Path]:
    """Copy wheels into dest (hard links where dest is on the same file system, with link) and
    rewrite its index. A wheel already there with the same content is kept; one with the same
    name and other content is a WheelhouseConflict; one whose ELF floor is above the house's
    floor (glibc_floor, libstdcxx_floor: the site profile's) a FloorError. Returns the paths of
    the wheels added. Nothing is copied when a check fails."""
    incoming = _distinct_wheels(wheels)
    check_floor(incoming, *floor)
    made = [d for d in (dest, *dest.parents) if not d.exists()]  # what a failure removes again
    with named_os_errors(dest, "the wheelhouse"):
        dest.mkdir(parents=True, exist_ok=True)
    added: list[Path] = []
    try:
        _add(dest, incoming, allow_mixed, link, added)
    except BaseException:
        # the wheelhouse is left as it was: what this call made goes, with the wheels it added
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)  # everything under it is this call's
        elif added:
            for f in added:
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError, TorchbuildError):
                write_index(dest)  # the pages as they were, where the index was half rewritten
        raise
    return added


def _distinct_wheels(wheels: Sequence[Path]) -> list[WheelFile]:
    """The wheels to add, read, each name once (the same file or content given twice counts once);
    WheelhouseConflict for two different wheels of one name, UsageError for none."""
    incoming: list[WheelFile] = []
    for w in (WheelFile.read(user_path(p).resolve()) for p in wheels):
        twin = next((x for x in incoming if x.path.name == w.path.name), None)
        if twin is None:
            incoming.append(w)
        elif twin.path != w.path and sha256_file(twin.path) != sha256_file(w.path):
            raise WheelhouseConflict(
                f"two different wheels named {w.path.name}: {twin.path} and {w.path}",
                hint="give one of them; a wheel's name must say what it holds",
            )
    if not incoming:
        raise UsageError("no wheels to add", hint="give --wheel W (repeatable), or build one into --out first")
    return incoming


def check_floor(incoming: Sequence[WheelFile], glibc_floor: str, libstdcxx_floor: str) -> None:
    """FloorError naming each wheel whose shared objects need a newer glibc or libstdc++ than
    the house's floor (measured with auditwheel, elffloor.analyse); nothing without a floor."""
    if not glibc_floor and not libstdcxx_floor:
        return
    from torchbuild.runtime import elffloor

    above = []
    for w in incoming:
        found = elffloor.problems(elffloor.analyse(w.path), glibc_floor, libstdcxx_floor)
        if found:
            above.append(f"{w.path.name} {'; '.join(found)}")
    if above:
        raise FloorError(
            f"the wheelhouse's floor is {_floor_text(glibc_floor, libstdcxx_floor)}: {', '.join(above)}",
            hint="rebuild the wheel on a base that meets the floor (`invoke config` names it); nothing was added",
        )


def _floor_text(glibc_floor: str, libstdcxx_floor: str) -> str:
    return " and ".join(f"{k} {v}" for k, v in (("glibc", glibc_floor), ("GLIBCXX", libstdcxx_floor)) if v)


def _add(dest: Path, incoming: list[WheelFile], allow_mixed: bool, link: bool, added: list[Path]) -> None:
    present = {w.path.name: w for w in wheels_in_house(dest)}
    todo = []
    for w in incoming:
        there = present.get(w.path.name)
        if there is None:
            todo.append(w)
        elif sha256_file(there.path) != sha256_file(w.path):
            raise WheelhouseConflict(
                f"{dest} already holds a different {w.path.name}",
                hint="a published wheel never changes: bump local_version for the new build, or use another wheelhouse",
            )
    names = {w.path.name for w in todo}
    check_mix([*present.values(), *(w for w in incoming if w.path.name in names)], allow_mixed=allow_mixed)
    with named_os_errors(dest, "the wheelhouse"):
        _refuse_links(dest, {w.project for w in (*present.values(), *incoming)})
    for w in todo:
        final = dest / w.path.name
        tmp = dest / f"{PARTIAL}{uuid.uuid4().hex[:8]}-{w.path.name}"
        with named_os_errors(final, "copying into the wheelhouse"):
            try:
                _link_or_copy(w.path, tmp, link)
                os.replace(tmp, final)
                added.append(final)
            finally:
                tmp.unlink(missing_ok=True)
    write_index(dest)


def _link_or_copy(src: Path, dst: Path, link: bool) -> None:
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def write_index(dest: Path) -> Path:
    """dest/simple/index.html and dest/simple/<project>/index.html (PEP 503, with PEP 629's
    repository version), each link carrying the wheel's sha256; pages of projects no longer
    present are removed. Returns dest/simple."""
    wheels = wheels_in_house(dest)
    simple = dest / SIMPLE
    projects: dict[str, list[WheelFile]] = {}
    for w in wheels:
        projects.setdefault(w.project, []).append(w)
    with named_os_errors(simple, "writing the wheelhouse index"):
        _refuse_links(dest, projects)
        simple.mkdir(exist_ok=True)
        for project, ws in sorted(projects.items()):
            links = [
                f'    <a href="../../{html.escape(w.path.name)}#sha256={sha256_file(w.path)}">{html.escape(w.path.name)}</a><br>'
                for w in ws
            ]
            (simple / project).mkdir(exist_ok=True)
            _write(simple / project / "index.html", _page(f"Links for {project}", links))
        root = [f'    <a href="{html.escape(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)]
        _write(simple / "index.html", _page("Simple index", root))
        for stale in simple.iterdir():
            if stale.name not in projects and _our_page_only(stale):
                (stale / "index.html").unlink()
                stale.rmdir()
    return simple


# a project page's link as _project_page writes it
_LINK = re.compile(r'    <a href="\.\./\.\./([^"/<>]+\.whl)#sha256=[0-9a-f]{64}">\1</a><br>')
_PAGE_LIMIT = 1 * MiB  # a page of ours lists a few wheels: far less than this


def _our_page_only(directory: Path) -> bool:
    """Whether directory (in simple/) holds nothing but a project page torchbuild writes for
    it: the stale-page sweep removes those and leaves anything else (a page another tool wrote,
    a file of the user's) as it is."""
    if directory.is_symlink() or not directory.is_dir():
        return False
    try:
        if [p.name for p in directory.iterdir()] != ["index.html"]:
            return False
        text = read_text(directory / "index.html", _PAGE_LIMIT, "a wheelhouse index page")
    except (OSError, TorchbuildError):
        return False
    head = _page(f"Links for {directory.name}", []).split("  </body>")[0]
    body = text[len(head) :].split("\n")
    return (
        text.startswith(head)
        and text.endswith("  </body>\n</html>\n")
        and all(_LINK.fullmatch(line) for line in body[:-3])
        and body[-3:] == ["  </body>", "</html>", ""]
    )


def _refuse_links(dest: Path, projects: Iterable[str]) -> None:
    """PathError when simple/ or a project's page directory is a symbolic link: the index is
    written in dest only, never through a link to elsewhere."""
    simple = dest / SIMPLE
    for d in (simple, *(simple / p for p in projects)):
        if d.is_symlink():
            raise PathError(
                f"{d} is a symbolic link: the wheelhouse's index is written in {dest} only",
                hint=f"remove the link, or use another --dest than {dest}",
            )


def _page(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            "<html>",
            "  <head>",
            '    <meta name="pypi:repository-version" content="1.0">',
            f"    <title>{html.escape(title)}</title>",
            "  </head>",
            "  <body>",
            *body,
            "  </body>",
            "</html>",
            "",
        ]
    )


def _write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


# --------------------------------------------------------------------------- listing
# `invoke wheelhouse --list`: what the Alliance's `avail_wheels` prints for its wheelhouse
# (columns name, version, python, arch; the newest version of each name unless all are asked
# for), from the file names alone: a listing never opens a wheel.

LIST_LIMIT = 100_000  # directory entries read: far more than any wheelhouse holds
COLUMNS = ("name", "version", "python", "arch")


@dataclasses.dataclass(frozen=True)
class Listed:
    """One wheel as `avail_wheels` shows it."""

    name: str  # the project's normalized name
    version: Version
    python: str  # the interpreter tags: cp311, py3, or cp311,cp312 for a multi-tag name
    arch: str  # x86_64, aarch64, ..., or generic for a pure-Python wheel
    file: str

    def row(self) -> tuple[str, str, str, str]:
        return (self.name, str(self.version), self.python, self.arch)


def _arch(tags: frozenset[Tag]) -> str:
    """The machine a wheel's platform tags name (linux_x86_64, manylinux_2_28_aarch64 ...), or
    generic (platform any)."""
    machines = set()
    for tag in tags:
        if tag.platform == "any":
            continue
        m = re.search(r"(x86_64|aarch64|ppc64le|s390x|armv7l|i686|riscv64|arm64|amd64)$", tag.platform)
        machines.add(m.group(1) if m else tag.platform)
    return ",".join(sorted(machines)) or "generic"


def scan(directory: Path, problems: list[str] | None = None) -> list[Listed]:
    """The wheels directly in directory, by name (at most LIST_LIMIT entries are read); names
    that are not wheels are skipped, a *.whl whose name does not parse is named in problems."""
    found: list[Listed] = []
    with named_os_errors(directory, "reading the wheelhouse"), os.scandir(directory) as entries:
        for count, entry in enumerate(entries):
            if count >= LIST_LIMIT:
                if problems is not None:
                    problems.append(f"{directory}: more than {LIST_LIMIT} entries; the rest are not listed")
                break
            if not entry.name.endswith(".whl") or entry.name.startswith((".", PARTIAL)):
                continue
            try:
                name, version, _build, tags = parse_wheel_filename(entry.name)
            except InvalidWheelFilename as exc:
                if problems is not None:
                    problems.append(f"{directory / entry.name}: not a wheel name ({exc})")
                continue
            pythons = ",".join(sorted({t.interpreter for t in tags}, key=_python_key))
            found.append(Listed(name, version, pythons, _arch(tags), entry.name))
    return found


def _python_key(tag: str) -> tuple[str, int]:
    digits = re.sub(r"\D", "", tag)
    return (tag.rstrip("0123456789"), int(digits) if digits else 0)


@dataclasses.dataclass(frozen=True)
class ListFilter:
    """avail_wheels' filters: names and versions as globs, a Python X.Y, an arch."""

    names: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    python: str = ""
    arch: str = ""
    all_versions: bool = False

    def check(self) -> None:
        if self.python and not re.fullmatch(r"3\.\d+", self.python):
            raise UsageError(f"--python {self.python!r} is no Python version", hint="e.g. --python 3.11")

    def keeps(self, w: Listed) -> bool:
        if self.names and not any(_glob(w.name, n) or _glob(w.name, canonicalize_name(n)) for n in self.names):
            return False
        if self.versions and not any(_glob(str(w.version), v) for v in self.versions):
            return False
        if self.arch and w.arch not in (self.arch, "generic") and self.arch not in w.arch.split(","):
            return False
        return not self.python or bool(set(w.python.split(",")) & _interpreters(self.python))


def _glob(value: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(value.lower(), pattern.lower())


def _interpreters(python: str) -> set[str]:
    """The interpreter tags Python X.Y installs: cpXY, pyXY, pyX, and py2.py3's halves."""
    major, minor = python.split(".")
    return {f"cp{major}{minor}", f"py{major}{minor}", f"py{major}"}


def listing(directory: Path, wanted: ListFilter, problems: list[str] | None = None) -> list[Listed]:
    """The wheels wanted keeps, sorted by name, then newest version first, then Python; without
    all_versions only each name's newest version (of the wheels the other filters keep)."""
    wanted.check()
    kept = [w for w in scan(directory, problems) if wanted.keeps(w)]
    if not wanted.all_versions:
        newest: dict[str, Version] = {}
        for w in kept:
            newest[w.name] = max(newest.get(w.name, w.version), w.version)
        kept = [w for w in kept if w.version == newest[w.name]]
    kept.sort(key=lambda w: (w.name, _Newest(w.version), _python_key(w.python.split(",")[0]), w.arch))
    return kept


@functools.total_ordering
class _Newest:
    """A sort key that puts newer versions first."""

    def __init__(self, version: Version) -> None:
        self.version = version

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Newest) and self.version == other.version

    def __lt__(self, other: _Newest) -> bool:
        return self.version > other.version

    def __hash__(self) -> int:
        return hash(self.version)


def plain_columns(rows: Sequence[Sequence[str]]) -> str:
    """rows under COLUMNS as whitespace-aligned text with no rules (for a pipe: awk, cut, grep)."""
    every = [list(COLUMNS), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in every) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in every)


# --------------------------------------------------------------------------- mpi4py, built once
# The Alliance's wheelhouse holds an mpi4py wheel its staff built against the site's MPI; jobs
# and installs take it with `pip install --no-index --find-links`, never compiling mpi4py per
# install. `invoke wheelhouse --add-mpi4py` builds that wheel here, with the profile's MPI
# compiler wrapper (load the MPI module first), and publishes it like any other wheel.


def site_python(spec: BuildSpec, given: str = "") -> str:
    """--python, else python<python_version> on PATH, else this interpreter when it is that
    version; ToolMissing otherwise."""
    want = given or f"python{spec.python_version}"
    found = shutil.which(want)
    if found:
        return found
    if not given and spec.python_version == "{}.{}".format(*sys.version_info[:2]):
        return sys.executable
    raise ToolMissing(
        f"{want} is not on PATH: the mpi4py wheel is built for the profile's Python {spec.python_version}",
        hint=f"load the Python module (module load python/{spec.python_version}) or give --python",
    )


def build_mpi4py_wheel(
    spec: BuildSpec, dest: Path, *, python: str = "", find_links: Sequence[Path] = (), out: TextIO = sys.stdout
) -> list[Path]:
    """Build mpi4py (the profile's runtime_packages pin, else the newest) from its sdist with
    MPICC set to the profile's mpicc (default mpicc) and add the wheel to dest. The wheel is
    tagged linux_<arch>, as a wheel built here is: `invoke install` takes it over compiling."""
    from torchbuild.install.step import mpi4py_requirement

    wrapper = spec.mpicc or "mpicc"
    mpicc = shutil.which(wrapper)
    if mpicc is None:
        raise ToolMissing(
            f"the MPI compiler wrapper {wrapper!r} is not on PATH: the mpi4py wheel is built with it",
            hint="load the site's MPI module (e.g. module load openmpi), or set mpicc to its wrapper",
        )
    py = site_python(spec, python)
    requirement = mpi4py_requirement(spec)
    print(f"building a wheel of {requirement} with MPICC={mpicc} and {py}", file=out, flush=True)
    links = [a for d in find_links for a in ("--find-links", str(user_path(d).absolute()))]
    env = {**os.environ, "MPICC": mpicc, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}

    def line(text: str) -> None:
        out.write(f"  | {text}")

    with tempfile.TemporaryDirectory(prefix="torchbuild-mpi4py-") as tmp:
        cmd = [py, "-m", "pip", "wheel", "--no-deps", "--no-binary", "mpi4py", "--no-cache-dir", "-w", tmp]
        done = run_streamed([*cmd, *links, "--", requirement], on_line=line, env=env)
        built = sorted(Path(tmp).glob("mpi4py-*.whl"))
        if done.returncode != 0 or len(built) != 1:
            raise InstallFailed(
                f"building the mpi4py wheel failed (pip wheel exit code {done.returncode})",
                hint="see pip's output above: mpi4py needs the MPI's headers (the MPI module's development part)",
            )
        return add_wheels(dest, built, link=False)
