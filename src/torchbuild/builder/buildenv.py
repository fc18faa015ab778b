"""The native build's own environment: a venv from PyPI, the answer to the sites' conda.

A login node with only `module load` has a compiler and a Python, not cmake, ninja, PyTorch's
build requirements or MKL. Natively (profile key build_venv, on by default) the build step makes
a venv under <cache_dir>/buildenv with

- cmake and ninja from their PyPI wheels (pinned: CMAKE, NINJA; a tree asking for another
  version of either gets its own requirement instead),
- the tree's own build requirements: requirements.txt (and the files it includes with -r)
  and pyproject.toml's [build-system].requires, read bounded and parsed with packaging,
- setuptools and wheel (`pip wheel --no-build-isolation` builds with the venv's packages),
- with blas mkl on x86_64, MKL's static libraries and headers (mkl-static, mkl-include: what
  PyTorch's README installs for a Linux build),

and runs the build with that venv's python, its bin/ first on PATH, the venv on
CMAKE_PREFIX_PATH (PyTorch's FindMKL looks there, and INTEL_MKL_DIR names it too).

The venv is keyed by what decides its contents (the interpreter and its version, the
requirement files' sha256, the pins, arch, blas) and reused while they stay the same. It is
made in a fresh directory <key>.<random> and published by renaming a symlink <key> onto it:
a venv cannot be moved (its scripts name their interpreter by absolute path), a symlink can
be replaced atomically. A failed or interrupted creation leaves no <key>, so it is never
reused; concurrent builds wait on <key>.lock and the second reuses what the first made.
pip runs with the environment as it is: a site's pip configuration (PIP_* variables, its
config file's find-links, constraints and indexes) applies, as to any pip the user runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from torchbuild.core.atomic import umask
from torchbuild.core.errors import BuildFailed, SourceError, ToolMissing, TorchbuildError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured, run_streamed
from torchbuild.core.progress import Tee
from torchbuild.core.safeio import read_text
from torchbuild.profile.config import BuildSpec

# PyTorch's README: `pip install cmake ninja` (conda's there) and `pip install mkl-static
# mkl-include` on Linux. cmake 3.31: 4.x drops compatibility with the cmake_minimum_required
# (< 3.5) of some of PyTorch's third_party; MKL 2024.2.0: what PyTorch's own wheel builds install.
CMAKE = "cmake==3.31.6"
NINJA = "ninja==1.11.1.4"
MKL = ("mkl-static==2024.2.0", "mkl-include==2024.2.0")
WHEEL_TOOLS = ("setuptools", "wheel")
REQUIREMENT_FILES = ("requirements.txt", "pyproject.toml")
REQUIREMENTS_LIMIT = 256 * 1024  # a requirements file or pyproject.toml is a few KiB
MARKER = "torchbuild-buildenv.json"  # written last, in a venv that finished
_INCLUDE = re.compile(r"^(?:-r|--requirement)[ =]?\s*(\S+)$")


@dataclasses.dataclass(frozen=True)
class BuildVenv:
    """A build venv ready to use: where it is, its key, and how it came to be."""

    path: Path  # the published name <cache>/buildenv/<key> (a symlink to the venv)
    key: str
    created: bool  # made by this build (False: reused)
    seconds: float  # what making (or finding) it took
    versions: Mapping[str, str]  # cmake, ninja (and mkl-static) as installed

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def env(self, base: Mapping[str, str], blas_mkl: bool) -> dict[str, str]:
        """What the build sets to use it: its bin/ first on PATH, VIRTUAL_ENV, the venv first
        on CMAKE_PREFIX_PATH (and INTEL_MKL_DIR with blas mkl, unless base sets one)."""
        venv = str(self.path)
        env = {
            "VIRTUAL_ENV": venv,
            "PATH": os.pathsep.join(p for p in (f"{venv}/bin", base.get("PATH", "")) if p),
            "CMAKE_PREFIX_PATH": os.pathsep.join(p for p in (venv, base.get("CMAKE_PREFIX_PATH", "")) if p),
        }
        if blas_mkl and "INTEL_MKL_DIR" not in base:
            env["INTEL_MKL_DIR"] = venv
        return env

    def record(self) -> dict[str, Any]:
        """What the manifest records (BuildVenvRecord)."""
        return {"key": self.key, "created": self.created, "seconds": round(self.seconds, 1), **self.versions}


def wants_mkl(spec: BuildSpec) -> bool:
    return spec.blas == "mkl" and spec.arch.value == "x86_64"


# --------------------------------------------------------------------------- what goes in


def tree_requirements(source: str) -> tuple[list[str], dict[str, str]]:
    """The tree's build requirements (requirements.txt with its -r includes, then pyproject.toml's
    [build-system].requires), and {file: sha256} of the files read. SourceError on a line that
    is no requirement."""
    root = Path(source)
    reqs: list[str] = []
    digests: dict[str, str] = {}
    if (root / "requirements.txt").is_file():
        reqs += _requirements_txt(root, "requirements.txt", digests, depth=0)
    if (root / "pyproject.toml").is_file():
        reqs += _build_system_requires(root, digests)
    return reqs, digests


def _read(root: Path, name: str, digests: dict[str, str]) -> str:
    text = read_text(root / name, REQUIREMENTS_LIMIT, f"the tree's {name}", SourceError)
    digests[name] = hashlib.sha256(text.encode()).hexdigest()
    return text


def _requirements_txt(root: Path, name: str, digests: dict[str, str], depth: int) -> list[str]:
    reqs: list[str] = []
    for n, raw in enumerate(_read(root, name, digests).splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        include = _INCLUDE.match(line)
        if include:
            inner = os.path.normpath(os.path.join(os.path.dirname(name), include.group(1)))
            if depth >= 3 or inner.startswith(("..", "/")) or not (root / inner).is_file():
                raise SourceError(f"{root / name}:{n}: {line}: not a requirements file inside the tree")
            reqs += _requirements_txt(root, inner, digests, depth + 1)
        elif not line.startswith("-"):  # pip's options (-c, --index-url...) are the site's to give
            reqs.append(_checked(line, f"{root / name}:{n}"))
    return reqs


def _build_system_requires(root: Path, digests: dict[str, str]) -> list[str]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # tomli, the same parser before it joined the standard library (a dependency there)
        import tomli as tomllib
    text = _read(root, "pyproject.toml", digests)
    try:
        requires = tomllib.loads(text).get("build-system", {}).get("requires", [])
    except tomllib.TOMLDecodeError as exc:
        raise SourceError(f"{root / 'pyproject.toml'}: not TOML ({exc})") from None
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise SourceError(f"{root / 'pyproject.toml'}: [build-system].requires is not a list of strings")
    return [_checked(r, f"{root / 'pyproject.toml'} [build-system].requires") for r in requires]


def _checked(line: str, where: str) -> str:
    try:
        Requirement(line)
    except InvalidRequirement as exc:
        raise SourceError(
            f"{where}: {line!r} is not a requirement ({exc})", hint="fix the line, or set build_venv: false"
        ) from None
    return line


def pinned(spec: BuildSpec, tree: Sequence[str]) -> list[str]:
    """What the venv gets: cmake and ninja at torchbuild's pins unless the tree asks for a version
    the pin is not (then the tree's requirement), the wheel tools, MKL where wanted, the tree's."""
    asked = {canonicalize_name(Requirement(r).name): Requirement(r) for r in tree}
    out: list[str] = []
    for pin in (CMAKE, NINJA):
        name, _, version = pin.partition("==")
        req = asked.get(canonicalize_name(name))
        if req is None or not req.specifier or req.specifier.contains(version, prereleases=True):
            out.append(pin)
    out += [*WHEEL_TOOLS, *(MKL if wants_mkl(spec) else ()), *tree]
    return out


def venv_key(spec: BuildSpec, python: str, version: str, digests: Mapping[str, str]) -> str:
    """What decides the venv's contents, hashed: the interpreter (its path and full version),
    the requirement files' sha256, torchbuild's pins, arch and blas."""
    data = {
        "python": os.path.realpath(python),
        "version": version,
        "files": dict(sorted(digests.items())),
        "pins": [CMAKE, NINJA, *WHEEL_TOOLS, *(MKL if wants_mkl(spec) else ())],
        "arch": spec.arch.value,
        "blas": spec.blas,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- making it


def ensure(spec: BuildSpec, source: str, cache_root: str, python: str, log: Tee) -> BuildVenv:
    """The build venv for this tree and interpreter: reused when one with its key is there,
    else made (under a lock) and published. log: where pip's output goes (a Tee)."""
    t0 = time.monotonic()
    tree, digests = tree_requirements(source)
    version = _python_version(python)
    key = venv_key(spec, python, version, digests)
    root = Path(cache_root) / "buildenv"
    with named_os_errors(root, "creating the build venv's directory"):
        root.mkdir(parents=True, exist_ok=True)
    published = root / key
    with _locked(root / f"{key}.lock"):
        if not (published / MARKER).is_file():
            _clear_stale(root, key)
            _create(root, key, python, pinned(spec, tree), log, Path(cache_root) / "pip")
            created = True
        else:
            created = False
    versions = json.loads((published / MARKER).read_text())["versions"]
    return BuildVenv(published, key, created, time.monotonic() - t0, versions)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Held while one build makes the venv (filelock: flock(2) on path, waiting as long as it
    takes). The lock file's mode is what open() would give it, not filelock's older fixed 0644:
    another user of a group's shared cache opens it too."""
    with named_os_errors(path, "locking the build venv"), FileLock(path, mode=0o666 & ~umask()):
        yield


def _python_version(python: str) -> str:
    proc = run_captured([python, "-c", "import sys; print(sys.version)"], timeout=QUERY_TIMEOUT)
    if proc.returncode != 0:
        raise ToolMissing(f"{python} does not run: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip()


def _clear_stale(root: Path, key: str) -> None:
    """What an interrupted creation left: <key>.<random> directories and a dangling <key>."""
    for p in root.glob(f"{key}.*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
    if (root / key).is_symlink():
        (root / key).unlink()


def _create(root: Path, key: str, python: str, reqs: Sequence[str], log: Tee, pip_cache: Path) -> None:
    """python -m venv in <key>.<random>, pip install reqs there (pip_cache: PIP_CACHE_DIR), the
    marker, then <key> -> it."""
    made = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root))
    try:
        made.chmod(0o777 & ~umask())  # mkdtemp's 0700 would hide it from a group sharing the cache
        _run([python, "-m", "venv", str(made)], log, f"{python} -m venv", _NO_VENV, pip_cache, ToolMissing)
        vpy = str(made / "bin" / "python")
        cmd = [vpy, "-m", "pip", "install", "--no-input", "--", *reqs]  # the tree's lines after --
        _run(
            cmd,
            log,
            "pip installing cmake, ninja and the tree's requirements into the build venv",
            _PIP_FAILED,
            pip_cache,
        )
        versions = _installed(vpy)
        (made / MARKER).write_text(json.dumps({"key": key, "requirements": list(reqs), "versions": versions}) + "\n")
        link = root / f"{key}.link"
        link.unlink(missing_ok=True)
        link.symlink_to(made.name)
        os.replace(link, root / key)
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise


_NO_VENV = (
    "install the python3-venv package (Debian/Ubuntu) or load a Python module with venv, or set build_venv: false"
)
_PIP_FAILED = (
    "pip could not install it (offline? a site index or find-links without these?): "
    "point pip at an index that has them (PIP_INDEX_URL, PIP_FIND_LINKS), or set build_venv: false "
    "and provide cmake, ninja and the tree's requirements yourself"
)


def _run(
    cmd: Sequence[str], log: Tee, what: str, hint: str, cache: Path, error: type[TorchbuildError] = BuildFailed
) -> None:
    """cmd with its output in the build log only (the console gets one line at the end); a
    failure is error with the command's last lines and what to do."""
    tail: deque[str] = deque(maxlen=8)

    def keep(line: str) -> None:
        log.file.write(line)
        tail.append(line.rstrip())

    # pip's downloads in the build's pip cache (as the build's own pip: PIP_CACHE_DIR), so a
    # venv for new inputs reuses the wheels an earlier one fetched
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_CACHE_DIR"] = str(cache)
    try:
        done = run_streamed(cmd, on_line=keep, env=env)
    except OSError as exc:
        raise ToolMissing(f"{what}: {cmd[0]} does not run ({exc.strerror})", hint=hint) from None
    if done.returncode != 0:
        last = " | ".join(t for t in tail if t)[-600:]
        raise error(f"{what} failed (exit {done.returncode}): {last}; log: {log.path}", hint=hint)


def _installed(python: str) -> dict[str, str]:
    """The versions the venv got of what the manifest records."""
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for n in ('cmake', 'ninja', 'mkl-static'):\n"
        "    try: out[n.replace('-static', '')] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    proc = run_captured([python, "-c", code], timeout=QUERY_TIMEOUT)
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {}
