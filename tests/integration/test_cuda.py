"""CUDA toolchains without NVIDIA's servers or a GPU: Debian's packaged CUDA 12.4 compiles
(never runs) device code for sm_90, and the real PyTorch 2.6 source configures with CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import FIXTURES, image_ok, preflight_ok, set_args

pytestmark = pytest.mark.docker

KERNEL = r"""
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def test_offline_cuda_image_compiles_for_sm90(engine, cuda_image, tmp_path):
    (tmp_path / "axpy.cu").write_text(KERNEL)
    script = (
        "nvcc --version | tail -2 && "
        "nvcc -arch=sm_90 -Xfatbin -compress-all -c /w/axpy.cu -o /w/axpy.o && "
        "cuobjdump --list-elf /w/axpy.o"
    )
    out = engine.client.containers.run(
        cuda_image[0].image_tag,
        ["bash", "-c", script],
        volumes={str(tmp_path): {"bind": "/w", "mode": "rw"}},
        remove=True,
    ).decode()
    assert "release 12.4" in out
    assert "sm_90" in out  # the object carries device code for Hopper
    assert (tmp_path / "axpy.o").stat().st_size > 0


@pytest.mark.slow
def test_real_pytorch_cuda_preflight(engine, local_base, site_certs, debian_dsc, tmp_path):
    profile = str(FIXTURES / "profiles" / "debian-pytorch-2.6-cuda.yaml")
    sets = set_args([f"base_image={local_base}", *site_certs, f"cache_dir={tmp_path / 'cache'}"])
    image_ok(profile, sets)
    stdout, data = preflight_ok(profile, debian_dsc, tmp_path / "out", sets)
    assert "USE_CUDA=1" in stdout and "TORCH_CUDA_ARCH_LIST=9.0" in stdout
    assert "PyTorch: CUDA detected: 12.4" in stdout
    assert data["preflight"]["targets"] == ["c10", "c10_cuda"]
    assert "release 12.4" in data["toolchain"]["nvcc"]
    (canary,) = data["preflight"]["canaries"]
    assert canary["file"].endswith(".cu") and canary["seconds"] > 0
    tree = Path(data["source"]["path"])
    assert list((tree / "build" / "lib").glob("libc10_cuda.so*"))
