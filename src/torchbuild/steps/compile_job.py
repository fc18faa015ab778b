"""The pieces one compile job is made of, whichever step runs it (build, companions, develop,
sif, verify): its log (Tee), its interpreter, the environment that makes objects independent of
the tree's path, the toolchain's versions, ccache's counters, the pip wheel command (issue 28).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchbuild.core.errors import ToolMissing
from torchbuild.inputs.config import BuildSpec
from torchbuild.inputs.environment import compilers


def now_utc() -> str:
    """The time now in UTC, to the second (ISO 8601): when a compile job started or finished."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def first_line(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        return ""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env) if env else None, check=False)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0] if lines else ""


def toolchain_versions(spec: BuildSpec, env: Mapping[str, str]) -> dict[str, str]:
    cc, cxx = compilers(spec)
    versions = {
        "cc": first_line([cc, "--version"], env),
        "cxx": first_line([cxx, "--version"], env),
        "python": sys.version.split()[0],
        "cmake": first_line(["cmake", "--version"], env),
        "ninja": first_line(["ninja", "--version"], env),
        "ccache": first_line(["ccache", "--version"], env),
    }
    if spec.cuda:
        nvcc = env.get("CUDACXX", "nvcc")
        proc = (
            subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
            if shutil.which(nvcc)
            else None
        )
        lines = proc.stdout.strip().splitlines() if proc and proc.returncode == 0 else []
        # "Cuda compilation tools, release 12.4, V12.4.131"
        versions["nvcc"] = next((ln for ln in lines if "release" in ln), lines[-1] if lines else "not found")
    return versions


def ccache_stats(env: Mapping[str, str]) -> dict[str, int]:
    """ccache's counters (ccache >= 4.4 `--print-stats`), {} when unavailable."""
    proc = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, env=dict(env), check=False)
    stats: dict[str, int] = {}
    if proc.returncode == 0:
        for line in proc.stdout.splitlines():
            key, _, value = line.partition("\t")
            if value.strip().isdigit():
                stats[key] = int(value)
    return stats


def hit_rate(stats: Mapping[str, int]) -> tuple[int, int, float]:
    """(hits, misses, rate) of compilations ccache saw since its counters were zeroed."""
    hits = stats.get("direct_cache_hit", 0) + stats.get("preprocessed_cache_hit", 0)
    misses = stats.get("cache_miss", 0)
    total = hits + misses
    return hits, misses, (hits / total if total else 0.0)


_WHEEL_TOOLS = """
import importlib.util as u
missing = []
if u.find_spec("setuptools") is None:
    missing.append("setuptools")
elif u.find_spec("setuptools.command.bdist_wheel") is None and u.find_spec("wheel") is None:
    missing.append("wheel")  # setuptools < 70.1 needs the wheel package for bdist_wheel
print(" ".join(missing))
"""


def check_wheel_tools(source: str, python: str = sys.executable) -> None:
    """--no-build-isolation builds with the interpreter's packages: say what is missing up front."""
    if not (Path(source) / "setup.py").is_file():
        return
    # asked of the interpreter itself (another Python's packages are not this process's)
    proc = subprocess.run([python, "-c", _WHEEL_TOOLS], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolMissing(f"{python} does not run: {proc.stderr.strip()[-300:]}")
    missing = proc.stdout.split()
    if missing:
        raise ToolMissing(
            f"{python} lacks {', '.join(missing)}, which a setup.py build needs",
            hint=f"{python} -m pip install {' '.join(missing)} (with the rest of PyTorch's requirements.txt)",
        )


def path_independent(env_vars: Mapping[str, str], source: str) -> dict[str, str]:
    """What makes objects independent of where the tree is: ccache rewrites the tree's absolute
    paths into relative ones, for its hash and for the compiler (so __FILE__ and assert messages
    say `../aten/...`), and leaves the working directory out of the hash. A profile's own
    CCACHE_BASEDIR wins. No -ffile-prefix-map is added to CFLAGS/CXXFLAGS: PyTorch (and the
    fixture) record those flags in the library (torch.__config__.show()), so the tree's path
    would be in every wheel."""
    return {
        "CCACHE_BASEDIR": env_vars.get("CCACHE_BASEDIR") or os.path.abspath(source),
        "CCACHE_NOHASHDIR": env_vars.get("CCACHE_NOHASHDIR", "1"),
    }


def pip_wheel(partial: Path, source: str, python: str = sys.executable) -> list[str]:
    """The wheel build: with the interpreter's packages (torch's build requirements, or the torch
    a companion is built against), no dependencies, verbose for the log."""
    return [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", str(partial), "--", source]
