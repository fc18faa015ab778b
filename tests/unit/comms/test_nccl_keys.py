"""The NCCL and aws-ofi-nccl profile keys: what they refuse when the profile resolves, before
anything is fetched or compiled, and the gencode NCCL is built with."""

from __future__ import annotations

import pytest
from helpers import TEST_TORCH

from torchbuild.comms.nccl_arch import gencode, nccl_cannot_target
from torchbuild.core.errors import ProfileError
from torchbuild.profile.config import resolve
from torchbuild.runtime.environment import build_env

CUDA = [TEST_TORCH, "cuda_version=12.4", 'cuda_arch_list=["9.0"]', "distributed=[gloo, nccl]"]


@pytest.mark.parametrize(
    ("version", "archs", "words"),
    [
        ("2.14.3-1", ["8.0", "9.0"], ["2.14.3-1 cannot target 9.0", "from 2.15.1"]),
        ("2.22.3-1", ["10.0"], ["cannot target 10.0", "from 2.25.1", "CUDA 12.8"]),
        ("2.22.3-1", ["12.0+PTX"], ["cannot target 12.0+PTX"]),
        ("2.28.3-1", ["5.0", "9.0"], ["no longer targets 5.0", "2.28.2"]),
        ("2.21.5-1", ["13.0"], ["newer than any NCCL release torchbuild knows"]),
    ],
)
def test_an_nccl_release_that_cannot_compile_for_an_arch_is_named(version, archs, words):
    problem = nccl_cannot_target(version, archs)
    for word in words:
        assert word in problem, problem


@pytest.mark.parametrize(
    ("version", "archs"), [("2.21.5-1", ["8.0"]), ("2.22.3-1", ["8.0", "9.0a"]), ("2.25.1-1", ["10.0", "12.0"])]
)
def test_an_nccl_release_that_can_is_accepted(version, archs):
    assert nccl_cannot_target(version, archs) == ""


def test_gencode_is_sass_per_arch_and_ptx_only_where_asked():
    assert gencode(["9.0"]) == "-gencode=arch=compute_90,code=sm_90"
    assert gencode(["8.0", "9.0a+PTX"]).split() == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90a,code=compute_90a",
    ]


def test_the_profile_refuses_an_nccl_that_cannot_target_its_arch_list():
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", [*CUDA, "nccl=source", "nccl_version=2.14.3-1"])
    assert "'nccl_version'" in exc.value.message and "9.0" in exc.value.message


def test_system_nccl_was_replaced_by_nccl_with_a_hint():
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", [*CUDA, "system_nccl=true"])
    assert "system_nccl" in exc.value.message and "nccl: system" in (exc.value.hint or "")


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["nccl=system", "distributed=[gloo]"], "'nccl'"),
        (["nccl=system", "nccl_source=/src/nccl"], "'nccl_source'"),
        (["nccl=bundled", f"nccl_sha256={'0' * 64}"], "'nccl_sha256'"),
        (["libfabric_prefix=/opt/cray/libfabric/1.15.2.0"], "'libfabric_prefix'"),
        (["aws_ofi_nccl_source=/tmp/ofi.tar.gz"], "'aws_ofi_nccl_source'"),
        (["aws_ofi_nccl_version=1.17.1", "distributed=[gloo]"], "'aws_ofi_nccl_version'"),
        (["nccl_sha256=abc"], "'nccl_sha256'"),
        (["libfabric_prefix=relative/path", "aws_ofi_nccl_version=1.17.1"], "'libfabric_prefix'"),
    ],
)
def test_nccl_keys_that_do_not_fit_together_are_named(sets, key):
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", [*CUDA, *sets])
    assert key in exc.value.message, exc.value.message


@pytest.mark.parametrize(("nccl", "flag"), [("bundled", "0"), ("system", "1"), ("source", "1")])
def test_use_system_nccl_follows_the_nccl_key(nccl, flag):
    spec = resolve("cpu", [*CUDA, f"nccl={nccl}", "nccl_version=2.22.3-1"])
    assert build_env(spec, cache_root="/cache", jobs=1)["USE_SYSTEM_NCCL"] == flag


def test_derecho_builds_nccl_and_the_plugin_from_source_for_the_a100():
    spec = resolve("derecho")
    assert (spec.nccl, spec.nccl_version, spec.aws_ofi_nccl_version) == ("source", "2.21.5-1", "1.6.0")
    assert spec.cuda_arch_list == ("8.0",) and "mpi" in spec.distributed and spec.mpi == "mpich"
    assert spec.libfabric_prefix.startswith("/opt/cray/libfabric/")
    assert build_env(spec, cache_root="/cache", jobs=1)["TORCH_CUDA_ARCH_LIST"] == "8.0"
