"""What PyTorch's official Linux wheels are, per release line, in one table (no imports from the
rest of torchbuild): `need_build` compares a profile with it to say whether a source build is
needed at all, or an official wheel would do.

Sources (read 2026-11; [src] stated there, [inf] inferred, the reasoning given):
- Python range and CUDA versions: RELEASE.md's "Release Compatibility Matrix" (pytorch/pytorch), rows
  2.3 to 2.14, stable and experimental CUDA alike (both are published on download.pytorch.org) [src].
  PyPI's tags are narrower than RELEASE.md for 2.13 and 2.14 (cp310 to cp314: pytorch/test-infra#8861,
  the PyTorchKR compatibility table), so 3.14 is their ceiling here [src]. 2.5's 3.13 ("experimental")
  wheels are counted [inf]. 2.15 has no RELEASE.md row: Python 3.11 up (pytorch/pytorch#197242) and
  CUDA 13.0 and 13.2 only (RFC pytorch/pytorch#190385) are its plan; its ceiling is 2.14's [inf].
- aarch64 CUDA wheels: none before 2.6; 2.6 CUDA 12.6 (the 2.6 release blog), 2.7 12.8 and 2.8 12.9
  (third-party build matrices), 2.9 on "across all supported CUDA versions" (the 2.9 blog) [src];
  2.15's as x86_64's [inf]. aarch64 CPU wheels exist for every line here [src: PyPI].
- Arch lists (TORCH_CUDA_ARCH_LIST of the wheel builds): RELEASE.md's "PyTorch CUDA Support Matrix" for
  2.12 to 2.14 (12.6.3: 5.0 to 9.0; 13.0.2 and 13.2.1: 7.5, 8.0, 8.6, 9.0, 10.0, 12.0+PTX; aarch64:
  8.0 and 9.0 with 12.6, plus 10.0, 11.0, 12.0+PTX with 13.x) [src]. Other lines from stored copies of
  .ci/manywheel/build_cuda.sh (pytorch/pytorch@00c7a380: 12.6, 12.8, 12.9; a 2.5/2.6-era fork copy,
  zhulu506/pytorch_gmlake@b55eee45: 11.8, 12.1, 12.4, and 9.0 alone for aarch64 12.4/12.6;
  nWEIdia/pytorch@786e6569: the aarch64 filter, 8.0 and up without 8.6) and
  .ci/aarch64_linux/aarch64_ci_build.sh (aarch64 12.9: see ARM_CU129); which commit
  each release was cut from is not known, so the list of a line other than 2.12 to 2.14 is [inf].
- glibc: manylinux2014 (2.17) to 2.5; the x86_64 wheel builds moved to manylinux_2_28 (AlmaLinux 8,
  glibc 2.28) on 2024-11-14 (pytorch/pytorch#138732) and aarch64 in December 2024
  (pytorch/pytorch#142043), before the 2.6 branch cut: 2.28 from 2.6 on [inf from the dates].
- What they build without: MPI (USE_MPI is never set by the wheel builds, and torch's MPI
  backend needs an MPI at build time) [src: the build scripts above]; UCC [inf, the same]. Their
  NCCL: linked from the builder image, then loaded at run time from the nvidia-nccl-cu* pip
  package through an RPATH set with --force-rpath ($ORIGIN/../../nvidia/nccl/lib: searched before
  LD_LIBRARY_PATH) [src: build_cuda.sh's "Using nvidia libs from pypi"].
"""

from __future__ import annotations

import dataclasses

INDEX = "https://download.pytorch.org/whl"


@dataclasses.dataclass(frozen=True)
class Wheel:
    """One official wheel variant: CPU ("" cuda) or one CUDA version, with its arch list."""

    cuda: str
    archs: tuple[str, ...] = ()  # TORCH_CUDA_ARCH_LIST as the build had it ("12.0+PTX")

    @property
    def index(self) -> str:
        """The pip index that serves it: .../cpu or .../cu126."""
        return f"{INDEX}/{'cu' + self.cuda.replace('.', '') if self.cuda else 'cpu'}"


