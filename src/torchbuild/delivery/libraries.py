"""What a built shared library is, asked the way its users ask it: the net-plugin symbols NCCL
looks up (dlopen + dlsym), the dependencies `ldd` cannot resolve, and ncclGetVersion(). Used
by the comms step on what it built, by verify on what a wheel links, and by install on what
its torch loads (ncclprobe.py's answer)."""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchbuild.core.errors import CommsFailed

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


def unresolved(library: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """The libraries `ldd` cannot find for library (empty: every dependency resolves)."""
    proc = subprocess.run(["ldd", str(library)], capture_output=True, text=True, env=env, check=False)
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
