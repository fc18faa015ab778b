"""What a built shared library is, asked the way its users ask it: the net-plugin symbols NCCL
looks up (dlopen + dlsym), the dependencies `ldd` cannot resolve, and ncclGetVersion(). Used
by the comms step on what it built and by verify on what a wheel links."""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

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
