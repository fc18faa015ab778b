"""The GPU sites' profiles against their seeds (/work/shared/seeds: 001 Derecho's derecho-pytorch-mpi
recipe, 002 Bede's GH200 notes), gh200-offline, and the keys they brought: torch_version_modules
(modules by torch version) and aws_ofi_nccl_configure (the plugin's own configure options)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
from helpers import run_invoke, set_args

from torchbuild.builder.companion_table import pairing_problem
from torchbuild.core.arch import Arch
from torchbuild.core.errors import PathError, ProfileError
from torchbuild.profile.config import resolve
from torchbuild.runtime.environment import build_env, with_job_values

DERECHO = ["ncarenv/23.09", "gcc/12.2.0", "ncarcompilers", "cray-mpich/8.1.27", "cuda/12.2.1"]


def test_derecho_builds_with_the_recipes_compilers_flags_and_switches():
    """config_env.sh (benkirk/derecho-pytorch-mpi): CC=mpicc, CXXFLAGS="${CFLAGS}", BLAS=MKL,
    USE_CUDNN=1 with CUDNN_* from ${NCAR_ROOT_CUDNN}, USE_CUSPARSELT=1, USE_MAGMA left to PyTorch."""
    spec = resolve("derecho")
    env = with_job_values(build_env(spec, cache_root="/c", jobs=1), spec.env, {"NCAR_ROOT_CUDNN": "/glade/cudnn"})
    flags = "-Wno-maybe-uninitialized -Wno-uninitialized -Wno-nonnull"
    assert (env["CC"], env["CXX"], env["CFLAGS"], env["CXXFLAGS"]) == ("mpicc", "mpicxx", flags, flags)
    assert (env["BLAS"], env["USE_CUDNN"], env["USE_CUSPARSELT"]) == ("MKL", "1", "1") and "USE_MAGMA" not in env
    assert (env["CUDNN_LIBRARY"], env["CUDNN_LIB_DIR"]) == ("/glade/cudnn", "/glade/cudnn/lib")
    assert "CUDNN_INCLUDE_DIR" not in with_job_values(build_env(spec, cache_root="/c", jobs=1), spec.env, {})
    assert spec.runtime_env["MPICH_GPU_MANAGED_MEMORY_SUPPORT_ENABLED"] == "1"
    assert spec.runtime_env["MPICH_GPU_SUPPORT_ENABLED"] == "1"  # what the CUDA-aware MPI patch asks
    # 1.6.0's configure has no --with-gdrcopy: nothing is added to the plugin's configure
    assert spec.aws_ofi_nccl_configure == ()


def test_derechos_sif_runs_on_the_hosts_cray_mpich():
    """host_mpi: cray-mpich's MPICH-ABI libraries (and Cray PE's lib64, libfabric) first on the
    SIF's LD_LIBRARY_PATH, not the image's MPICH."""
    spec = resolve("derecho")
    assert spec.host_mpi[0] == "/opt/cray/pe/mpich/8.1.27/ofi/gnu/9.1/lib-abi-mpich"
    assert "cray-mpich/8.1.27" in spec.runtime_modules and spec.libfabric_prefix + "/lib64" in spec.host_mpi


@pytest.mark.parametrize("series", ["2.3", "2.4"])
def test_the_cuda_aware_mpi_patch_says_where_it_differs_from_the_seeds(series):
    from torchbuild.profile.config import data_dir

    text = (data_dir() / "patches" / "pytorch" / series / "01-cuda-aware-mpi-fallback.patch").read_text()
    header = " ".join(text.split("diff --git", 1)[0].split())
    assert "derecho-pytorch-mpi" in header and "*assuming* the MPI is CUDA-aware" in header
    assert "the derecho profile's runtime_env sets, so on Derecho the answer is the seed's" in header


@pytest.mark.parametrize(("torch", "cudnn"), [("2.3.1", "cudnn/8.8.1.3-12"), ("2.4.0", "cudnn/9.2.0.82-12")])
def test_derecho_loads_the_cudnn_module_of_its_torch_version(torch, cudnn):
    spec = resolve("derecho", [f"torch_version={torch}"])
    assert spec.modules == (*DERECHO, cudnn) and spec.runtime_modules == (*DERECHO, cudnn)
    assert build_env(spec, cache_root="/c", jobs=1)["PYTORCH_BUILD_VERSION"] == f"{torch}+derecho"
    assert not pairing_problem("torchvision", torch)


def test_derecho_defaults_to_the_recipes_torch_and_a_version_without_an_entry_adds_no_module():
    assert resolve("derecho").torch_version == "2.3.1"
    assert resolve("derecho", ["torch_version=2.6.0"]).modules == tuple(DERECHO)


def test_derechos_job_is_the_recipes_gpu_node_for_four_hours(tmp_path):
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    args = ["submit", "--profile", "derecho", "--engine", "native", "--dry-run", "--account", "NCAR0001"]
    res = run_invoke(*args, "--source", str(tree), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert "#PBS -l select=1:ncpus=64:ngpus=4:gpu_type=a100" in res.stdout
    assert "#PBS -l walltime=04:00:00" in res.stdout
    # config_env.sh: `module --force purge` (ncarenv is sticky), then its modules
    purge = "\nmodule --force purge\nmodule load " + " ".join([*DERECHO, "cudnn/8.8.1.3-12"]) + "\n"
    assert purge in res.stdout


def test_a_full_release_entry_wins_over_its_line_and_module_names_are_checked():
    table = '{"2.4": cudnn/9.2.0.82-12, "2.4.1": cudnn/9.3 nccl/2.21}'
    spec = resolve("cpu", [f"torch_version_modules={table}", "torch_version=2.4.1", "modules=[gcc, cudnn/9.3]"])
    assert spec.modules == ("gcc", "cudnn/9.3", "nccl/2.21")
    for bad in ('{"2.4": "cudnn;rm -rf"}', '{"2.4": " "}'):
        with pytest.raises(ProfileError, match=r"torch_version_modules.*not a list of module names"):
            resolve("cpu", [f"torch_version_modules={bad}"])
    with pytest.raises(ProfileError, match="torch_version_modules"):
        resolve("cpu", ['torch_version_modules={"two": cudnn}'])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["aws_ofi_nccl_configure=[--with-gdrcopy]"], "aws_ofi_nccl_version is empty"),
        (["aws_ofi_nccl_configure=[--prefix=/x]"], "--prefix is passed by torchbuild itself"),
        (["aws_ofi_nccl_configure=[--with-libfabric=/opt/x]"], "--with-libfabric is passed by torchbuild"),
        (["aws_ofi_nccl_configure=['--enable-trace; rm -rf /']"], "malformed"),
        (["aws_ofi_nccl_configure=[enable-trace]"], "malformed"),
    ],
)
def test_plugin_configure_options_are_checked(sets, message):
    base = [] if "empty" in message else ["switches.USE_MAGMA=0"]
    profile = "cpu" if "empty" in message else "derecho"
    with pytest.raises(ProfileError, match=message):
        resolve(profile, [*base, *sets])


def test_derecho_takes_plugin_configure_options():
    assert resolve("derecho", ["aws_ofi_nccl_configure=[--enable-trace]"]).aws_ofi_nccl_configure == ("--enable-trace",)


def test_bede_loads_the_seeds_modules_and_asks_for_no_library_no_module_provides():
    spec = resolve("bede")
    assert spec.modules == ("gcc/12.2", "openmpi/4.1.6", "cuda/12.3.2", "openblas/0.3.26")
    assert spec.runtime_modules == spec.modules
    env = build_env(spec, cache_root="/c", jobs=1)
    assert (env["USE_NCCL"], env["USE_SYSTEM_NCCL"], env["USE_CUDNN"]) == ("1", "0", "0")
    assert spec.arch is Arch.AARCH64 and env["TORCH_CUDA_ARCH_LIST"] == "9.0"


def test_gh200_offline_is_gh200_on_debians_arm64_cuda():
    gh200, offline = resolve("gh200"), resolve("gh200-offline")
    assert offline.arch is Arch.AARCH64 and offline.base_image == "torchbuild/base:trixie-aarch64"
    assert (offline.cuda_version, offline.cuda_home, offline.compiler_version) == ("12.4", "/usr", "13")
    assert offline.cuda_packages == ("nvidia-cuda-toolkit", "libnccl-dev") and offline.nccl == "system"
    # the gh200 flags, switches and canary, from the one place they are written
    for key in ("cxxflags", "ldflags", "cuda_arch_list", "canaries", "blas"):
        assert getattr(offline, key) == getattr(gh200, key), key
    env = build_env(offline, cache_root="/c", jobs=1)
    assert (env["CUDA_HOME"], env["CUDACXX"], env["CC"]) == ("/usr", "/usr/bin/nvcc", "gcc-13")
    assert (env["USE_CUDNN"], env["USE_PRIORITIZED_TEXT_FOR_LD"], env["USE_SYSTEM_NCCL"]) == ("0", "1", "1")
    assert offline.image_tag == "torchbuild/toolchain:gh200-offline-2.13.0-aarch64"  # the newest line CUDA 12.4 builds


# -------------------------------------------------------------------- ARCHER2 (seed 003): /work, not /home


def _archer2_submit(tmp_path, *sets: str, source=None, out=None):
    tree = source or tmp_path / "pytorch"
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "setup.py").write_text("")
    args = ["submit", "--profile", "archer2", "--engine", "native", "--dry-run", "--account", "t01"]
    args += ["--source", str(tree), "--out", str(out or tmp_path / "out")]
    return run_invoke(*args, *set_args(list(sets)))


def test_archer2_asks_for_the_projects_work_directory_before_a_job(tmp_path):
    """The compute nodes do not mount /home, where the default cache_dir (~/.cache/torchbuild)
    is: the profile leaves the project's /work path to the user, and submit asks for it."""
    res = _archer2_submit(tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "profile archer2 needs cache_dir from you: a directory of your project on /work" in res.stderr
    assert "--set cache_dir=" in res.stderr
    res = _archer2_submit(tmp_path, f"cache_dir={tmp_path / 'work' / 'cache'}")
    assert res.returncode == 0, res.stderr


def test_archer2_refuses_a_job_whose_cache_source_or_out_is_under_home(tmp_path):
    res = _archer2_submit(tmp_path, "cache_dir=/home/t01/t01/me/.cache/torchbuild")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "cache_dir /home/t01/t01/me/.cache/torchbuild is under /home, which the compute nodes" in res.stderr
    # a stand-in for /home (this host's own): the source tree and --out are checked the same way
    home = tmp_path / "home"
    sets = (f"cache_dir={tmp_path / 'work'}", f"unmounted_dirs=[{home}]")
    res = _archer2_submit(tmp_path, *sets, source=home / "me" / "pytorch")
    assert res.returncode != 0 and f"--source {home}/me/pytorch is under {home}" in res.stderr
    res = _archer2_submit(tmp_path, *sets, out=home / "me" / "out")
    assert res.returncode != 0 and f"--out {home}/me/out is under {home}" in res.stderr
    link = tmp_path / "work-link"
    link.symlink_to(home, target_is_directory=True)
    (home / "o").mkdir(parents=True)
    res = _archer2_submit(tmp_path, *sets, out=link / "o")  # resolved too
    assert res.returncode != 0 and "is under" in res.stderr


def test_the_jobs_python_and_torchbuild_are_checked_against_unmounted_dirs():
    from torchbuild.batch.jobplaces import check_mounted, runtime_places

    places = dict((what, path) for what, path, _ in runtime_places(resolve("archer2")))
    assert places["the job's Python"] == sys.executable and Path(places["torchbuild"], "__init__.py").is_file()
    spec = resolve("archer2", [f"unmounted_dirs=[{Path(sys.executable).parent}]"])
    with pytest.raises(PathError, match=r"the job's Python .* is under .*compute nodes of profile archer2") as err:
        check_mounted(spec, runtime_places(spec))
    assert "venv on a file system the compute nodes mount" in (err.value.hint or "")


def test_required_names_keys_of_the_profile():
    with pytest.raises(
        ProfileError, match=r"'required': 'cach_dir' is no key a user could set; did you mean 'cache_dir'"
    ):
        resolve("cpu", ["required={cach_dir: a place}"])


def test_submit_makes_the_native_build_venv_on_the_login_node_before_the_job(tmp_path, monkeypatch):
    """Compute nodes may not reach PyPI: the venv the job's build uses (same Python, same tree,
    same cache: the same key) is made where submit runs, before sbatch."""
    from torchbuild.batch import jobplaces
    from torchbuild.batch.host import Runtime, submit_build
    from torchbuild.builder.host import BuildVenv
    from torchbuild.runtime.options import BuildOptions

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/submitted\necho 42\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    calls = []

    def ensure(spec, source, cache_root, python, log):
        calls.append((source, cache_root, python, (tmp_path / "submitted").exists()))
        return BuildVenv(Path(cache_root) / "buildenv" / "k", "k", True, 1.0, {"cmake": "3.31.6"})

    monkeypatch.setattr(jobplaces, "ensure", ensure)  # the name batch/jobplaces.py calls (builder.host's)
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    spec = resolve("archer2", [f"cache_dir={tmp_path / 'cache'}"])
    out = io.StringIO()
    submitted = submit_build(
        spec, Runtime("native"), source=str(tree), ref="", out_dir=str(tmp_path / "out"),
        options=BuildOptions(), verify=True, out=out,
    )  # fmt: skip
    assert submitted is not None and submitted.job_id == "42"
    assert calls == [(str(tree), str(tmp_path / "cache"), sys.executable, False)]
    assert "build venv: made here in 1 s" in out.getvalue() and "its node needs no PyPI" in out.getvalue()
    calls.clear()
    spec = resolve("archer2", [f"cache_dir={tmp_path / 'cache'}", "build_venv=false"])
    submit_build(
        spec, Runtime("native"), source=str(tree), ref="", out_dir=str(tmp_path / "out2"),
        options=BuildOptions(), verify=True, out=io.StringIO(),
    )  # fmt: skip
    assert calls == []


# -------------------------------------------------------------------- Quansight's guide (seed 000)


@pytest.mark.parametrize(
    ("torch", "python", "need"),
    [
        ("2.6.0", "3.8", "3.9"),  # the guide's python=3.8 with today's torch
        ("2.9.0", "3.9", "3.10"),
        ("2.4.1", "3.8", ""),
        ("2.5.1", "3.8", ""),  # 2.5's setup.py still takes 3.8 (its wheels start at 3.9)
        ("1.13.1", "3.7", ""),
        ("2.6.0", "3.13", ""),
    ],
)
def test_python_version_is_refused_at_config_below_what_its_torch_accepts(torch, python, need):
    sets = [f"torch_version={torch}", f"python_version={python}"]
    if not need:
        assert resolve("cpu", sets, arch="x86_64").python_version == python
        return
    with pytest.raises(ProfileError, match=r"key 'python_version': Python ") as err:
        resolve("cpu", sets, arch="x86_64")
    assert f"it needs Python >= {need}" in err.value.message and f"PyTorch {torch[:3]} accepts" in err.value.message
    assert f"set python_version to {need} or newer" in (err.value.hint or "")
    with pytest.raises(ProfileError, match=rf"key 'python_versions': Python {python} is older"):
        resolve("cpu", [f"torch_version={torch}", f"python_versions=['3.12', '{python}']"], arch="x86_64")
    res = run_invoke("config", "--arch", "x86_64", *set_args(sets))
    assert res.returncode != 0 and f"needs Python >= {need}" in res.stderr and "Traceback" not in res.stderr
