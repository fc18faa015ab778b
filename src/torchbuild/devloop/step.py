"""`invoke develop`: the tree installed in a venv in development mode, for the edit-build-run loop.

The venv sees the build interpreter's packages (the same ones a wheel build sees with
--no-build-isolation: numpy, setuptools, cmake...) through `--system-site-packages` and, when
that interpreter is itself a venv (the image's /opt/venv), a .pth naming its site-packages.
The tree is installed with `pip install -e . --no-build-isolation --no-deps` (PyTorch before
2.8, whose CONTRIBUTING still used it: `setup.py develop`), with the build's environment:
ccache, the job planner's MAX_JOBS, the profile's compilers and flags. A rerun finds the
tree's build/ directory and ninja compiles only what changed: the object count of each run
is read from build/.ninja_log and printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from packaging.version import InvalidVersion, Version

from torchbuild.core.errors import BuildFailed, TorchbuildError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.core.progress import Tee
from torchbuild.core.safeio import KiB, read_text
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime import compile_job, skbuild
from torchbuild.runtime.compile_job import CompileJob, now_utc, open_log, path_independent
from torchbuild.runtime.environment import compile_env
from torchbuild.runtime.report import LogMark, mark, read_ninja_log
from torchbuild.runtime.tree import is_skbuild

BASE_PTH = "torchbuild-base.pth"
# PyTorch's CONTRIBUTING moved from `setup.py develop` to `pip install -e .` for 2.8
PIP_EDITABLE_FROM = Version("2.8")
VERSION_TXT_LIMIT = 64 * KiB  # a version.txt holds one line


@dataclasses.dataclass(frozen=True)
class Request:
    spec: BuildSpec
    tree: str  # the tree as the step sees it (at its own path: editable paths must hold everywhere)
    venv: str
    log: str
    cache_root: str
    backend: str = "native"
    jobs: int = 0
    oom_retry: bool = True


def mode_for(tree: Path) -> str:
    """'setup.py' for a PyTorch tree with a setup.py older than 2.8 (version.txt), else 'pip'
    (a scikit-build-core tree has no setup.py to run)."""
    if is_skbuild(tree):
        return "pip"
    try:
        version = Version(read_text(tree / "version.txt", VERSION_TXT_LIMIT, "the tree's version.txt").strip())
    except (TorchbuildError, InvalidVersion):  # none, or not one (a FIFO, a huge file): pip's way
        return "pip"
    return "pip" if version.release[:2] >= PIP_EDITABLE_FROM.release[:2] else "setup.py"


def make_venv(venv: Path, say: Callable[[str], None]) -> Path:
    """The venv (made once), layered over this interpreter's packages; its python."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    say(f"making the venv {venv}")
    existed = venv.exists()
    try:
        _make_venv(venv, python)
    except BaseException:
        if not existed:  # a half-made venv would pass for a made one next time
            shutil.rmtree(venv, ignore_errors=True)
        raise
    return python


def _make_venv(venv: Path, python: Path) -> None:
    with named_os_errors(venv, "making the develop venv"):
        proc = run_captured([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
        if proc.returncode != 0:
            raise BuildFailed(f"python -m venv {venv} failed: {(proc.stderr or proc.stdout).strip()}")
        if sys.prefix != sys.base_prefix:  # this interpreter is a venv: its packages too
            paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
            code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
            site = run_captured([str(python), "-c", code], timeout=QUERY_TIMEOUT)
            if site.returncode != 0:
                raise BuildFailed(f"the new venv's python does not run: {(site.stderr or site.stdout).strip()}")
            (Path(site.stdout.strip()) / BASE_PTH).write_text("".join(f"{p}\n" for p in paths))


def develop(req: Request, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Install req.tree in development mode into req.venv; what was done (also printed)."""
    tree, venv = Path(req.tree), Path(req.venv)
    started, t0 = now_utc(), time.monotonic()
    tee = open_log(Path(req.log), out, what="writing the develop log")
    try:
        python = make_venv(venv, tee.line)
        job = _job(req, tee)
        job.started, job.t0 = started, t0  # the venv is part of it
        mode = mode_for(tree)
        ninja_log = tree / "build" / ".ninja_log"
        before = mark(ninja_log)
        tee.line(f"torchbuild develop: {tree} into {venv} ({mode}), jobs {job.plan.jobs} ({job.plan.reason})")
        job.zero_ccache()
        cmd = _install_command(python, tree, mode, job)
        job.compile(lambda n: cmd, cwd=str(tree), what=f"the {mode} development install")
        compiled = _compiled_objects(ninja_log, before)
        project = _editable_project(python, tree, venv, job.env)
        record = job.record()
        result = {
            "venv": str(venv),
            "project": project,
            "mode": mode,
            "compiled": compiled,
            "ccache": {k: record["ccache"][k] for k in ("hits", "misses")},
            "seconds": record["duration_s"],
        }
        tee.line(
            f"{result['project']} installed in development mode: {len(compiled)} object(s) compiled "
            f"({record['ccache']['hits']} ccache hits), {result['seconds']} s"
        )
        tee.line(f"venv: {venv}  (activate: source {venv}/bin/activate)")
        return result
    finally:
        tee.close()


def _install_command(python: Path, tree: Path, mode: str, job: CompileJob) -> list[str]:
    """The development install's command: `pip install -e` (mode pip), else `setup.py develop`."""
    if mode == "pip":
        # a scikit-build-core tree: its build/ kept and the code generation's include (runtime/skbuild.py)
        config = skbuild.config_settings(skbuild.project_defines(job.env_vars, {})) if is_skbuild(tree) else []
        return [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-deps",
            "-v",
            *config,
            "-e",
            str(tree),
        ]
    return [str(python), "setup.py", "develop"]


def _compiled_objects(ninja_log: Path, before: LogMark | None) -> list[str]:
    """The object files the install compiled: what ninja logged after the mark before."""
    return [
        o
        for step in (read_ninja_log(ninja_log, since=before) if ninja_log.is_file() else [])
        for o in step.outputs
        if o.endswith(".o")
    ]


def _job(req: Request, tee: Tee) -> CompileJob:
    """The compile job of a development install: planned here, the build's environment with
    the venv first on PATH; ccache's and pip's cache directories made."""
    plan = compile_job.plan(req.spec, req.cache_root, req.jobs)
    env_vars = compile_env(req.spec, plan, req.cache_root, backend=req.backend)
    env_vars.update(path_independent(env_vars, req.tree))  # another checkout of it hits the cache
    for d in (env_vars["CCACHE_DIR"], env_vars["PIP_CACHE_DIR"]):
        with named_os_errors(d, "creating the build's cache directories"):
            Path(d).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        **env_vars,
        "VIRTUAL_ENV": req.venv,
        "PATH": f"{req.venv}/bin{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return CompileJob(req.spec, plan, env_vars, env, tee, req.oom_retry)


def _editable_project(python: Path, tree: Path, venv: Path, env: Mapping[str, str]) -> str:
    """name==version of the project pip lists as installed in development mode from tree."""
    listed = run_captured([str(python), "-m", "pip", "list", "--editable", "--format", "json"], env=env, timeout=600)
    shown = listed.stdout if listed.returncode is not None else ""  # past its deadline: a part of the JSON
    editable = [p for p in (json.loads(shown or "[]")) if Path(p.get("editable_project_location", "")) == tree]
    if not editable:
        raise BuildFailed(
            f"{tree} is not installed in development mode in {venv} (pip list --editable does not show it)"
        )
    return f"{editable[0]['name']}=={editable[0]['version']}"


def run_develop_step(req: Request) -> int:
    develop(req)
    return 0
