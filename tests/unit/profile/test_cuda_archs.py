"""CUDA 12.8 / 13 and Blackwell: what each CUDA compiles for (profile/cuda_archs.py), the torch
lines' CUDA and arch-name rules (profile/torch_lines.py), `invoke config`'s refusals of what the
profile's CUDA or torch cannot build, and the cuda128, cuda13 and gb200 profiles as resolved and
rendered (their nvidia/cuda bases are pulled from a registry, which the test machines lack)."""

from __future__ import annotations

import pytest

from torchbuild.core.arch import Arch
from torchbuild.core.errors import ProfileError
from torchbuild.image.host import build_args, make_context
from torchbuild.profile import cuda_archs, official_wheels, torch_lines
from torchbuild.profile.config import available_profiles, base_image_cuda, resolve
from torchbuild.runtime.environment import build_env


def test_the_table_has_what_nvidia_added_and_dropped_by_release():
    t = cuda_archs.TARGETS
    # 12.4 (Debian's) and 12.6 end at Hopper
    assert {"9.0", "9.0a"} <= t["12.4"] and not any(a.startswith(("10.", "12.")) for a in t["12.6"])
    # 12.8: Blackwell B200 (10.0), Thor (10.1), RTX 50 (12.0), with a variants, no f yet
    assert {"10.0", "10.0a", "10.1", "12.0", "12.0a"} <= t["12.8"] and "10.0f" not in t["12.8"]
    assert "10.3" not in t["12.8"] and "12.1" not in t["12.8"]
    # 12.9: B300 (10.3), DGX Spark (12.1), family f variants
    assert {"10.3", "12.1", "10.0f", "12.0f"} <= t["12.9"]
    # 13.0: no Maxwell, Pascal or Volta; Thor renamed 10.1 -> 11.0
    for gone in ("5.0", "6.0", "6.1", "7.0", "7.2", "10.1"):
        assert gone not in t["13.0"] and gone in t["12.9"], gone
    assert {"7.5", "11.0", "10.0", "12.0"} <= t["13.0"]
    assert "10.7" in t["13.4"] and "10.7" not in t["13.3"]
    assert {"3.5", "3.7"} <= t["11.8"] and "3.5" not in t["12.0"] and "9.0a" not in t["11.8"]


def test_a_cuda_not_in_the_table_takes_its_nearest_row():
    assert cuda_archs.row_of("12.7") == "12.6"  # there was no 12.7 release
    assert cuda_archs.row_of("13.9") == "13.5" and cuda_archs.row_of("14.0") == "13.5"  # newer: the newest
    assert cuda_archs.row_of("11.7") is None and cuda_archs.row_of("10.2") is None  # older: not checked
    assert cuda_archs.cannot_compile("11.0", ["10.0"]) is None


def test_plus_ptx_and_a_entries_are_checked_as_their_architecture():
    assert cuda_archs.cannot_compile("12.8", ["9.0a", "10.0+PTX", "12.0a"]) is None
    problem, hint = cuda_archs.cannot_compile("12.6", ["9.0", "12.0+PTX"]) or ("", "")
    assert "cannot compile for 12.0+PTX (sm_120" in problem and "from CUDA 12.8 on" in problem
    assert "cuda_version to 12.8 or newer" in hint


@pytest.mark.parametrize(
    ("profile", "sets", "words", "hint"),
    [
        # Debian's CUDA 12.4 (cuda-offline) has no Blackwell
        ("cuda-offline", ['cuda_arch_list=["9.0", "10.0"]'], "CUDA 12.4 cannot compile for 10.0 (sm_100", "12.8"),
        ("gh200-offline", ['cuda_arch_list=["10.0"]'], "from CUDA 12.8 on", "cuda_version to 12.8"),
        # B300 needs 12.9
        ("gb200", ['cuda_arch_list=["10.0", "10.3"]'], "CUDA 12.8 cannot compile for 10.3", "12.9 or newer"),
        # CUDA 13 dropped Volta; Thor is 11.0 there and 10.1 before
        ("cuda13", ['cuda_arch_list=["7.0", "8.0"]'], "the last CUDA that compiles for it is 12.9", "12.9 or older"),
        ("cuda13", ['cuda_arch_list=["10.1"]'], "renamed Thor's sm_101 to sm_110", "write 11.0"),
        ("cuda128", ['cuda_arch_list=["11.0"]'], "Thor is sm_101 before CUDA 13.0", "write 10.1"),
    ],
)
def test_config_refuses_an_arch_the_cuda_cannot_compile_by_name(profile, sets, words, hint):
    with pytest.raises(ProfileError, match="key 'cuda_arch_list'") as err:
        resolve(profile, sets)
    assert words in err.value.message and "cuda_version set in" in err.value.message
    assert hint in (err.value.hint or "")


