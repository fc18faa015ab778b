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
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from packaging.version import InvalidVersion, Version

from torchbuild.core.errors import BuildFailed, TorchbuildError, named_os_errors
from torchbuild.core.progress import Tee
from torchbuild.core.safeio import KiB, read_text
from torchbuild.inputs.config import BuildSpec, spec_from_dict
from torchbuild.inputs.environment import build_env
from torchbuild.inputs.jobs import HostResources, plan_for
from torchbuild.steps.compile_job import ccache_stats, hit_rate, path_independent
from torchbuild.steps.oom import JobsUsed, run_compile
from torchbuild.steps.report import mark, read_ninja_log

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

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["spec"] = self.spec.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        d = dict(data)
        d["spec"] = spec_from_dict(d["spec"], "develop request")
        return cls(**d)


def mode_for(tree: Path) -> str:
    """'setup.py' for a PyTorch tree older than 2.8 (version.txt), else 'pip'."""
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
        proc = subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise BuildFailed(f"python -m venv {venv} failed: {(proc.stderr or proc.stdout).strip()}")
        if sys.prefix != sys.base_prefix:  # this interpreter is a venv: its packages too
            paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
            code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
            site = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
            if site.returncode != 0:
                raise BuildFailed(f"the new venv's python does not run: {(site.stderr or site.stdout).strip()}")
            (Path(site.stdout.strip()) / BASE_PTH).write_text("".join(f"{p}\n" for p in paths))


def develop(req: Request, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Install req.tree in development mode into req.venv; what was done (also printed)."""
    tree, venv = Path(req.tree), Path(req.venv)
    t0 = time.monotonic()
    with named_os_errors(req.log, "writing the develop log"):
        tee = Tee(Path(req.log), out, "lines")
    try:
        python = make_venv(venv, tee.line)
        plan = plan_for(req.spec, HostResources.detect(), req.cache_root, req.jobs)
        env_vars = build_env(
            req.spec,
            cache_root=req.cache_root,
            jobs=plan.jobs,
            nvcc_threads=plan.nvcc_threads or None,
            backend=req.backend,
        )
        env_vars.update(path_independent(env_vars, str(tree)))  # another checkout of it hits the cache
        for d in (env_vars["CCACHE_DIR"], env_vars["PIP_CACHE_DIR"]):
            with named_os_errors(d, "creating the build's cache directories"):
                Path(d).mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **env_vars,
            "VIRTUAL_ENV": str(venv),
            "PATH": f"{venv}/bin{os.pathsep}{os.environ.get('PATH', '')}",
        }
        mode = mode_for(tree)
        ninja_log = tree / "build" / ".ninja_log"
        before = mark(ninja_log)
        tee.line(f"torchbuild develop: {tree} into {venv} ({mode}), jobs {plan.jobs} ({plan.reason})")
        subprocess.run(["ccache", "--zero-stats"], env=env, capture_output=True, check=False)
        if mode == "pip":
            cmd = [str(python), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-v", "-e", str(tree)]
        else:
            cmd = [str(python), "setup.py", "develop"]
        used = JobsUsed(plan.jobs, plan.jobs)
        run_compile(
            lambda n: cmd,
            cwd=str(tree),
            env_for=lambda n: {**env, "MAX_JOBS": str(n)},
            sink=tee,
            what=f"the {mode} development install",
            jobs=used,
            retry=req.oom_retry,
        )
        compiled = [
            o
            for step in (read_ninja_log(ninja_log, since=before) if ninja_log.is_file() else [])
            for o in step.outputs
            if o.endswith(".o")
        ]
        listed = subprocess.run(
            [str(python), "-m", "pip", "list", "--editable", "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
        )
        editable = [
            p for p in (json.loads(listed.stdout or "[]")) if Path(p.get("editable_project_location", "")) == tree
        ]
        if not editable:
            raise BuildFailed(
                f"{tree} is not installed in development mode in {venv} (pip list --editable does not show it)"
            )
        hits, misses, _ = hit_rate(ccache_stats(env))
        result = {
            "venv": str(venv),
            "project": f"{editable[0]['name']}=={editable[0]['version']}",
            "mode": mode,
            "compiled": compiled,
            "ccache": {"hits": hits, "misses": misses},
            "seconds": round(time.monotonic() - t0, 1),
        }
        tee.line(
            f"{result['project']} installed in development mode: {len(compiled)} object(s) compiled "
            f"({hits} ccache hits), {result['seconds']} s"
        )
        tee.line(f"venv: {venv}  (activate: source {venv}/bin/activate)")
        return result
    finally:
        tee.close()


def run_develop_step(payload: Mapping[str, Any]) -> int:
    develop(Request.from_dict(payload))
    return 0