@dataclasses.dataclass(frozen=True)
class Line:
    """One release line's official Linux wheels."""

    torch: str
    python_min: str
    python_max: str
    glibc: str  # the manylinux floor of the line's wheels
    x86_64: tuple[Wheel, ...]
    aarch64: tuple[Wheel, ...]


def _archs(text: str) -> tuple[str, ...]:
    return tuple(text.split(";"))


CPU = Wheel("")
CU118 = Wheel("11.8", _archs("3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0"))
CU121 = Wheel("12.1", _archs("5.0;6.0;7.0;7.5;8.0;8.6;9.0"))
CU124 = Wheel("12.4", _archs("5.0;6.0;7.0;7.5;8.0;8.6;9.0+PTX"))
CU126 = Wheel("12.6", _archs("5.0;6.0;7.0;7.5;8.0;8.6;9.0"))
CU128 = Wheel("12.8", _archs("7.0;7.5;8.0;8.6;9.0;10.0;12.0"))
CU129 = Wheel("12.9", _archs("7.0;7.5;8.0;8.6;9.0;10.0;12.0+PTX"))
CU130 = Wheel("13.0", _archs("7.5;8.0;8.6;9.0;10.0;12.0+PTX"))
CU132 = Wheel("13.2", _archs("7.5;8.0;8.6;9.0;10.0;12.0+PTX"))
ARM_CU126_HOPPER = Wheel("12.6", ("9.0",))  # 2.6: GH200 only
ARM_CU126 = Wheel("12.6", _archs("8.0;9.0"))
ARM_CU128 = Wheel("12.8", _archs("8.0;9.0;10.0;12.0"))
# 2.8's aarch64 12.9 wheels: "8.0;9.0;10.0;12.0", the 12.9 line pytorch/pytorch#161257 (2025-08-22)
# replaced; a stored aarch64_ci_build.sh (@04c5727d) lists 11.0 and 12.1 for 12.9 as well, which
# nvcc 12.9 cannot compile (Thor is sm_101 there: profile/cuda_archs.py), so it is not what built.
ARM_CU129 = Wheel("12.9", _archs("8.0;9.0;10.0;12.0"))
ARM_CU130 = Wheel("13.0", _archs("8.0;9.0;10.0;11.0;12.0+PTX"))
ARM_CU132 = Wheel("13.2", _archs("8.0;9.0;10.0;11.0;12.0+PTX"))

LINES: tuple[Line, ...] = (
    Line("2.3", "3.8", "3.12", "2.17", (CPU, CU118, CU121), (CPU,)),
    Line("2.4", "3.8", "3.12", "2.17", (CPU, CU118, CU121, CU124), (CPU,)),
    Line("2.5", "3.9", "3.13", "2.17", (CPU, CU118, CU121, CU124), (CPU,)),
    Line("2.6", "3.9", "3.13", "2.28", (CPU, CU118, CU124, CU126), (CPU, ARM_CU126_HOPPER)),
    Line("2.7", "3.9", "3.13", "2.28", (CPU, CU118, CU126, CU128), (CPU, ARM_CU128)),
    Line("2.8", "3.9", "3.13", "2.28", (CPU, CU126, CU128, CU129), (CPU, ARM_CU129)),
    Line("2.9", "3.10", "3.14", "2.28", (CPU, CU126, CU128, CU130), (CPU, ARM_CU126, ARM_CU128, ARM_CU130)),
    Line("2.10", "3.10", "3.14", "2.28", (CPU, CU126, CU128, CU130), (CPU, ARM_CU126, ARM_CU128, ARM_CU130)),
    Line("2.11", "3.10", "3.14", "2.28", (CPU, CU126, CU128, CU130), (CPU, ARM_CU126, ARM_CU128, ARM_CU130)),
    Line("2.12", "3.10", "3.14", "2.28", (CPU, CU126, CU130, CU132), (CPU, ARM_CU126, ARM_CU130, ARM_CU132)),
    Line("2.13", "3.10", "3.14", "2.28", (CPU, CU126, CU130, CU132), (CPU, ARM_CU126, ARM_CU130, ARM_CU132)),
    Line("2.14", "3.10", "3.14", "2.28", (CPU, CU126, CU130, CU132), (CPU, ARM_CU126, ARM_CU130, ARM_CU132)),
    Line("2.15", "3.11", "3.14", "2.28", (CPU, CU130, CU132), (CPU, ARM_CU130, ARM_CU132)),
)

