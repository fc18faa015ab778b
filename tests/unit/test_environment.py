from __future__ import annotations

from torchbuild.inputs.config import resolve
from torchbuild.inputs.environment import build_env, compilers, format_env


def test_cpu_env_has_no_cuda_and_uses_ccache():
    env = build_env(resolve("cpu"), cache_root="/cache", jobs=3)
    assert env["USE_CUDA"] == "0"
    assert "TORCH_CUDA_ARCH_LIST" not in env and "CMAKE_CUDA_COMPILER_LAUNCHER" not in env
    assert env["CMAKE_C_COMPILER_LAUNCHER"] == env["CMAKE_CXX_COMPILER_LAUNCHER"] == "ccache"
    assert env["MAX_JOBS"] == "3"
    assert env["CCACHE_DIR"] == "/cache/ccache" and env["PIP_CACHE_DIR"] == "/cache/pip"
    assert env["PYTORCH_BUILD_VERSION"] == "2.6.0"
    assert (env["USE_DISTRIBUTED"], env["USE_GLOO"], env["USE_NCCL"], env["USE_MPI"]) == ("1", "1", "0", "0")


def test_cuda_env_carries_arch_list_nvcc_flags_and_launcher():
    spec = resolve("cuda", ["nvcc_threads=4", "local_version="])
    env = build_env(spec, cache_root="/c", jobs=1)
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    assert env["TORCH_NVCC_FLAGS"] == "-Xfatbin -compress-all --threads 4"
    assert env["CMAKE_CUDA_COMPILER_LAUNCHER"] == "ccache"
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    assert env["PYTORCH_BUILD_VERSION"] == "2.6.0"


def test_switches_win_over_derived_values_and_env_comes_last():
    spec = resolve("cpu", ["switches.USE_GLOO=0", "env={USE_GLOO: '2', CMAKE_PREFIX_PATH: /opt/x}"])
    env = build_env(spec, cache_root="/c", jobs=1)
    assert env["USE_GLOO"] == "2"
    assert env["CMAKE_PREFIX_PATH"] == "/opt/x"


def test_no_distributed_turns_every_backend_off():
    env = build_env(resolve("cpu", ["distributed=[]"]), cache_root="/c", jobs=1)
    assert env["USE_DISTRIBUTED"] == "0" and env["USE_GLOO"] == "0"


def test_compiler_names():
    assert compilers(resolve("cpu", ["compiler_version=13"])) == ("gcc-13", "g++-13")
    assert compilers(resolve("cpu", ["compiler=clang"])) == ("clang", "clang++")


def test_format_env_quotes_for_a_shell():
    assert format_env({"A": "x y", "B": "8.0;9.0", "C": "plain"}) == "A='x y'\nB='8.0;9.0'\nC=plain"
