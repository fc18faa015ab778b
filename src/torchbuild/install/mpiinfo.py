"""Which MPI library a process really loaded, and what it says it is.

Run by file path in the interpreter under test (it imports nothing from torchbuild):
`python mpiinfo.py [MODULE ...]` imports each MODULE that is there (mpi4py.MPI, torch), so
the MPI they link is the one the dynamic loader picks; when none brought an MPI in, it opens
libmpi by its soname (MPICH ABI first, then Open MPI's). It then reads /proc/self/maps for the
file that was mapped and calls MPI_Get_library_version there (allowed before MPI_Init). One
JSON line: {"library": path, "version": text, "via": module or soname, "ld_library_path": ...};
exit 3 when no MPI library can be loaded.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import re
import sys

# libmpi.so.12 (MPICH ABI: MPICH, cray-mpich's libmpi_cray, Intel MPI, MVAPICH), libmpi.so.40 (Open MPI)
SONAMES = ("libmpi.so.12", "libmpi_cray.so.12", "libmpi.so.40", "libmpi.so")
MPI_LIBRARY = re.compile(r"lib(mpi|mpich|mpi_cray|mpi_gnu_\d+|mpi_intel)\.so(\.\d+)*$")
MAX_VERSION = 8192  # MPICH's MPI_MAX_LIBRARY_VERSION_STRING (Open MPI's is 256)


def mapped_mpi() -> str | None:
    """The path of the MPI library mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and MPI_LIBRARY.search(os.path.basename(parts[-1])):
                    return parts[-1]
    except OSError:
        return None
    return None


def main(argv: list[str]) -> int:
    via = _load_mpi(argv)
    path = mapped_mpi()
    if path is None:
        print(
            json.dumps(
                {"error": "no MPI library could be loaded", "ld_library_path": os.environ.get("LD_LIBRARY_PATH", "")}
            )
        )
        return 3
    version = _library_version(path)
    print(
        json.dumps(
            {
                "library": os.path.realpath(path),
                "mapped": path,
                "version": version,
                "via": via,
                "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
            }
        )
    )
    return 0


def _load_mpi(modules: list[str]) -> str:
    """Import the modules until one maps an MPI library, else open libmpi by soname; what brought it in ("" for
    nothing)."""
    via = ""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:
            continue
        if mapped_mpi():
            via = module
            break
    if not mapped_mpi():
        for soname in SONAMES:
            try:
                ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            via = soname
            break
    return via


def _library_version(path: str) -> str:
    """What MPI_Get_library_version of the library at path says (or the code it returned)."""
    lib = ctypes.CDLL(path)
    buf = ctypes.create_string_buffer(MAX_VERSION)
    length = ctypes.c_int(0)
    rc = lib.MPI_Get_library_version(buf, ctypes.byref(length))
    return buf.value.decode(errors="replace").strip() if rc == 0 else f"MPI_Get_library_version returned {rc}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
