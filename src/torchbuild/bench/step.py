"""`invoke bench`: torchbench (pytorch/benchmark) installed against the built torch, then run.

torchbench's install step calls pip many times (its requirements, each model's own), and any of
those calls may ask for a torch: pip would fetch an official wheel over the built one. Every pip
call it makes runs with PIP_CONSTRAINT naming a constraints file that pins torch (and the
companions present) to exactly what the venv has (pipenv.keep_built: it also replaces a site
pip configuration's constraint, whose lines on other packages it carries on), so a request for
another torch, from an index or a site's find-links, fails instead of replacing it; after the install, the venv's torch must still be the same file with the same
version, or the install is a BenchFailed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from torchbuild.core.errors import BenchFailed, PathError, SourceError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured, run_streamed
from torchbuild.runtime import pipenv

PINNED = ("torch", "torchvision", "torchaudio", "torchtext")
DEFAULT_REPO = "https://github.com/pytorch/benchmark.git"

_PROBE = """
import importlib.metadata as md, json
found = {}
for name in NAMES:
    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    found[name] = {"version": d.version, "location": str(d.locate_file(""))}
print(json.dumps(found))
"""


def pinned_packages(python: Path, env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """{name: {version, location}} of torch and the companions installed for python."""
    proc = run_captured(
        [str(python), "-c", _PROBE.replace("NAMES", repr(PINNED))], env=env or None, timeout=QUERY_TIMEOUT
    )
    if proc.returncode != 0:
        raise BenchFailed(f"{python} cannot list its packages: {(proc.stderr or proc.stdout).strip()[-500:]}")
    found: dict[str, dict[str, str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def constraints_text(found: Mapping[str, Mapping[str, str]]) -> str:
    """Each package found pinned to exactly its version (pipenv.pin: no other local label)."""
    return pipenv.constraints_text({name: info["version"] for name, info in found.items()})


VENV_HINT = "give the prefix `invoke install` made, or the venv `invoke develop` printed"


def check_venv(venv: Path) -> Path:
    """venv's bin/python; PathError when venv does not exist, is a file, or is no venv. A venv
    made in the image or the SIF has a bin/python that points at the container's interpreter (a
    dangling link here): its pyvenv.cfg, or the link itself, is enough."""
    with named_os_errors(venv, "--venv"):
        if not venv.exists():
            raise PathError(f"--venv {venv} does not exist", hint=VENV_HINT)
        if not venv.is_dir():
            raise PathError(f"--venv {venv} is a file, not a venv directory", hint=VENV_HINT)
        python = venv / "bin" / "python"
        if not (venv / "pyvenv.cfg").is_file() and not os.path.lexists(python):
            raise PathError(f"--venv {venv} is not a venv (no pyvenv.cfg, no bin/python)", hint=VENV_HINT)
    return python


@dataclasses.dataclass(frozen=True)
class Request:
    """The bench step's request (bench/task.py writes it; records.from_dict reads it)."""

    venv: str
    benchmark: str  # the torchbench tree as the step sees it
    install: bool = True
    install_args: tuple[str, ...] = ()  # to its install.py (model names)
    script: str = "run.py"
    args: tuple[str, ...] = ()  # to the script; empty: no run
    log: str = ""


def _run(cmd: Sequence[str], cwd: Path, env: Mapping[str, str], log: TextIO, out: TextIO) -> int:
    print(f"$ {shlex.join(cmd)}", file=out, flush=True)
    log.write(f"$ {shlex.join(cmd)}\n")

    def line(text: str) -> None:
        out.write(text)
        log.write(text)

    return run_streamed(cmd, on_line=line, cwd=str(cwd), env=env).returncode


def bench(req: Request, out: TextIO = sys.stdout) -> dict[str, Any]:
    venv, tree = Path(req.venv), Path(req.benchmark)
    python = venv / "bin" / "python"
    if not python.exists():
        raise BenchFailed(f"{venv} is not a venv (no bin/python)", hint=VENV_HINT)
    if not (tree / req.script).is_file() and req.args:
        raise SourceError(f"{tree} has no {req.script}: is it a torchbench checkout?")
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONHOME", None)
    before = pinned_packages(python, env)
    if "torch" not in before:
        raise BenchFailed(f"{venv} has no torch installed", hint="install the built wheel first: invoke install")
    result: dict[str, Any] = {"venv": str(venv), "torch": before["torch"], "pinned": constraints_text(before).split()}
    constraints = venv / "torchbuild-constraints.txt"
    log_path = Path(req.log) if req.log else venv / f"torchbuild-bench-{time.strftime('%Y%m%d-%H%M%S')}.log"
    # the site's own constraint lines on other packages are carried on (pipenv.keep_built)
    env.update(pipenv.keep_built(constraints, {n: i["version"] for n, i in before.items()}, str(python), env))
    with named_os_errors(venv, "writing the bench log"):
        log = log_path.open("a", buffering=1)
    try:
        if req.install:
            t0 = time.monotonic()
            if (tree / "requirements.txt").is_file():
                cmd = [str(python), "-m", "pip", "install", "-c", str(constraints), "-r", "requirements.txt"]
                if _run(cmd, tree, env, log, out) != 0:
                    raise BenchFailed(f"installing {tree}/requirements.txt failed (log: {log_path})")
            installer = [str(python), "install.py", *req.install_args]
            if (tree / "install.py").is_file() and _run(installer, tree, env, log, out) != 0:
                raise BenchFailed(f"torchbench's install.py failed (log: {log_path})")
            _check_kept(python, env, before)
            result["install_s"] = round(time.monotonic() - t0, 1)
            print(f"torchbench installed in {venv} against torch {before['torch']['version']} (kept)", file=out)
        if req.args:
            result["run_s"] = _run_script(req, python, tree, env, log, out, log_path=log_path)
    finally:
        log.close()
    result["log"] = str(log_path)
    return result


def _check_kept(python: Path, env: Mapping[str, str], before: Mapping[str, Mapping[str, str]]) -> None:
    """BenchFailed when the install replaced a package pinned before it (the built torch among them)."""
    after = pinned_packages(python, env)
    changed = [n for n in before if after.get(n) != before[n]]
    if changed:
        raise BenchFailed(
            f"the install replaced {', '.join(f'{n} {before[n]} -> {after.get(n)}' for n in changed)}",
            hint="reinstall the built wheel (invoke install); a model that needs another torch cannot run here",
        )


def _run_script(
    req: Request, python: Path, tree: Path, env: Mapping[str, str], log: TextIO, out: TextIO, *, log_path: Path
) -> float:
    """Run the script with req.args in tree; its seconds. BenchFailed when it exits non-zero."""
    t0 = time.monotonic()
    code = _run([str(python), req.script, *req.args], tree, env, log, out)
    seconds = round(time.monotonic() - t0, 1)
    if code != 0:
        raise BenchFailed(f"{req.script} {shlex.join(req.args)} exited {code} (log: {log_path})")
    return seconds


def run_bench_step(req: Request) -> int:
    bench(req)
    return 0
