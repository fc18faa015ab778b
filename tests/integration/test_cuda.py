"""CUDA toolchains without NVIDIA's servers or a GPU: Debian's packaged CUDA 12.4 compiles
(never runs) device code for sm_90, and the fixture's preflight with CUDA builds its c10_cuda
and a .cu canary with nvcc in the cuda-offline image. The real PyTorch 2.6 source's CUDA
preflight is tests/slow/test_real_preflight.py (8 to 10 minutes with its image)."""

from __future__ import annotations

import shutil

import pytest
from helpers import FIXTURES, TEST_TORCH, preflight_ok, set_args

from torchbuild.profile.cuda_archs import TARGETS, sm_name

pytestmark = pytest.mark.docker

KERNEL = r"""
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _in_image(engine, tag: str, script: str, work) -> str:
    """What `bash -c script` prints in the image, with the kernel at /w/axpy.cu."""
    (work / "axpy.cu").write_text(KERNEL)
    volumes = {str(work): {"bind": "/w", "mode": "rw"}}
    return engine.client.containers.run(tag, ["bash", "-c", script], volumes=volumes, remove=True).decode()


def test_offline_cuda_image_compiles_for_sm90(engine, cuda_image, tmp_path):
    script = (
        "nvcc --version | tail -2 && "
        "nvcc -arch=sm_90 -Xfatbin -compress-all -c /w/axpy.cu -o /w/axpy.o && "
        "cuobjdump --list-elf /w/axpy.o"
    )
    out = _in_image(engine, cuda_image[0].image_tag, script, tmp_path)
    assert "release 12.4" in out
    assert "sm_90" in out  # the object carries device code for Hopper
    assert (tmp_path / "axpy.o").stat().st_size > 0


def test_offline_cuda_images_nvcc_targets_are_the_tables_and_sm100_is_refused(engine, cuda_image, tmp_path):
    """The sm_100 canary where the toolkit cannot have it: Debian's nvcc 12.4 compiles for exactly
    what the table says CUDA 12.4 does, and stops at sm_100 as `invoke config` does (the canary
    that compiles for sm_100 needs CUDA 12.8, which no Debian suite packages: docs/guide/offline.md)."""
    script = (
        "nvcc --version | tail -1 && echo codes: $(nvcc --list-gpu-code) && "
        "{ nvcc -arch=sm_100 -c /w/axpy.cu -o /w/axpy100.o 2>&1; echo sm_100 exit $?; }"
    )
    out = _in_image(engine, cuda_image[0].image_tag, script, tmp_path)
    assert "cuda_12.4" in out, out
    codes = set(out.split("codes:", 1)[1].splitlines()[0].split())
    # --list-gpu-code lists the plain targets; the table's a variants are the same GPUs
    assert codes == {sm_name(a) for a in TARGETS["12.4"] if not a.endswith("a")}, out
    assert "Value 'sm_100' is not defined for option 'gpu-architecture'" in out and "sm_100 exit 1" in out, out
    assert not (tmp_path / "axpy100.o").exists()


def test_fixture_cuda_preflight_builds_c10_cuda_and_a_cu_canary(cuda_image, tmp_path):
    """`invoke build --in-container --preflight` of the fixture with the cuda-offline profile:
    the build environment turns CUDA on for the arch list asked, nvcc compiles the fixture's
    c10_cuda for it and the .cu canary is timed; the manifest records nvcc."""
    _, image_sets = cuda_image
    tree = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    # the image was made for the plugin too (test_comms): this build makes none, and names the
    # plugin's build tools as extra packages so that it asks for the very same image
    plugin_tools = "apt_packages=[make, autoconf, automake, libtool, libhwloc-dev, libfabric-dev]"
    sets = [
        TEST_TORCH,
        *image_sets,
        "aws_ofi_nccl_version=",
        plugin_tools,
        f"cache_dir={tmp_path / 'cache'}",
        "patches=none",
    ]
    sets.append('cuda_arch_list=["9.0"]')
    sets.append("preflight_targets=[c10, c10_cuda]")
    stdout, data = preflight_ok("cuda-offline", tree, tmp_path / "out", set_args(sets), "--canary", "csrc/c10_cuda.cu")
    assert "USE_CUDA=1" in stdout and "TORCH_CUDA_ARCH_LIST=9.0" in stdout, stdout[-3000:]
    assert data["preflight"]["targets"] == ["c10", "c10_cuda"]
    assert "release 12.4" in data["toolchain"]["nvcc"]
    (canary,) = data["preflight"]["canaries"]
    assert canary["file"] == "csrc/c10_cuda.cu" and canary["seconds"] > 0, canary
    assert (tree / "build" / "libc10_cuda.a").is_file()
    # nvcc compiles the device code for the architecture asked (sm_90), not its default
    ninja = (tree / "build" / "build.ninja").read_text()
    assert "arch=compute_90" in ninja and "compute_52" not in ninja, [ln for ln in ninja.splitlines() if "arch=" in ln]
