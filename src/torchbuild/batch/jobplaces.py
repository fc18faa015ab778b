"""Where a batch job's files are, checked on the login node before the job is submitted, and
what is made there for it.

- required (a profile key): the values only the user knows, e.g. archer2's cache_dir in the
  project's /work. A build job is refused while one is still at its default, with the
  profile's own words on what to give.
- unmounted_dirs (a profile key): directories the compute nodes do not mount (ARCHER2's /home).
  A job naming a path under one (its cache, source tree, --out, working directory, the Python
  and torchbuild it runs) would fail on the node, after its wait in the queue: refused here.
- The Python the job runs torchbuild with (job_python): this one by default, which a node of
  another arch cannot run (Bede: ppc64le login nodes, aarch64 GH200 nodes), so there the
  profile's job_python is required.
- The native build venv (builder/buildenv.py): made here, with the Python the job runs, before
  the job is submitted. Compute nodes often cannot reach PyPI (ARCHER2's may not); the job then
  finds the venv under the same key and reuses it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import torchbuild
from torchbuild.builder.host import BuildVenv, ensure
from torchbuild.core.arch import Arch, host_machine
from torchbuild.core.errors import PathError, ProfileError
from torchbuild.core.progress import Tee
from torchbuild.profile.config import BuildSpec, schema

# (what, path, hint): one place a job uses
Place = tuple[str, str, str]

_PYTHON_HINT = (
    "make torchbuild's venv on a file system the compute nodes mount (python3 -m venv DIR there, "
    "then DIR/bin/pip install torchbuild) and run invoke from it"
)


def check_required(spec: BuildSpec) -> None:
    """ProfileError for the first key of `required` still at its default."""
    keys, values = schema(), spec.to_dict()
    for key, what in spec.required.items():
        if values[key] == keys[key].default:
            raise ProfileError(
                f"profile {spec.profile} needs {key} from you: {what}",
                hint=f"--set {key}=VALUE ({spec.origins.get('required', 'the profile')} says why)",
            )


def under(path: str, dirs: Sequence[str]) -> str:
    """The first of dirs that path (as written, or resolved) is in; '' when none."""
    seen = {os.path.normpath(os.path.abspath(path)), os.path.realpath(path)}
    for d in dirs:
        top = os.path.normpath(d)
        if any(p == top or p.startswith(top.rstrip("/") + "/") for p in seen):
            return d
    return ""


def check_mounted(spec: BuildSpec, places: Sequence[Place]) -> None:
    """PathError for the first place under one of the profile's unmounted_dirs."""
    for what, path, hint in places:
        top = under(path, spec.unmounted_dirs)
        if top:
            raise PathError(
                f"{what} {path} is under {top}, which the compute nodes of profile {spec.profile} do not mount "
                "(unmounted_dirs): the job would fail there",
                hint=hint,
            )


def job_python(spec: BuildSpec) -> str:
    """The Python the job runs torchbuild with: the profile's job_python, else this one, which
    only a node of this host's arch can run (ProfileError otherwise, naming the fix)."""
    if spec.job_python:
        return spec.job_python
    here = Arch.host_or_none()
    if here is not spec.arch:
        machine = here.value if here else host_machine()
        raise ProfileError(
            f"profile {spec.profile} builds on {spec.arch} nodes and this host is {machine}: the job cannot run "
            f"this host's Python ({sys.executable})",
            hint=f"make a venv with torchbuild on a {spec.arch} node (python3 -m venv DIR, then DIR/bin/pip install "
            "torchbuild) on a file system the nodes mount, and --set job_python=DIR/bin/python",
        )
    return sys.executable


def runtime_places(spec: BuildSpec) -> list[Place]:
    """The Python the job runs and the torchbuild it imports (an editable or --user install may
    live elsewhere than the interpreter); job_python's own torchbuild is its own."""
    if spec.job_python:
        return [("job_python", spec.job_python, _PYTHON_HINT)] if spec.job_python.startswith("/") else []
    package = str(Path(torchbuild.__file__).resolve().parent)
    return [("the job's Python", sys.executable, _PYTHON_HINT), ("torchbuild", package, _PYTHON_HINT)]


def cache_place(spec: BuildSpec, cache: Path) -> Place:
    what = spec.required.get("cache_dir", "a directory the compute nodes mount")
    return ("cache_dir", str(cache), f"--set cache_dir=DIR: {what}")


def make_build_venv(spec: BuildSpec, source: str, cache: Path, log: Path, out: TextIO) -> BuildVenv | None:
    """The native build venv for the job, made (or found) here with this Python, which the job
    runs too: None where it cannot be made here (the source is not a tree yet, the job runs
    another Python, job_python, or on another arch than this host's)."""
    if not spec.build_venv or spec.job_python or not Path(source).is_dir() or Arch.host_or_none() is not spec.arch:
        return None
    tee = Tee(log, out, "lines")
    try:
        venv = ensure(spec, source, str(cache), sys.executable, tee)
    finally:
        tee.close()
    how = f"made here in {venv.seconds:.0f} s" if venv.created else "found"
    print(f"build venv: {how} ({venv.path}); the job reuses it, so its node needs no PyPI", file=out)
    return venv