def test_config_refuses_a_two_digit_arch_for_a_torch_before_2_6():
    with pytest.raises(ProfileError, match="key 'cuda_arch_list'") as err:
        resolve("cuda128", ["torch_version=2.5.1"])
    assert "10.0 is an unknown architecture name before PyTorch 2.6" in err.value.message
    assert "torch_version 2.5.1" in err.value.message and "2.6 or newer" in (err.value.hint or "")
    # 2.6 reads them (pytorch/pytorch#141724), and builds with 12.8, a newer minor than its 12.6
    assert resolve("cuda128", ["torch_version=2.6.0"]).cuda_arch_list == ("8.0", "9.0", "10.0", "12.0")


def test_config_refuses_a_cuda_major_newer_than_the_torch_line_was_released_for():
    with pytest.raises(ProfileError, match="key 'cuda_version'") as err:
        resolve("cuda13", ["torch_version=2.8.0"])
    assert "CUDA 13.0 is a newer major than PyTorch 2.8" in err.value.message and "12.9" in err.value.message
    assert resolve("cuda13", ["torch_version=2.9.0"]).cuda_version == "13.0"  # 2.9 was built with 13.0
    # a torch newer than the table, or main, may know a newer CUDA: not refused
    assert resolve("cuda13", ["torch_version=2.16.0"]).cuda_version == "13.0"
    assert resolve("cuda13", ["torch_version=2.8.0", "torch_ref=main"]).torch_ref == "main"


def test_the_cuda_ceilings_come_from_the_official_wheels_and_never_go_down():
    lines = official_wheels.LINES
    newest = [official_wheels.newest_cuda(line) for line in lines]
    assert [torch_lines.version_tuple(v) for v in newest] == sorted(torch_lines.version_tuple(v) for v in newest)
    assert dict(zip((line.torch for line in lines), newest))["2.6"] == "12.6"
    assert official_wheels.newest_cuda(official_wheels.line_of("2.8.0")) == "12.9"


def test_every_official_wheels_arch_list_compiles_with_its_cuda():
    """The two tables agree: each official wheel's TORCH_CUDA_ARCH_LIST is one its CUDA compiles."""
    for line in official_wheels.LINES:
        for wheel in (*line.x86_64, *line.aarch64):
            if wheel.cuda:
                assert cuda_archs.cannot_compile(wheel.cuda, wheel.archs) is None, (line.torch, wheel)


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profiles_arch_list_compiles_with_its_cuda(name):
    spec = resolve(name)
    if spec.cuda_version:
        assert cuda_archs.cannot_compile(spec.cuda_version, spec.cuda_arch_list) is None, name
        base = base_image_cuda(spec.base_image)
        assert base in ("", spec.cuda_version), (name, spec.base_image)


def test_gb200_is_gh200s_grace_settings_with_blackwell_and_cuda_12_8():
    gb200, gh200 = resolve("gb200"), resolve("gh200")
    assert gb200.arch is Arch.AARCH64 and gb200.cuda_arch_list == ("10.0",)
    assert gb200.cuda_version == "12.8" and base_image_cuda(gb200.base_image) == "12.8"
    assert torch_lines.line_of(gb200.torch_version).torch == "2.7"
    for key in ("cxxflags", "ldflags", "blas", "canaries", "cuda_flags", "nccl", "distributed"):
        assert getattr(gb200, key) == getattr(gh200, key), key
    assert gb200.switches["USE_PRIORITIZED_TEXT_FOR_LD"] == "1" and gb200.switches["USE_MAGMA"] == "0"
    env = build_env(gb200, cache_root="/cache", jobs=4, backend="docker")
    assert env["TORCH_CUDA_ARCH_LIST"] == "10.0" and "-flax-vector-conversions" in env["CXXFLAGS"]


@pytest.mark.parametrize(
    ("name", "base", "cuda", "arch", "archs"),
    [
        ("cuda128", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04", "12.8", "x86_64", "8.0;9.0;10.0;12.0"),
        ("cuda13", "nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04", "13.0", "x86_64", "8.0;9.0;10.0;12.0"),
        ("gb200", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04", "12.8", "aarch64", "10.0"),
    ],
)
def test_the_blackwell_images_render_with_their_cuda_base(tmp_path, name, base, cuda, arch, archs):
    """What `invoke image` hands the engine for them: the base whose nvcc cuda-check.sh checks
    against cuda_version, the platform and the arch list the build sees."""
    spec = resolve(name)
    args = build_args(spec)
    assert args["BASE_IMAGE"] == base and args["TORCHBUILD_CUDA_VERSION"] == cuda
    assert args["TORCHBUILD_CUDA_HOME"] == "/usr/local/cuda" and spec.arch.value == arch
    make_context(spec, tmp_path)
    assert "cuda-check.sh" in (tmp_path / "Dockerfile").read_text()
    assert build_env(spec, cache_root="/cache", jobs=4, backend="docker")["TORCH_CUDA_ARCH_LIST"] == archs
