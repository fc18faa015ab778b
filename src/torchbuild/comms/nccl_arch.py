"""Which NCCL releases can compile for which GPU architectures, and the nvcc -gencode flags
for a cuda_arch_list (no imports from the rest of torchbuild: config uses it)."""

from __future__ import annotations

import re

# compute capability -> (first NCCL release whose makefiles target it, the CUDA it needs),
# from NCCL's makefiles/common.mk and release notes: sm_90 came with 2.15.1 (H100), sm_100
# and sm_120 with 2.25.1 (Blackwell, CUDA 12.8), sm_110 with 2.27.5 (CUDA 13.0).
FIRST_NCCL = {
    (9, 0): ((2, 15, 1), (11, 8)),
    (10, 0): ((2, 25, 1), (12, 8)),
    (11, 0): ((2, 27, 5), (13, 0)),
    (12, 0): ((2, 25, 1), (12, 8)),
}
# sm_35 and sm_50 were removed in 2.28.3 ("long been deprecated")
LAST_NCCL = {(3, 5): (2, 28, 2), (3, 7): (2, 28, 2), (5, 0): (2, 28, 2), (5, 2): (2, 28, 2)}

_ARCH = re.compile(r"(\d+)\.(\d+)([a-z]?)(\+PTX)?")


def _parse_arch(entry: str) -> tuple[int, int, str, bool]:
    m = _ARCH.fullmatch(entry)
    if not m:
        raise ValueError(f"not a CUDA architecture: {entry!r}")
    return int(m[1]), int(m[2]), m[3], bool(m[4])


def nccl_release(version: str) -> tuple[int, int, int]:
    """2.21.5-1 -> (2, 21, 5)."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"not an NCCL version: {version!r}")
    return int(m[1]), int(m[2]), int(m[3])


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def nccl_cannot_target(version: str, arch_list: tuple[str, ...] | list[str]) -> str:
    """Why NCCL `version` cannot be compiled for an arch of arch_list ("" when it can)."""
    release = nccl_release(version)
    for entry in arch_list:
        major, minor, _, _ = _parse_arch(entry)
        first = FIRST_NCCL.get((major, minor))
        if first and release < first[0]:
            return (
                f"NCCL {version} cannot target {entry} (sm_{major}{minor}): NCCL supports it from "
                f"{_dotted(first[0])} (with CUDA {_dotted(first[1])})"
            )
        if not first and (major, minor) > max(FIRST_NCCL):
            return f"{entry} (sm_{major}{minor}) is newer than any NCCL release torchbuild knows"
        last = LAST_NCCL.get((major, minor))
        if last and release > last:
            return f"NCCL {version} no longer targets {entry} (sm_{major}{minor}): the last release that does is {_dotted(last)}"
    return ""


def gencode(arch_list: tuple[str, ...] | list[str]) -> str:
    """NVCC_GENCODE for NCCL's make: SASS for each arch, PTX as well for +PTX entries
    ("9.0" -> -gencode=arch=compute_90,code=sm_90)."""
    flags = []
    for entry in arch_list:
        major, minor, suffix, ptx = _parse_arch(entry)
        cc = f"{major}{minor}{suffix}"
        flags.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{cc},code=compute_{cc}")
    return " ".join(flags)
