"""Which GPU architectures each CUDA toolkit compiles for (no imports from the rest of
torchbuild: config checks cuda_arch_list against it before any image is built).

The table is what NVIDIA's own compilers say, read 2026-11-28 from ptxas --help (the values its
--gpu-name takes, sm_XX) of every toolkit from 11.8 to 13.5 as NVIDIA publishes them on PyPI
(nvidia-cuda-nvcc-cu11 11.8.89, nvidia-cuda-nvcc-cu12 12.0.140 ... 12.9.86, nvidia-cuda-nvcc
13.0.88 ... 13.5.37); `nvcc --list-gpu-code` of the 13.x ones gives the same list. It agrees with
NVIDIA's release notes and guides:
- 12.0 dropped Kepler (sm_35, sm_37) and added sm_90a.
- 12.8 added Blackwell: sm_100 (B200, GB200), sm_101 (Thor) and sm_120 (RTX 50, RTX PRO),
  each with an a variant (Blackwell Compatibility Guide, "Building Applications Using CUDA
  Toolkit 12.8").
- 12.9 added sm_103 (B300, GB300) and sm_121 (DGX Spark), and the family-specific f variants
  ("NVIDIA Blackwell and NVIDIA CUDA 12.9 introduce family-specific architecture features").
- 13.0 removed offline compilation for Maxwell, Pascal and Volta (sm_50 to sm_72; release notes,
  "Deprecated Architectures") and renamed Thor sm_101 to sm_110; it lists sm_88 too.
- 13.4 added sm_107.
A newer CUDA than the table takes the newest row (as a new minor release has so far only added
targets); one older than 11.8 is not checked. The sets say what nvcc can compile: PyTorch's own
rules for TORCH_CUDA_ARCH_LIST are torch_lines'.
"""

from __future__ import annotations

import re

_KEPLER = "3.5 3.7"
_MAXWELL_TO_HOPPER = "5.0 5.2 5.3 6.0 6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0"
_CUDA12 = f"{_MAXWELL_TO_HOPPER} 9.0a"
_BLACKWELL_128 = "10.0 10.0a 10.1 10.1a 12.0 12.0a"
_BLACKWELL_129 = " ".join(f"{cc}{s}" for cc in ("10.0", "10.1", "10.3", "12.0", "12.1") for s in ("", "a", "f"))
_CUDA13 = "7.5 8.0 8.6 8.7 8.8 8.9 9.0 9.0a " + " ".join(
    f"{cc}{s}" for cc in ("10.0", "10.3", "11.0", "12.0", "12.1") for s in ("", "a", "f")
)
_SM107 = "10.7 10.7a 10.7f"

_ROWS = {
    "11.8": f"{_KEPLER} {_MAXWELL_TO_HOPPER}",
    **{f"12.{minor}": _CUDA12 for minor in range(7)},
    "12.8": f"{_CUDA12} {_BLACKWELL_128}",
    "12.9": f"{_CUDA12} {_BLACKWELL_129}",
    **{f"13.{minor}": _CUDA13 for minor in range(4)},
    "13.4": f"{_CUDA13} {_SM107}",
    "13.5": f"{_CUDA13} {_SM107}",
}
# CUDA "X.Y" -> the architectures its nvcc compiles SASS (and PTX) for, "9.0", "10.0a", "12.0f"
TARGETS: dict[str, frozenset[str]] = {cuda: frozenset(row.split()) for cuda, row in _ROWS.items()}

# GPUs by compute capability, for messages (NVIDIA's CUDA GPUs list)
GPUS = {
    "8.0": "A100",
    "9.0": "H100, H200, GH200",
    "10.0": "B200, GB200",
    "10.3": "B300, GB300",
    "11.0": "Thor",
    "12.0": "RTX 50, RTX PRO 6000",
    "12.1": "DGX Spark (GB10)",
}

_ENTRY = re.compile(r"(\d+)\.(\d+)([a-z]?)(\+PTX)?")


def _version(text: str) -> tuple[int, int]:
    major, minor = (int(p) for p in text.split(".")[:2])
    return major, minor


def row_of(cuda_version: str) -> str | None:
    """The table's row for cuda_version: its own, else the nearest older one of the same major,
    else (newer than the table) the newest; None for a CUDA older than the table."""
    wanted = _version(cuda_version)
    known = sorted(TARGETS, key=_version)
    if wanted < _version(known[0]):
        return None
    if wanted > _version(known[-1]):
        return known[-1]
    older = [k for k in known if _version(k) <= wanted and _version(k)[0] == wanted[0]]
    return older[-1] if older else None


def target(entry: str) -> str:
    """The architecture nvcc compiles for a cuda_arch_list entry: "9.0+PTX" -> "9.0"."""
    m = _ENTRY.fullmatch(entry)
    if not m:
        raise ValueError(f"not a CUDA architecture: {entry!r}")
    return f"{int(m[1])}.{int(m[2])}{m[3]}"


def sm_name(arch: str) -> str:
    """The SASS name of an architecture: 10.0a -> sm_100a."""
    major, rest = arch.split(".", 1)
    return f"sm_{major}{rest}"


def _toolkits(arch: str) -> list[str]:
    return sorted((cuda for cuda, archs in TARGETS.items() if arch in archs), key=_version)


def cannot_compile(cuda_version: str, arch_list: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """(problem, hint) for the first entry of arch_list that CUDA cuda_version cannot compile
    for; None when it compiles them all (or the CUDA is older than the table)."""
    row = row_of(cuda_version)
    if row is None:
        return None
    for entry in arch_list:
        arch = target(entry)
        if arch in TARGETS[row]:
            continue
        return _why_not(cuda_version, entry, arch)
    return None


def _why_not(cuda_version: str, entry: str, arch: str) -> tuple[str, str]:
    base = arch.rstrip("abcdefghijklmnopqrstuvwxyz")
    gpu = f", {GPUS[base]}" if base in GPUS else ""
    what = f"CUDA {cuda_version} cannot compile for {entry} ({sm_name(arch)}{gpu})"
    able = _toolkits(arch)
    if base == "10.1" and _version(cuda_version) >= (13, 0):
        return f"{what}: CUDA 13 renamed Thor's sm_101 to sm_110", f"write 11.0 for Thor with CUDA {cuda_version}"
    if base == "11.0" and _version(cuda_version) < (13, 0):
        return f"{what}: Thor is sm_101 before CUDA 13.0", f"write 10.1 for Thor with CUDA {cuda_version}"
    if not able:
        return f"{what}: no CUDA torchbuild knows compiles for it", "drop it from cuda_arch_list"
    if _version(able[0]) > _version(cuda_version):
        return f"{what}: nvcc compiles for it from CUDA {able[0]} on", (
            f"set cuda_version to {able[0]} or newer (and a base_image of that CUDA), or drop {entry} from cuda_arch_list"
        )
    return f"{what}: the last CUDA that compiles for it is {able[-1]}", (
        f"set cuda_version to {able[-1]} or older (and a base_image of that CUDA), or drop {entry} from cuda_arch_list"
    )
