from __future__ import annotations

from torchbuild.profile.config import resolve, spec_from_dict
from torchbuild.runtime import environment
from torchbuild.runtime.environment import build_env, ccache_launcher, compilers, cuda_home, format_env


def test_cpu_env_has_no_cuda_and_uses_ccache():
    # in the image (which always has ccache): natively, ccache is used only where it is on PATH
    spec = resolve("cpu")
    env = build_env(spec, cache_root="/cache", jobs=3, backend="docker")
    assert env["USE_CUDA"] == "0"
    assert "TORCH_CUDA_ARCH_LIST" not in env and "CMAKE_CUDA_COMPILER_LAUNCHER" not in env
    assert env["CMAKE_C_COMPILER_LAUNCHER"] == env["CMAKE_CXX_COMPILER_LAUNCHER"] == "ccache"
    assert env["MAX_JOBS"] == "3"
    assert env["CCACHE_DIR"] == "/cache/ccache" and env["PIP_CACHE_DIR"] == "/cache/pip"
    assert env["PYTORCH_BUILD_VERSION"] == spec.torch_version  # the default: no local version
    assert (env["USE_DISTRIBUTED"], env["USE_GLOO"], env["USE_NCCL"], env["USE_MPI"]) == ("1", "1", "0", "0")


def test_cuda_env_carries_arch_list_nvcc_flags_and_launcher():
    spec = resolve("cuda", ["nvcc_threads=4", "local_version="])
    env = build_env(spec, cache_root="/c", jobs=1, backend="docker")
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    assert env["TORCH_NVCC_FLAGS"] == "-Xfatbin -compress-all --threads 4"
    assert env["CMAKE_CUDA_COMPILER_LAUNCHER"] == "ccache"
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    assert env["PYTORCH_BUILD_VERSION"] == spec.torch_version


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


# --------------------------------------------------------------------------- the loaded CUDA

MODULE_NVCC = "/glade/u/apps/common/23.08/spack/opt/cuda/12.2.1/bin/nvcc"


def _which(found: dict[str, str]):
    return lambda name: found.get(name)


def test_natively_cuda_home_follows_the_loaded_cuda_where_the_profile_only_inherits_it():
    # derecho extends cuda, whose cuda_home /usr/local/cuda is the nvidia/cuda image's: natively,
    # `module load cuda` put nvcc elsewhere, and the build must use that one (the known bug)
    spec = resolve("derecho")
    home, why = cuda_home(spec, "native", _which({"nvcc": MODULE_NVCC}))
    assert home == "/glade/u/apps/common/23.08/spack/opt/cuda/12.2.1" and MODULE_NVCC in why
    assert cuda_home(spec, "native", _which({}))[0] == "/usr/local/cuda"  # no nvcc: the profile's
    assert cuda_home(spec, "docker", _which({"nvcc": MODULE_NVCC}))[0] == "/usr/local/cuda"  # the image's
    assert cuda_home(spec, "apptainer", _which({"nvcc": MODULE_NVCC}))[0] == "/usr/local/cuda"


def test_a_profile_that_sets_cuda_home_itself_keeps_it_natively():
    nvcc = _which({"nvcc": MODULE_NVCC})
    assert cuda_home(resolve("cuda-offline"), "native", nvcc)[0] == "/usr"  # its own file says /usr
    assert cuda_home(resolve("cuda"), "native", nvcc)[0] == "/usr/local/cuda"
    assert cuda_home(resolve("derecho", ["cuda_home=/opt/cuda"]), "native", nvcc)[0] == "/opt/cuda"  # --set


def test_build_env_sets_cuda_home_and_cudacxx_from_the_loaded_cuda(monkeypatch):
    monkeypatch.setattr(environment.shutil, "which", _which({"nvcc": MODULE_NVCC, "ccache": "/usr/bin/ccache"}))
    env = build_env(resolve("derecho"), cache_root="/c", jobs=1, backend="native")
    assert env["CUDA_HOME"] == "/glade/u/apps/common/23.08/spack/opt/cuda/12.2.1"
    assert env["CUDACXX"] == MODULE_NVCC
    # the host's choice handed to the step (BuildRequest.cuda_home) wins over the step's own
    assert build_env(resolve("derecho"), cache_root="/c", jobs=1, cuda="/x")["CUDACXX"] == "/x/bin/nvcc"
    assert (
        build_env(resolve("derecho"), cache_root="/cache", jobs=1, backend="docker")["CUDA_HOME"] == "/usr/local/cuda"
    )


def test_a_spec_from_a_request_keeps_its_cuda_home():
    # a step's spec has no origins: the host decided, the request carries the decision
    spec = spec_from_dict(resolve("derecho").to_dict())
    assert cuda_home(spec, "native", _which({"nvcc": MODULE_NVCC}))[0] == "/usr/local/cuda"


# --------------------------------------------------------------------------- ccache only where it is


def test_natively_without_ccache_no_launcher(monkeypatch):
    monkeypatch.setattr(environment.shutil, "which", _which({}))
    env = build_env(resolve("cuda"), cache_root="/c", jobs=1, backend="native")
    assert not {k for k in env if k.endswith("_COMPILER_LAUNCHER")}
    # the image and the SIF install ccache: their builds keep it
    for backend in ("docker", "apptainer"):
        env = build_env(resolve("cuda"), cache_root="/cache", jobs=1, backend=backend)
        assert env["CMAKE_CXX_COMPILER_LAUNCHER"] == env["CMAKE_CUDA_COMPILER_LAUNCHER"] == "ccache"
    assert ccache_launcher("native", _which({"ccache": "/usr/bin/ccache"}))
    assert not ccache_launcher("native", _which({}))
