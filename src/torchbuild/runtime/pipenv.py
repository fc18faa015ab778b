"""pip around a built torch: a site's pip configuration must not replace it.

HPC sites configure pip for everyone (/etc/pip.conf, /etc/xdg/pip/pip.conf, PIP_* variables):
`find-links` to the site's wheelhouse, which holds the site's own torch, and a `constraint`
file that pins or caps torch to that one. Both are right for the site's users and wrong for an
environment built around another torch: find-links offers a higher torch to any `--upgrade`
or unpinned requirement, and the site's constraint makes the built wheel uninstallable (pip:
"conflicting dependencies").

Every pip call that installs or resolves around the built torch (`invoke install`, `verify`'s
fresh venv, the companions' unpacked torch, `bench`'s torchbench install) runs with
PIP_CONSTRAINT naming a file of our own (`keep_built`): the built packages pinned with `===`
(arbitrary equality: `torch==2.6.0` would also admit a site's `2.6.0+cpu`), then the site's own
constraint lines on every other package. PIP_CONSTRAINT replaces the `constraint` of every pip
configuration file (pip reads its variables last), and our file carries the site's lines on, so
the site's caps on other packages still hold. The site's indexes and find-links are left as they
are: dependencies (numpy, filelock...) still come from where the site says, and the exact pins
make any other torch there unusable.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from torchbuild.core.errors import ToolMissing, TorchbuildError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.core.safeio import MiB, read_text

CONSTRAINTS_LIMIT = 1 * MiB  # a site's constraint file: a few hundred lines at most
# pip's configuration sections in the order it applies them for `pip install` (later wins)
_SECTIONS = ("global", "install", ":env:")


def pin(name: str, version: str) -> str:
    """`name===version`: exactly that version string, no other local label."""
    try:
        shown = str(Version(version))
    except InvalidVersion:
        shown = version
    return f"{canonicalize_name(name)}==={shown}"


def site_constraint_files(python: str, env: Mapping[str, str]) -> list[str]:
    """The constraint files `python -m pip install` would read from pip's configuration files
    and PIP_CONSTRAINT under env (`pip config list`): [] when there are none or pip cannot say."""
    try:
        proc = run_captured([python, "-m", "pip", "config", "list"], env=env, timeout=QUERY_TIMEOUT)
    except OSError:
        return []
    if proc.returncode is None:
        return []
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or name != "constraint" or section not in _SECTIONS:
            continue
        try:
            found[section] = str(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            found[section] = value
    chosen = next((found[s] for s in reversed(_SECTIONS) if s in found), "")
    return chosen.split()


def site_lines(files: Iterable[str], keep_out: Iterable[str]) -> list[str]:
    """The requirement lines of the site's constraint files that name none of keep_out (the
    packages we pin); files that cannot be read (a URL, gone, too large) and option lines
    (`-c other.txt`) are left out."""
    names = {canonicalize_name(n) for n in keep_out}
    kept: list[str] = []
    for file in files:
        path = Path(file.removeprefix("file://"))
        try:
            text = read_text(path, CONSTRAINTS_LIMIT, "the site's pip constraint file")
        except TorchbuildError:
            continue
        for raw in text.splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith(("#", "-")):
                continue
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if canonicalize_name(req.name) not in names:
                kept.append(line)
    return kept


def constraints_text(pins: Mapping[str, str], site: Iterable[str] = ()) -> str:
    """The constraints file: each of pins ({name: version}) exactly, then the site's lines."""
    lines = [pin(n, v) for n, v in sorted(pins.items())]
    return "".join(f"{line}\n" for line in [*lines, *site])


def keep_built(path: Path, pins: Mapping[str, str], python: str, env: Mapping[str, str]) -> dict[str, str]:
    """Write the constraints file at path (pins, then the site's own constraint lines on other
    packages, as `python -m pip` sees them under env); the variables a pip call gets so it
    keeps the pinned packages whatever the site's configuration says."""
    site = site_lines(site_constraint_files(python, env), pins)
    with named_os_errors(path, "writing pip's constraints for the built torch"):
        path.write_text(constraints_text(pins, site))
    return {"PIP_CONSTRAINT": str(path)}


def interpreter(version: str) -> str:
    """The interpreter for Python X.Y as this step sees it: this one when it is X.Y (or no
    version is asked), else the image's /opt/venv-X.Y (profile key python_versions), else
    pythonX.Y on PATH. ToolMissing naming the fix otherwise."""
    if not version or version == "{}.{}".format(*sys.version_info[:2]):
        return sys.executable
    venv = Path(f"/opt/venv-{version}/bin/python")
    if venv.is_file():
        return str(venv)
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise ToolMissing(
        f"no Python {version} here: neither /opt/venv-{version} (the image's) nor python{version} on PATH",
        hint=f"add {version!r} to the profile's python_versions and run `invoke image`, or install python{version}",
    )