# Switches the wheel builds set on (value "1"), by where: "all", "cuda", "x86_64", "aarch64".
# build_cuda.sh: USE_CUSPARSELT, USE_CUFILE, USE_SYSTEM_NCCL (the builder's NCCL, then pip's at
# run time); aarch64_ci_build.sh: USE_PRIORITIZED_TEXT_FOR_LD and --enable-mkldnn [src]. cuDNN:
# RELEASE.md names each CUDA wheel's CUDNN [src]. The rest are PyTorch's own defaults, which the
# wheel builds leave on, and MKL and MAGMA on x86_64 (the CUDA builds link /usr/local/magma) [inf].
ON: dict[str, str] = {
    "USE_DISTRIBUTED": "all",
    "USE_GLOO": "all",
    "USE_MKLDNN": "all",
    "USE_OPENMP": "all",
    "USE_KINETO": "all",
    "USE_NUMPY": "all",
    "USE_FBGEMM": "x86_64",
    "USE_MKL": "x86_64",
    "USE_PRIORITIZED_TEXT_FOR_LD": "aarch64",
    "USE_CUDA": "cuda",
    "USE_CUDNN": "cuda",
    "USE_CUSPARSELT": "cuda",
    "USE_CUFILE": "cuda",
    "USE_NCCL": "cuda",
    "USE_MAGMA": "cuda-x86_64",
    "USE_FLASH_ATTENTION": "cuda",
    "USE_MEM_EFF_ATTENTION": "cuda",
}

# Sources compiled only with USE_MPI=1: a patch that touches nothing else changes nothing an
# official wheel (or a build without MPI) has (caffe2/CMakeLists.txt adds ProcessGroupMPI.cpp under
# if(USE_MPI)) [src].
MPI_ONLY_SOURCES = ("torch/csrc/distributed/c10d/ProcessGroupMPI.",)


def line_of(torch_version: str) -> Line | None:
    """The line of torch_version ("2.6.0": 2.6), None for one the table does not know."""
    parts = torch_version.split(".")
    wanted = ".".join(parts[:2])
    return next((line for line in LINES if line.torch == wanted), None)


def newest_cuda(line: Line) -> str:
    """The newest CUDA the line's wheels were built with, on either arch ("12.6" for 2.6)."""
    return max((w.cuda for w in (*line.x86_64, *line.aarch64) if w.cuda), key=lambda v: tuple(map(int, v.split("."))))


def cuda_too_new(line: Line, cuda_version: str) -> bool:
    """Whether cuda_version is a newer CUDA major than any the line's wheels were built with (13
    for 2.8), which its source does not build with: CUDA 13.0 removed cudaDeviceProp's clockRate
    and memoryClockRate and moved CCCL to 3.0 (its release notes), which PyTorch followed from 2.9,
    the first line with CUDA 13.0 wheels. A newer minor is not (12.8 for 2.6: NVIDIA keeps minors
    source compatible, and Triton's README built 2.6.0-rc9 with CUDA 12.8 for Blackwell)."""
    return int(cuda_version.split(".")[0]) > int(newest_cuda(line).split(".")[0])
