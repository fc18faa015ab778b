"""A wheelhouse: built wheels in one directory with a PEP 503 simple index, so that both
`pip install --no-index --find-links DIR torch` and `--index-url file://DIR/simple` work.

Wheel names and versions go through packaging. A project may hold several public versions,
but one local label only (2.6.0+gh200 and 2.6.0+cpu side by side make pip's choice depend
on sort order), unless the caller asks for the mix. Wheels are copied under a temporary name
and renamed; the index is rewritten from what is in the directory, each page atomically.
"""

from __future__ import annotations

import dataclasses
import html
import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.utils import NormalizedName, parse_wheel_filename
from packaging.version import Version

from .errors import UsageError, WheelhouseConflict, named_os_errors
from .source import sha256_file
from .verify import check_wheel_file

SIMPLE = "simple"
PARTIAL = ".partial-"


@dataclasses.dataclass(frozen=True)
class WheelFile:
    path: Path
    project: NormalizedName
    version: Version

    @classmethod
    def read(cls, path: Path) -> WheelFile:
        """WheelError unless path is a wheel (its name and its zip's *.dist-info/WHEEL)."""
        check_wheel_file(path)
        name, version, _build, _tags = parse_wheel_filename(path.name)
        return cls(path, name, version)

    @property
    def local(self) -> str:
        return self.version.local or ""


def wheels_in(directory: Path) -> list[WheelFile]:
    """The wheels directly in directory (partial copies left out), sorted by file name."""
    with named_os_errors(directory, "reading the wheel directory"):
        names = sorted(p for p in directory.glob("*.whl") if not p.name.startswith((".", PARTIAL)))
    return [WheelFile.read(p) for p in names]


def check_mix(wheels: Iterable[WheelFile], *, allow_mixed: bool = False, what: str = "the wheelhouse") -> None:
    """WheelhouseConflict when a project comes with more than one local label (2.6.0+gh200
    next to 2.6.0+cpu, or next to a plain 2.6.0) and allow_mixed is false; UsageError when two
    files carry the same project and version (pip would pick one of them at random)."""
    by_project: dict[str, dict[str, list[WheelFile]]] = {}
    seen: dict[tuple[str, Version], WheelFile] = {}
    for w in wheels:
        twin = seen.get((w.project, w.version))
        if twin is not None and twin.path.name != w.path.name:
            raise WheelhouseConflict(
                f"{what} would hold two wheels of {w.project} {w.version}: {twin.path.name} and {w.path.name}",
                hint="keep one of them (wheels for other Pythons or platforms go in another wheelhouse)",
            )
        seen[(w.project, w.version)] = w
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


def add_wheels(dest: Path, wheels: Sequence[Path], *, allow_mixed: bool = False, link: bool = True) -> list[Path]:
    """Copy wheels into dest (hard links where dest is on the same file system, with link) and
    rewrite its index. A wheel already there with the same content is kept; one with the same
    name and other content is a WheelhouseConflict. Returns the paths of the wheels added.
    Nothing is copied when a check fails."""
    incoming: list[WheelFile] = []
    for w in (WheelFile.read(Path(p).expanduser().resolve()) for p in wheels):
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
    with named_os_errors(dest, "the wheelhouse"):
        dest.mkdir(parents=True, exist_ok=True)
    present = {w.path.name: w for w in wheels_in(dest)}
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
    added = []
    for w in todo:
        final = dest / w.path.name
        tmp = dest / f"{PARTIAL}{uuid.uuid4().hex[:8]}-{w.path.name}"
        with named_os_errors(final, "copying into the wheelhouse"):
            try:
                _link_or_copy(w.path, tmp, link)
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
        added.append(final)
    write_index(dest)
    return added


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
    wheels = wheels_in(dest)
    simple = dest / SIMPLE
    projects: dict[str, list[WheelFile]] = {}
    for w in wheels:
        projects.setdefault(w.project, []).append(w)
    with named_os_errors(simple, "writing the wheelhouse index"):
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
            if stale.is_dir() and stale.name not in projects:
                shutil.rmtree(stale)
    return simple


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
    tmp = path.with_name(f"{PARTIAL}{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
