"""gh200 without a registry: the gh200-offline profile's image (arm64 trixie, Debian's CUDA 12.4 and
NCCL 2.22.3, the gh200 flags) built under qemu-user emulation, with the build dependencies of
Debian's PyTorch 2.6 source on top (tests/fixtures/profiles/debian-pytorch-2.6-gh200-offline.yaml,
which extends it); its nvcc compiles a CUDA canary for sm_90, and the preflight's configure of the
real PyTorch source finds CUDA. `nox -s slow`: the image takes tens of minutes on 2 cores (apt's
unpacking of the CUDA packages, emulated); its time and size are printed."""

from __future__ import annotations

import time

import pytest
from helpers import FIXTURES, TEST_TORCH, image_ok, preflight_ok, set_args

from torchbuild.profile.config import resolve

pytestmark = [pytest.mark.docker, pytest.mark.emulation, pytest.mark.slow]

PROFILE = str(FIXTURES / "profiles" / "debian-pytorch-2.6-gh200-offline.yaml")

CANARY = r"""
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(scope="module")
def gh200_offline_image(engine, arm64_base, site_certs):
    """The image, built through the CLI: (its spec, the --set values it was built with)."""
    sets = [TEST_TORCH, f"base_image={arm64_base}", *site_certs]
    t0 = time.monotonic()
    image_ok(PROFILE, set_args(sets), timeout=7200)
    spec = resolve(PROFILE, sets)
    size = engine.image_attrs(spec.image_tag)["Size"]
    print(f"\ngh200-offline image {spec.image_tag}: {time.monotonic() - t0:.0f} s under qemu, {size / 2**30:.2f} GiB")
    return spec, sets


def test_the_images_nvcc_compiles_a_canary_for_sm90_on_arm64(engine, gh200_offline_image, tmp_path):
    spec, _ = gh200_offline_image
    assert spec.arch.value == "aarch64" and spec.cuda_home == "/usr"
    assert engine.image_attrs(spec.image_tag)["Architecture"] == "arm64"
    (tmp_path / "axpy.cu").write_text(CANARY)
    script = (
        "uname -m && nvcc --version | tail -2 && "
        "nvcc -arch=sm_90 -Xfatbin -compress-all -c /w/axpy.cu -o /w/axpy.o && "
        "cuobjdump --list-elf /w/axpy.o && readelf -h /w/axpy.o | grep Machine && "
        "ls /usr/include/nccl.h"
    )
    out = engine.client.containers.run(
        spec.image_tag,
        ["bash", "-c", script],
        volumes={str(tmp_path): {"bind": "/w", "mode": "rw"}},
        remove=True,
        platform="linux/arm64",
    ).decode()
    assert out.splitlines()[0] == "aarch64"
    assert "release 12.4" in out
    assert ".sm_90.cubin" in out  # the object's device code is for Hopper
    assert "AArch64" in out  # and its host code for Grace
    assert "/usr/include/nccl.h" in out  # Debian's libnccl-dev: the system NCCL gh200 links


def test_the_gh200_preflight_configures_real_pytorch_with_cuda(gh200_offline_image, debian_dsc, tmp_path):
    _, sets = gh200_offline_image
    args = set_args([TEST_TORCH, *sets, f"cache_dir={tmp_path / 'cache'}"])
    stdout, data = preflight_ok(PROFILE, debian_dsc, tmp_path / "out", args, timeout=7200)
    assert "USE_CUDA=1" in stdout and "TORCH_CUDA_ARCH_LIST=9.0" in stdout
    assert "-flax-vector-conversions" in stdout  # the gh200 flags
    assert "PyTorch: CUDA detected: 12.4" in stdout
    assert "release 12.4" in data["toolchain"]["nvcc"]
    assert data["resolved_profile"]["arch"] == "aarch64"
    print(f"\ngh200-offline preflight: configure {data['preflight']['configure_s']} s under qemu")
