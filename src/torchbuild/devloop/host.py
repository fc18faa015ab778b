"""`invoke develop` on the host: check the tree, the venv and the backend (every failure named
at once), then run the develop step (devloop/step.py) with the tree and the venv at their own
paths, since an editable install records absolute paths."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from torchbuild.core import records
from torchbuild.core.errors import PathError, SourceError, named_os_errors, writable_dir
from torchbuild.core.problems import Problems
from torchbuild.devloop.step import Request
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.backends import Backend, Binds
from torchbuild.source.fetch import describe_dir


def check_venv_path(venv: Path) -> Path:
    """venv, when it can be the develop venv: a venv, an empty directory or a new path.
    PathError for a file, or a directory holding other things (nothing is installed there)."""
    with named_os_errors(venv, "--venv"):
        if venv.exists() and not venv.is_dir():
            raise PathError(
                f"--venv {venv} is a file, not a venv directory",
                hint="give a venv directory, or a path that does not exist yet (the venv is made there)",
            )
        if venv.is_dir() and any(venv.iterdir()) and not (venv / "pyvenv.cfg").is_file():
            raise PathError(
                f"--venv {venv} is a directory but not a venv (no pyvenv.cfg)",
                hint="give a venv, an empty directory or a new path (torchbuild does not install among other files)",
            )
    return venv


def default_venv(spec: BuildSpec, tree: Path, cache: Path) -> Path:
    """<cache>/venvs/develop-<profile>-<tree name>-<hash of the tree's path>: one per tree and profile."""
    digest = hashlib.sha256(str(tree).encode()).hexdigest()[:8]
    return cache / "venvs" / f"develop-{spec.profile}-{tree.name}-{digest}"


def develop_with(
    spec: BuildSpec,
    backend: Backend,
    tree: Path,
    venv: Path | None,
    cache: Path,
    *,
    jobs: int = 0,
    oom_retry: bool = True,
    out: TextIO = sys.stdout,
    problems: Problems | None = None,
) -> Path:
    """Check, then run the develop step with `backend`. The tree and the venv are seen at their
    own paths in the image or SIF too: an editable install records absolute paths. The log goes
    to <cache>/develop/logs. Every check's failure is named at once (with those already in
    problems, the task's own)."""
    venv, logs = _check(spec, backend, tree, venv, cache, problems or Problems())
    binds = Binds(cache=cache, out=logs, extra=(tree, venv.parent))
    view = backend.view(binds)
    log = view.out / f"develop-{spec.profile}-{tree.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    req = Request(
        spec=spec,
        tree=str(tree),
        venv=str(venv),
        log=str(log),
        cache_root=str(view.cache),
        backend=backend.name,
        jobs=jobs,
        oom_retry=oom_retry,
    )
    backend.run("develop", records.to_dict(req), binds)
    print(venv, file=out)
    return venv


def _check(
    spec: BuildSpec, backend: Backend, tree: Path, venv: Path | None, cache: Path, problems: Problems
) -> tuple[Path, Path]:
    """Check the backend, the tree (a project tree, writable), the venv's path (default_venv's without --venv)
    and the log directory, every failure named at once; the venv's absolute path and the log directory."""
    problems.check(backend.check)
    # SourceError when it is no project tree
    if problems.check(lambda: describe_dir(tree)) is not None and not os.access(tree, os.W_OK):
        problems.add(SourceError(f"{tree} is not writable: a development install builds in its build/ directory"))
    venv = (venv or default_venv(spec, tree, cache)).absolute()
    if problems.check(lambda: check_venv_path(venv)) is not None:
        problems.check(lambda: writable_dir(venv.parent, "--venv's directory"))
    logs = problems.check(lambda: writable_dir(cache / "develop" / "logs", "cache_dir"))
    problems.raise_any()
    assert logs is not None
    return venv, logs
