"""What a built shared library is, asked the way its users ask it: the net-plugin symbols NCCL
looks up (dlopen + dlsym), the dependencies `ldd` cannot resolve, and ncclGetVersion(). Used
by the comms step on what it built, by verify on what a wheel links, and by install on what
its torch loads (ncclprobe.py's answer); and the closure of a library's site dependencies the
comms step copies beside the plugin (site_dependencies, copy_dependencies)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild.core.errors import CommsFailed
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.core.safeio import sha256_file

# the symbols NCCL looks up in a net plugin (one per interface version it speaks)
NET_VERSIONS = range(2, 12)


def plugin_symbols(library: Path) -> list[str]:
    """The ncclNetPlugin_v* symbols library exports (dlopen + dlsym, as NCCL does)."""
    lib = ctypes.CDLL(str(library), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    found = []
    for v in NET_VERSIONS:
        try:
            getattr(lib, f"ncclNetPlugin_v{v}")
        except AttributeError:
            continue
        found.append(f"ncclNetPlugin_v{v}")
    return found


def plugin_symbols_in(library: Path, env: Mapping[str, str]) -> list[str]:
    """plugin_symbols(library) asked in a process started with env (its LD_LIBRARY_PATH is what
    the loader searches: a running process's cannot change); CommsFailed when it does not load."""
    code = "import json, sys; from pathlib import Path; from torchbuild.runtime.libraries import plugin_symbols; "
    code += "print(json.dumps(plugin_symbols(Path(sys.argv[1]))))"
    proc = run_captured([sys.executable, "-c", code, str(library)], env=env, timeout=QUERY_TIMEOUT)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CommsFailed(f"{library.name} does not load: {why}")
    found: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def unresolved(library: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """The libraries `ldd` cannot find for library (empty: every dependency resolves)."""
    proc = run_captured(["ldd", str(library)], env=env, timeout=QUERY_TIMEOUT)
    if proc.returncode != 0:
        return [proc.stderr.strip() or f"ldd {library} failed"]
    return [ln.split("=>")[0].strip() for ln in proc.stdout.splitlines() if "not found" in ln]


def nccl_version_of(library: Path) -> int:
    """ncclGetVersion() of a libnccl.so (2.22.3 -> 22203); needs no GPU."""
    lib = ctypes.CDLL(str(library))
    code = ctypes.c_int(0)
    if lib.ncclGetVersion(ctypes.byref(code)) != 0:
        raise CommsFailed(f"ncclGetVersion failed in {library}")
    return code.value


def net_plugin_symbols() -> list[str]:
    """Every ncclNetPlugin_v* name NCCL may look up (the probe asks for each)."""
    return [f"ncclNetPlugin_v{v}" for v in NET_VERSIONS]


def loaded_problems(probe: Mapping[str, Any], nccl: Path | None, plugin: Path | None) -> list[str]:
    """What is wrong with what a process that imported torch loaded (ncclprobe.py's answer),
    against the NCCL and plugin it must load (None: not asked): no libnccl mapped, another
    libnccl mapped (compared by real path), no plugin opened, another plugin opened, or a plugin
    without any ncclNetPlugin_v* symbol. Empty: it loads those."""
    if probe.get("error"):
        return [str(probe["error"])]
    problems = []
    if nccl is not None:
        want = os.path.realpath(nccl)
        maps = [str(p) for p in probe.get("nccl") or []]
        if not maps:
            problems.append(f"torch loaded no libnccl at all (expected {want})")
        elif want not in {os.path.realpath(p) for p in maps}:
            problems.append(f"torch loaded {', '.join(maps)}, not {want}")
    if plugin is not None:
        got = probe.get("plugin") or {}
        want = os.path.realpath(plugin)
        if not got.get("path"):
            why = got.get("error") or "it did not load"
            problems.append(f"the net plugin NCCL would open ({got.get('name', '?')}) cannot be opened: {why}")
        elif os.path.realpath(str(got["path"])) != want:
            problems.append(f"NCCL would open the net plugin {got['path']}, not {want}")
        elif not got.get("symbols"):
            problems.append(f"the net plugin {got['path']} exports no ncclNetPlugin_v* symbol")
    return problems


# never copied beside a plugin, wherever they live: the C library and its loader (a copy of a
# different glibc breaks every program), the compiler's runtimes, the CUDA driver (it must match
# the node's kernel module) and runtime (it must match the CUDA torch was built with)
KEEP_OUT = re.compile(
    r"^(ld-linux.*|linux-vdso.*|linux-gate.*|lib(c|m|mvec|dl|rt|pthread|util|resolv|anl|nsl|BrokenLocale)\.so.*"
    r"|libstdc\+\+\.so.*|libgcc_s\.so.*|libcuda\.so.*|libcudart\.so.*|libnvidia-.*)$"
)
# the loader's own default directories where `ld.so --list-diagnostics` (glibc 2.33+) is missing
FALLBACK_SYSTEM_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A library the loader resolves for another: the name it was asked for, and where it found it."""

    name: str
    path: Path


def _ldd(library: Path, env: Mapping[str, str] | None) -> tuple[list[Resolved], list[str]]:
    """(what the loader resolves for library, the names it finds nowhere), as `ldd` reports them
    in that environment: the vDSO and the loader itself aside. CommsFailed when ldd fails."""
    proc = run_captured(["ldd", str(library)], env=env, timeout=QUERY_TIMEOUT)
    if proc.returncode != 0:
        raise CommsFailed(f"ldd {library} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    found, missing = [], []
    for line in proc.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if not arrow:
            continue  # linux-vdso.so.1 (0x...), /lib64/ld-linux-x86-64.so.2 (0x...)
        if rest.startswith("not found"):
            missing.append(name)
        else:
            found.append(Resolved(name, Path(rest.rsplit(" (", 1)[0])))
    return found, missing


def resolved(library: Path, env: Mapping[str, str] | None = None) -> list[Resolved]:
    """Every library the loader maps for library (its whole closure, as `ldd` reports it, in
    that environment). CommsFailed when ldd fails or a dependency does not resolve."""
    found, missing = _ldd(library, env)
    if missing:
        raise CommsFailed(f"{library.name} cannot load: ldd finds no {', '.join(missing)}")
    return found


def unresolvable(library: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """The names of library's closure the loader finds nowhere in that environment."""
    return _ldd(library, env)[1]


def host_dependencies(library: Path, root: Path, env: Mapping[str, str] | None = None) -> list[Resolved]:
    """The libraries of library's closure that live outside root, in any directory of this host,
    KEEP_OUT's aside: what a site library (libfabric under its prefix) takes from the host's own
    directories (Cray's libcxi, libjson-c in /usr/lib64) and a container may not have. What
    the host does not resolve is left to the container (the step names it if it lacks it too)."""
    top = os.path.realpath(root).rstrip("/") + "/"
    return [
        dep
        for dep in _ldd(library, env)[0]
        if not (KEEP_OUT.match(dep.name) or KEEP_OUT.match(dep.path.name))
        and not os.path.realpath(dep.path).startswith(top)
        and not str(dep.path).startswith(top)
    ]


def system_dirs(env: Mapping[str, str] | None = None) -> set[str]:
    """The standard library directories of the environment this runs in (real paths): the
    loader's default search path (`ld.so --list-diagnostics`) and the directories in its cache
    (`ldconfig -p`, what /etc/ld.so.conf names)."""
    dirs: set[str] = set()
    proc = _quiet(["ld.so", "--list-diagnostics"], env)
    dirs.update(re.findall(r'^path\.system_dirs\[0x[0-9a-f]+\]="([^"]+)"', proc, re.M) or FALLBACK_SYSTEM_DIRS)
    ldconfig = shutil.which("ldconfig", path=f"{(env or os.environ).get('PATH', '')}:/sbin:/usr/sbin")
    if ldconfig:
        dirs.update(os.path.dirname(p) for p in re.findall(r" => (/\S+)$", _quiet([ldconfig, "-p"], env), re.M))
    return {os.path.realpath(d) for d in dirs}


def _quiet(cmd: Sequence[str], env: Mapping[str, str] | None) -> str:
    try:
        return run_captured(cmd, env=env, timeout=QUERY_TIMEOUT).stdout
    except OSError:
        return ""


def site_dependencies(library: Path, site: Iterable[Path], env: Mapping[str, str] | None = None) -> list[Resolved]:
    """The libraries of library's closure a copy of it must carry to load elsewhere: those
    under a site directory (libfabric_prefix) or outside the environment's system directories,
    never KEEP_OUT's. CommsFailed when a dependency does not resolve."""
    system = system_dirs(env)
    roots = [os.path.realpath(s) for s in site]
    keep = []
    for dep in resolved(library, env):
        if KEEP_OUT.match(dep.name) or KEEP_OUT.match(dep.path.name):
            continue
        paths = {str(dep.path), os.path.realpath(dep.path)}
        under_site = any(p == r or p.startswith(r.rstrip("/") + "/") for p in paths for r in roots)
        if under_site or not any(os.path.dirname(p) in system for p in paths):
            keep.append(dep)
    return keep


def copy_dependencies(deps: Sequence[Resolved], dest: Path) -> list[dict[str, Any]]:
    """deps copied into dest: each real file under its own name, and its soname (the name it
    was asked for) a symlink to it where they differ. What was copied, for the manifest;
    nothing to copy makes no dest."""
    if not deps:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for dep in deps:
        real = Path(os.path.realpath(dep.path))
        target = dest / real.name
        if not target.exists():
            shutil.copy2(real, target)
        name = Path(dep.name).name
        if name != real.name and not (dest / name).is_symlink():
            (dest / name).symlink_to(real.name)
        copied.append(
            {"name": name, "from": str(dep.path), "sha256": sha256_file(target), "size": target.stat().st_size}
        )
    return copied
