"""The preflight of the real PyTorch 2.6 source (Debian's de-vendored 2.6.0+dfsg, fetched as
a .dsc) in images the tool builds from Debian's Build-Depends: on the CPU, twice, the second
time in a fresh tree with the ccache warm, CMake's probe results and ATen's code generation
reused (about 7 minutes with its 2.6 GB image on 2 cores); with CUDA 12.4 from Debian's
packages, c10_cuda and a .cu canary of PyTorch's (about 8 to 10 minutes with its image).

Moved here from the integration suite (its two longest tests). The integration suite keeps
the same product behaviours on the fixture source: tests/integration/test_build.py's
test_preflight_twice_reuses_probes_and_ccache_in_a_fresh_tree (patches, probes, ccache, a
canary in the cpu image) and tests/integration/test_cuda.py's
test_fixture_cuda_preflight_builds_c10_cuda_and_a_cu_canary (USE_CUDA, the arch list, nvcc,
a .cu canary in the cuda-offline image)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, image_ok, preflight_ok, set_args
from integration.test_build import configure_result

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_real_pytorch_preflight_and_ccache_reuse(engine, local_base, site_certs, debian_dsc, tmp_path):
    """Debian's de-vendored PyTorch 2.6: configure + c10 in a tool-built image, twice; the second
    time in a fresh tree (--clean) with the ccache warm and CMake's probe results of the first."""
    profile = str(FIXTURES / "profiles" / "debian-pytorch-2.6.yaml")
    sets = set_args([TEST_TORCH, f"base_image={local_base}", *site_certs, f"cache_dir={tmp_path / 'cache'}"])
    image_ok(profile, sets)
    first_out, m1 = preflight_ok(profile, debian_dsc, tmp_path / "out", sets)
    assert "USE_SYSTEM_LIBS=ON" in first_out
    assert m1["preflight"]["targets"] == ["c10"]
    tree = Path(m1["source"]["path"])
    assert list((tree / "build" / "lib").glob("libc10.so*"))
    assert m1["source"]["kind"] == "dsc" and len(m1["source"]["sha256"]) == 64
    # the shipped CUDA-aware MPI series (2.6 reuses 2.4's) was applied to the real source
    assert m1["patches"]["applied_now"] == ["01-cuda-aware-mpi-fallback.patch"]
    assert "MPICH_GPU_SUPPORT_ENABLED" in (tree / "torch/csrc/distributed/c10d/ProcessGroupMPI.cpp").read_text()
    # the first configure ran CMake's probes and saved their results for the next fresh tree
    ran = re.search(r"CMake checks: none seeded \(none saved .*\), (\d+) probes ran", first_out)
    saved = re.search(r"CMake checks: saved (\d+) for the next fresh tree: /cache/cmake-checks/\w+\.json", first_out)
    assert ran and saved and int(ran[1]) >= 30 and int(saved[1]) >= 30, first_out[-5000:]
    # ATen's code generation (3 dry runs in the configure, 3 runs before c10) ran and was saved
    assert first_out.count("torchbuild: code generation saved (torchgen.gen") == 6, first_out[-5000:]
    first = configure_result(tree / "build")

    second_out, m2 = preflight_ok(profile, debian_dsc, tmp_path / "out", sets, "--clean")
    # the fresh tree started from them: no probe ran again, and CMake decided the same
    assert f"CMake checks: {saved[1]} seeded, 0 probes ran" in second_out, second_out[-5000:]
    assert configure_result(tree / "build") == first
    # and none of it ran again: all six restored from /cache/codegen
    assert second_out.count("torchbuild: code generation reused (torchgen.gen") == 6, second_out[-5000:]
    assert "code generation saved" not in second_out
    assert m2["patches"]["already_applied"] == ["01-cuda-aware-mpi-fallback.patch"]
    assert m2["patches"]["applied_now"] == []
    assert m2["ccache"]["hit_rate"] >= 0.90, m2["ccache"]
    assert re.search(r"^ccache hit rate +\d+% \(\d+ hits", second_out, re.M), second_out[-2000:]


def test_real_pytorch_cuda_preflight(engine, local_base, site_certs, debian_dsc, tmp_path):
    profile = str(FIXTURES / "profiles" / "debian-pytorch-2.6-cuda.yaml")
    sets = set_args([TEST_TORCH, f"base_image={local_base}", *site_certs, f"cache_dir={tmp_path / 'cache'}"])
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
