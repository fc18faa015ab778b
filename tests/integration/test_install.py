"""After the build, with the real parts: `invoke install` in the toolchain image from real wheels
(Debian's python3-torch 2.6 packed as a wheel, and the minitorch fixture), mpi4py compiled
from its PyPI sdist against the image's Open MPI and run with mpirun -n 2, the activate script,
real Lmod and real Environment Modules loading the modulefiles, a wheelhouse used by pip, and a
SIF run with another MPICH-ABI build bound in from outside."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from helpers import CALLER, FIXTURES, TEST_TORCH, TORCH_PROFILE, run_in, run_invoke, set_args

from torchbuild.runtime.manifest import read_install

pytestmark = pytest.mark.docker

RUNTIME_ENV = {
    "NCCL_NET": "AWS Libfabric",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "TB_QUOTED": "it's $HOME; `x`",
}
OMPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture(scope="module")
def wheels(engine, torch_image, debian_torch_wheel, cpu_image, site_overrides, tmp_path_factory):
    """(Debian's torch packed as a wheel, the minitorch fixture wheel built in the cpu image)."""
    out = tmp_path_factory.mktemp("wheels")
    torch_wheel = Path(shutil.copy(debian_torch_wheel, out))
    tree = tmp_path_factory.mktemp("src") / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    res = run_invoke(
        "build", "--in-container", "--profile", "cpu", "--arch", "x86_64", "--source", str(tree), "--out", str(out),
        "--no-verify", *set_args([TEST_TORCH, *site_overrides, "patches=none", "local_version=tbtest"]),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    (mini,) = out.glob("minitorch-2.6.0+tbtest-cp313-*.whl")
    return torch_wheel, mini


@pytest.fixture(scope="module")
def installed(torch_image, wheels, tmp_path_factory):
    """`invoke install --in-container` of both wheels with runtime_env, mpi4py 4.0.3 and a module
    dependency; returns (spec, prefix, the command's result)."""
    spec, sets = torch_image
    torch_wheel, mini = wheels
    prefix = tmp_path_factory.mktemp("envs") / "torch-2.6"
    out = tmp_path_factory.mktemp("install-out")
    runtime = [
        f"runtime_env={json.dumps(RUNTIME_ENV)}",
        "runtime_packages=[mpi4py==4.0.3, six]",
        "runtime_modules=[tbdep/1.0]",
    ]
    res = run_invoke(
        "install", "--in-container", "--profile", TORCH_PROFILE, "--prefix", str(prefix), "--out", str(out),
        "--wheel", str(torch_wheel), "--wheel", str(mini), *set_args([TEST_TORCH, *sets, *runtime]), timeout=1800,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    assert not list(out.glob(".partial-*")), "the staged wheelhouse was left behind"
    return spec, prefix, res


def test_install_in_the_image_with_mpi4py_and_activate(engine, installed):
    spec, prefix, res = installed
    m = read_install(prefix / "torchbuild-install.json")
    frozen = set(m.frozen)
    assert {"torch==2.6.0+debian", "minitorch==2.6.0+tbtest", "mpi4py==4.0.3", "six==1.17.0"} <= frozen, frozen
    assert m.engine == "docker" and m.python_version.startswith("3.13") and m.module == "torch/2.6.0-debian"
    # mpi4py was compiled against the image's Open MPI
    assert m.mpi is not None and m.mpi.mpicc.endswith("mpicc") and "Open MPI" in m.mpi.library_version
    assert "import torch: 2.6.0+debian" in res.stdout and "building mpi4py==4.0.3 from source" in res.stdout
    script = f"""
        export NCCL_NET=before
        source {prefix}/bin/activate
        python -c 'import torch, minitorch, sys; print("py", sys.prefix, torch.__version__, minitorch.add(2, 3))'
        printf 'in:%s|%s|%s\\n' "$NCCL_NET" "$FI_CXI_DEFAULT_CQ_SIZE" "$TB_QUOTED"
        deactivate
        printf 'out:%s|%s\\n' "$NCCL_NET" "${{FI_CXI_DEFAULT_CQ_SIZE-unset}}"
        # two ranks sum their rank + 1 through mpi4py and the image's Open MPI
        mpirun -n 2 --oversubscribe {prefix}/bin/python -c \
          'from mpi4py import MPI; c = MPI.COMM_WORLD; print("sum", c.rank, c.allreduce(c.rank + 1))'
    """
    logs = run_in(engine, spec.image_tag, script, {str(prefix): str(prefix)}, env=OMPI_AS_ROOT)
    assert f"py {prefix} 2.6.0+debian 5.0" in logs
    assert f"in:{RUNTIME_ENV['NCCL_NET']}|131072|{RUNTIME_ENV['TB_QUOTED']}" in logs, logs
    assert "out:before|unset" in logs, logs
    assert sorted(ln for ln in logs.splitlines() if ln.startswith("sum ")) == ["sum 0 3", "sum 1 3"], logs


MODULE_SYSTEMS = {
    # name: (apt package, init script, a modulefile for the dependency tbdep/1.0)
    "lmod": ("lmod", "/usr/share/lmod/lmod/init/bash", ("1.0.lua", 'setenv("TBDEP", "loaded")\n')),
    "environment-modules": (
        "environment-modules",
        "/usr/share/modules/init/bash",
        ("1.0", "#%Module1.0\nsetenv TBDEP loaded\n"),
    ),
}


def module_image(engine, base_tag: str, package: str) -> str:
    """base_tag with the module system installed (Lmod and Environment Modules conflict in
    Debian, so each gets its own image; Docker's layer cache makes this instant the next time)."""
    tag = f"torchbuild-test/modules:{package}"
    dockerfile = f"FROM {base_tag}\nUSER 0\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package} >/dev/null\n"
    engine.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    return tag


@pytest.mark.parametrize("system", sorted(MODULE_SYSTEMS))
def test_modulefiles_load_and_unload(engine, installed, tmp_path, system):
    spec, prefix, _ = installed
    package, init, (dep_file, dep_text) = MODULE_SYSTEMS[system]
    tag = module_image(engine, spec.image_tag, package)
    deps = tmp_path / "deps" / "tbdep"
    deps.mkdir(parents=True)
    (deps / dep_file).write_text(dep_text)
    script = f"""
        source {init}
        export NCCL_NET=before
        module use {tmp_path}/deps
        module use {prefix}/modulefiles
        module load torch/2.6.0-debian
        python -c 'import sys, torch; print("torch", torch.__version__, sys.prefix)'
        printf 'loaded:%s|%s|%s\\n' "$NCCL_NET" "$TB_QUOTED" "$TBDEP"
        module unload torch
        printf 'unloaded:%s|%s|%s|%s\\n' "$NCCL_NET" "${{TB_QUOTED-unset}}" "${{TBDEP-unset}}" "$(command -v python)"
    """
    logs = run_in(engine, tag, script, {str(prefix): str(prefix), str(tmp_path): str(tmp_path)})
    assert f"torch 2.6.0+debian {prefix}" in logs, logs
    assert f"loaded:AWS Libfabric|{RUNTIME_ENV['TB_QUOTED']}|loaded" in logs, logs
    # pushenv puts NCCL_NET back; the dependency is unloaded with torch; python is the image's again
    assert "unloaded:before|unset|unset|/opt/venv/bin/python" in logs, logs


def test_wheelhouse_serves_pip_and_refuses_mixed_local_versions(engine, torch_image, wheels, tmp_path):
    spec, _ = torch_image
    torch_wheel, mini = wheels
    house = tmp_path / "house"
    res = run_invoke("wheelhouse", "--dest", str(house), "--wheel", str(torch_wheel), "--wheel", str(mini))
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in house.glob("*.whl")) == sorted([torch_wheel.name, mini.name])
    other = tmp_path / mini.name.replace("+tbtest", "+other")
    shutil.copy(mini, other)
    res = run_invoke("wheelhouse", "--dest", str(house), "--wheel", str(other))
    assert res.returncode == 23 and "WheelhouseConflict" in res.stderr and "Traceback" not in res.stderr
    assert not (house / other.name).exists()
    # a fresh venv (seeing Debian's Python packages for torch's dependencies) installs both from it
    script = f"""
        python3 -m venv --system-site-packages /tmp/v
        /tmp/v/bin/pip install -q --no-index --no-deps --ignore-installed --find-links {house} torch minitorch
        /tmp/v/bin/python -c 'import torch, minitorch; print("from", torch.__file__, minitorch.__version__)'
        python3 -m venv /tmp/w
        /tmp/w/bin/pip install -q --index-url file://{house}/simple minitorch
        /tmp/w/bin/python -c 'import minitorch; print("simple", minitorch.__version__)'
    """
    logs = run_in(engine, spec.image_tag, script, {str(house): str(house)}, env={"PIP_CONFIG_FILE": "/dev/null"})
    assert "from /tmp/v/lib/python3.13/site-packages/torch/__init__.py 2.6.0+tbtest" in logs, logs
    assert "simple 2.6.0+tbtest" in logs, logs


@pytest.fixture(scope="module")
def bookworm_mpich(engine, local_base, test_cache):
    """Debian bookworm's MPICH 4.0.2 library (libmpich12), unpacked on the host: another
    MPICH-ABI build than the trixie image's 4.2.1, standing in for a site's cray-mpich."""
    dest = test_cache / "bookworm-mpich"
    lib = dest / "lib"
    if not (lib / "libmpi.so.12").exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        script = (
            "set -e; echo 'deb http://deb.debian.org/debian bookworm main' > /etc/apt/sources.list.d/bookworm.list; "
            "apt-get update -qq; cd /tmp; apt-get download -qq libmpich12/bookworm; dpkg -x libmpich12_*.deb x; "
            "mkdir -p /dest/lib; cp -a x/usr/lib/x86_64-linux-gnu/libmpich.so.12* /dest/lib/; "
            "ln -s $(basename $(readlink -f /dest/lib/libmpich.so.12)) /dest/lib/libmpi.so.12; "
            f"chown -R {CALLER} /dest"
        )
        engine.client.containers.run(
            local_base, ["bash", "-c", script], volumes={str(dest): {"bind": "/dest", "mode": "rw"}}, remove=True
        )
    return lib


def test_sif_uses_the_host_mpi_bound_in(cpu_sif, bookworm_mpich, tmp_path):
    """The cpu SIF's MPICH 4.2.1 (trixie), then bookworm's 4.0.2 bound over it through the ABI."""
    _, sif, _, _, sets = cpu_sif
    base = [
        "mpi-check", "--in-container", "--engine", "apptainer", "--apptainer", "docker", "--sif", str(sif),
        "--profile", "cpu", "--arch", "x86_64", "--out", str(tmp_path), *set_args(sets),
    ]  # fmt: skip
    own = run_invoke(*base)
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr
    assert (
        "MPICH Version:" in own.stdout and "4.2.1" in own.stdout and "/usr/lib/x86_64-linux-gnu/libmpich" in own.stdout
    )

    bound = run_invoke(*base, "--host-mpi", str(bookworm_mpich))
    assert bound.returncode == 0, bound.stdout[-3000:] + bound.stderr
    version = next(ln for ln in bound.stdout.splitlines() if ln.startswith("MPI_Get_library_version: "))
    assert "4.0.2" in version and "4.2.1" not in version, bound.stdout[-2000:]
    assert f"in use (from {bookworm_mpich})" in bound.stdout and str(bookworm_mpich / "libmpich.so.12") in bound.stdout

    empty = tmp_path / "no-mpi-here"
    empty.mkdir()
    wrong = run_invoke(*base, "--host-mpi", str(empty))
    assert wrong.returncode == 14 and "VerifyFailed" in wrong.stderr and "NOT in use" in wrong.stdout, wrong.stdout[
        -2000:
    ]


def test_sif_environment_keeps_runtime_env_apart(cpu_sif):
    """%environment has the profile's runtime_env after the build's, values literal."""
    _, sif, _, apptainer, _ = cpu_sif
    buf = io.StringIO()
    rc = apptainer.call(
        ["exec", *apptainer.run_flags, "--cleanenv", str(sif), "sh", "-c",
         'printf "%s|%s|%s\\n" "$NCCL_SOCKET_IFNAME" "$TB_RUNTIME_CHECK" "$CC"; cat /.singularity.d/env/90-environment.sh'],
        paths=[sif.parent], out=buf,
    )  # fmt: skip
    text = buf.getvalue()
    assert rc == 0, text
    assert "hsn|two words; $HOME stays literal|gcc" in text, text
    assert text.index("# the build's environment") < text.index("# runtime_env:"), text


def test_install_failure_leaves_nothing(torch_image, wheels, tmp_path):
    """A runtime package that does not exist: InstallFailed (22), no prefix, no staged wheels."""
    _, sets = torch_image
    _, mini = wheels
    prefix, out = tmp_path / "env", tmp_path / "out"
    res = run_invoke(
        "install", "--in-container", "--profile", TORCH_PROFILE, "--prefix", str(prefix), "--out", str(out),
        "--wheel", str(mini), *set_args([TEST_TORCH, *sets, "runtime_packages=[no-such-package-tb]"]),
    )  # fmt: skip
    assert res.returncode == 22 and "InstallFailed" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "no-such-package-tb" in res.stdout
    assert not prefix.exists() and not list(out.glob(".partial-*"))
