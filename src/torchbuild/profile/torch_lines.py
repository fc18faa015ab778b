"""What each PyTorch release line needs to build from source, in one place (no imports from the
rest of torchbuild: config checks profiles against it before any image is built).

Sources, per column (read 2026-11; "inferred" where no tagged file was read, see each note):
- python: the oldest Python setup.py (pyproject) accepts, which for 2.5 is 3.8 though its wheels
  start at 3.9; RELEASE.md's "Release Compatibility Matrix" (pytorch/pytorch), rows 2.6 to 2.14; 2.15's
  floor from pytorch/pytorch#197242 ("PyTorch 2.15 will be our first release without Python 3.10
  binaries"); its ceiling is not published in what was read, so 2.14's is kept.
- gcc: CMakeLists.txt's check "GCC-9.3 or newer is required to compile PyTorch" (2.6 to 2.11);
  11.3 from the C++20 switch (pytorch/pytorch#167929, merged 2026-02-24, before the 2.12 branch
  cut; README: "gcc 11.3.0 or newer is required"; inferred for 2.12 from the merge date).
- cmake: cmake_minimum_required(VERSION 3.18) to 2.8; 3.27 from pytorch/pytorch#154783 (in 2.9 by
  its date, inferred) on, and pyproject's "cmake>=3.27".
- cuda: the oldest CUDA a source build accepts: 11.0 to 2.8 (#146244: "we require CUDA >=11.0"),
  12.0 from 2.9 (#164199 removed the checks for CUDA < 12), 12.1 from 2.12 (#178925), 12.6 from
  2.15 (#192257, cmake/public/cuda.cmake; which side of the 2.14 cut it landed is not known, so
  2.14 keeps 12.1).
- backend: main replaced setup.py by scikit-build-core on 2026-07-20 (pytorch/pytorch#189758,
  #180247/#180248), before the 2.14 branch cut (2026-08-10): 2.14 and later have no setup.py.

A torch newer than the last line (2.16 before torchbuild knows it) takes the last line's
requirements, which a new release has so far only raised: `newest_known()` says so where it is used.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Line:
    """One release line's source-build requirements (versions as text, compared numerically)."""

    torch: str  # "2.6"
    python_min: str
    python_max: str
    gcc_min: str
    cmake_min: str
    cuda_min: str
    cxx_standard: int
    backend: str  # "setuptools" (setup.py) or "scikit-build-core"


LINES: tuple[Line, ...] = (
    Line("2.3", "3.8", "3.12", "9.3", "3.18", "11.0", 17, "setuptools"),
    Line("2.4", "3.8", "3.12", "9.3", "3.18", "11.0", 17, "setuptools"),
    Line("2.5", "3.8", "3.13", "9.3", "3.18", "11.0", 17, "setuptools"),
    Line("2.6", "3.9", "3.13", "9.3", "3.18", "11.0", 17, "setuptools"),
    Line("2.7", "3.9", "3.13", "9.3", "3.18", "11.0", 17, "setuptools"),
    Line("2.8", "3.9", "3.13", "9.3", "3.18", "11.0", 17, "setuptools"),
    Line("2.9", "3.10", "3.14", "9.3", "3.27", "12.0", 17, "setuptools"),
    Line("2.10", "3.10", "3.14", "9.3", "3.27", "12.0", 17, "setuptools"),
    Line("2.11", "3.10", "3.14", "9.3", "3.27", "12.0", 17, "setuptools"),
    Line("2.12", "3.10", "3.14", "11.3", "3.27", "12.1", 20, "setuptools"),
    Line("2.13", "3.10", "3.15", "11.3", "3.27", "12.1", 20, "setuptools"),
    Line("2.14", "3.10", "3.15", "11.3", "3.27", "12.1", 20, "scikit-build-core"),
    Line("2.15", "3.11", "3.15", "11.3", "3.27", "12.6", 20, "scikit-build-core"),
)
DEVELOPMENT_REFS = ("main", "master", "viable/strict", "nightly")  # build like the newest line

# How PyTorch reads TORCH_CUDA_ARCH_LIST: cmake/Modules_CUDA_fix/upstream/FindCUDA/
# select_compute_arch.cmake matches each entry against "^([0-9]+\\.[0-9]a?(\\([0-9]+\\.[0-9]\\))?)$"
# (+PTX taken off first) and stops the configure with "Unknown CUDA Architecture Name" for any
# other: an a suffix only, no f (CUDA 12.9's family variants), as config's schema holds it. Two-digit majors (10.0, 12.0) came
# with pytorch/pytorch#141724 (Blackwell, "[0-9]" became "[0-9]+"), which 2.6 has: Triton's README
# built Blackwell from 2.6.0-rc9 with TORCH_CUDA_ARCH_LIST=Blackwell. Lines before 2.6 refuse them.
TWO_DIGIT_ARCH_FROM = "2.6"
_TORCH_ARCH = re.compile(r"(\d+)\.")

_RELEASE = re.compile(r"(\d+)\.(\d+)")


def minor(version: str) -> str:
    """'2.6' of '2.6.0', '2.6.0a0+git1234', '0.21.0+gh200'; '' when it is not a release number."""
    m = _RELEASE.match(version.strip())
    return f"{m[1]}.{m[2]}" if m else ""


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def line_of(torch_version: str, torch_ref: str = "") -> Line | None:
    """The line torch_version belongs to; the newest for a development ref or a torch newer than
    the table; None for one older than the table or not a release number."""
    if torch_ref in DEVELOPMENT_REFS:
        return LINES[-1]
    m = _RELEASE.match(torch_version.strip())
    if not m:
        return None
    wanted = (int(m[1]), int(m[2]))
    for line in LINES:
        if version_tuple(line.torch) == wanted:
            return line
    return LINES[-1] if wanted > version_tuple(LINES[-1].torch) else None


def newest_known(torch_version: str) -> bool:
    """Whether torch_version is newer than every line here (its requirements are assumed)."""
    m = _RELEASE.match(torch_version.strip())
    return m is not None and (int(m[1]), int(m[2])) > version_tuple(LINES[-1].torch)


def older(found: str, floor: str) -> bool:
    """Whether version `found` ("9.4", "3.12") is older than `floor`."""
    return bool(found and floor) and version_tuple(found) < version_tuple(floor)


def arch_problem(line: Line, entry: str) -> str:
    """Why PyTorch `line` cannot read cuda_arch_list entry `entry` ("" when it can): the
    schema already holds entries to major.minor, an optional a and +PTX, as PyTorch reads them."""
    m = _TORCH_ARCH.match(entry)
    if m and len(m[1]) > 1 and older(line.torch, TWO_DIGIT_ARCH_FROM):
        return f"{entry} is an unknown architecture name before PyTorch {TWO_DIGIT_ARCH_FROM} (one-digit majors only)"
    return ""
