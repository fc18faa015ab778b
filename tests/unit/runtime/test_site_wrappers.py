"""ARCHER2's way of building and installing, without containers: the compilers key (Cray's
cc/CC/ftn wrappers as CC/CXX/FC), a value of env taken from the build step's environment
(INTEL_MKL_DIR: ${MKLROOT}), runtime_packages entries with their own pip options and a check
command (horovod's --no-build-isolation and `horovodrun --check-build`), and an install over a
module's Python (install_python, install_system_site_packages). The installs are real: a venv,
pip offline, and a package whose build needs the environment it is installed into."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO, make_wheel

from torchbuild.core.errors import ProfileError
from torchbuild.install.step import option_packages, other_packages
from torchbuild.profile.config import RuntimePackage, profile_text, resolve, spec_from_dict
from torchbuild.runtime.compile_job import toolchain_versions
from torchbuild.runtime.environment import build_env, compiler_commands, with_job_values
from torchbuild.runtime.manifest import INSTALL_MANIFEST, read_install

TORCHBUILD = Path(sys.executable).with_name("torchbuild")
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
needs_python = pytest.mark.skipif(
    shutil.which(f"python{PYVER}") is None, reason=f"python{PYVER} is not on PATH (the install makes its venv from it)"
)


# --------------------------------------------------------------------------- compilers


def test_archer2_builds_with_the_cray_wrappers_and_its_recipes_switches():
    env = build_env(resolve("archer2"), cache_root="/c", jobs=1)
    assert (env["CC"], env["CXX"], env["FC"]) == ("cc", "CC", "ftn")
    assert (env["USE_MKL"], env["BUILD_CAFFE2"], env["MKL_THREADING"], env["BLAS"]) == ("1", "0", "SEQ", "MKL")
    assert env["INTEL_MKL_DIR"] == "${MKLROOT}"  # filled in where the build runs, not here
    assert "cmake/3.21.3" in resolve("archer2").modules


def test_compiler_family_stays_the_default_and_a_role_left_out_comes_from_it():
    plain = build_env(resolve("cpu", ["compiler_version=13"]), cache_root="/c", jobs=1)
    assert (plain["CC"], plain["CXX"]) == ("gcc-13", "g++-13") and "FC" not in plain
    mixed = resolve("cpu", ["compiler=clang", "compilers={cxx: /opt/cray/pe/bin/CC}"])
    assert compiler_commands(mixed) == {"CC": "clang", "CXX": "/opt/cray/pe/bin/CC"}


@pytest.mark.parametrize(
    "value, fragment",
    [
        ('{cc: "cc -O2"}', "cc: 'cc -O2' is not a program name or an absolute path"),
        ('{cxx: "CC;id"}', "is not a program name"),
        ("{cc: relative/cc}", "is not a program name"),
        ('{cc: "$CC"}', "is not a program name"),
        ("{ld: ld.gold}", "entry name 'ld' is not allowed"),
    ],
)
def test_compilers_must_be_program_names_or_absolute_paths(value, fragment):
    with pytest.raises(ProfileError, match="key 'compilers'") as err:
        resolve("cpu", [f"compilers={value}"])
    assert fragment in err.value.message


def test_the_recorded_toolchain_is_the_wrapper_the_build_runs(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("cc", "CC"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho 'Cray wrapper {name} over gcc'\n")
        (bin_dir / name).chmod(0o755)
    spec = resolve("archer2")
    versions = toolchain_versions(spec, {"PATH": str(bin_dir)})
    assert (versions["cc"], versions["cxx"]) == ("Cray wrapper cc over gcc", "Cray wrapper CC over gcc")


# --------------------------------------------------------------------------- values from the job


def test_env_values_naming_a_variable_are_filled_in_where_the_build_runs_never_by_a_shell():
    profile_env = {"INTEL_MKL_DIR": "${MKLROOT}", "X_LIB": "${MKLROOT}/lib:${MISSING_TB}", "PLAIN": "$HOME"}
    env = {**profile_env, "CC": "cc"}
    done = with_job_values(env, profile_env, {"MKLROOT": "/opt/intel/$(id)", "HOME": "/h"})
    assert done == {"INTEL_MKL_DIR": "/opt/intel/$(id)", "PLAIN": "$HOME", "CC": "cc"}
    # unset where the build runs: left out, so PyTorch's own default applies
    assert "INTEL_MKL_DIR" not in with_job_values(env, profile_env, {})


# --------------------------------------------------------------------------- runtime_packages


HOROVOD = {
    "requirement": "horovod[pytorch]==0.28.1",
    "pip_args": ["--no-build-isolation", "--no-cache-dir"],
    "env": {"HOROVOD_WITH_MPI": 1, "HOROVOD_CPU_OPERATIONS": "MPI", "CC": "cc"},
    "check": ["horovodrun", "--check-build"],
}


def test_a_runtime_package_with_options_survives_every_form_the_spec_takes():
    spec = resolve("cpu", [f"runtime_packages=[numpy<2, {yaml.safe_dump(HOROVOD, default_flow_style=True).strip()}]"])
    entry = spec.runtime_packages[1]
    assert isinstance(entry, RuntimePackage) and entry.environ["HOROVOD_WITH_MPI"] == "1"
    assert other_packages(spec) == ["numpy<2"] and option_packages(spec) == [entry]
    assert spec_from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["runtime_packages"][1]["check"] == ["horovodrun", "--check-build"]
    again = yaml.safe_load(profile_text(spec))["runtime_packages"]
    assert again[1]["env"]["HOROVOD_WITH_MPI"] == "1"


def test_archer2_carries_epccs_horovod_entry_ready_to_uncomment():
    """The default install stops at nothing (horovod 0.28.1 cannot build against torch 2.6);
    the seed's entry, uncommented from the profile, resolves to exactly what EPCC runs."""
    assert option_packages(resolve("archer2")) == []
    text = (REPO / "configs" / "profiles" / "archer2.yaml").read_text()
    block = re.search(r"^# - requirement: .*?^#   check: .*?$", text, re.M | re.S)
    assert block, "the archer2 profile lost its commented horovod entry"
    entry_yaml = "\n".join(line[1:] for line in block[0].splitlines())
    entry = yaml.safe_load(entry_yaml)[0]
    spec = resolve("archer2", [f"runtime_packages=[mpi4py, {yaml.safe_dump(entry, default_flow_style=True).strip()}]"])
    (horovod,) = option_packages(spec)
    assert horovod.requirement == "horovod[pytorch]==0.28.1"
    assert horovod.pip_args == ("--no-build-isolation", "--no-cache-dir")
    assert horovod.check == ("horovodrun", "--check-build")
    assert horovod.environ["HOROVOD_WITH_PYTORCH"] == "1" and horovod.environ["CXX"] == "CC"


def test_the_sites_compiler_wrappers_are_used_natively_and_the_images_compilers_in_a_container():
    spec = resolve("archer2")
    assert compiler_commands(spec) == {"CC": "cc", "CXX": "CC", "FC": "ftn"}
    for backend in ("docker", "apptainer"):
        env = build_env(spec, cache_root="/cache", jobs=1, backend=backend)
        assert (env["CC"], env["CXX"]) == ("gcc", "g++") and "FC" not in env, backend


@pytest.mark.parametrize(
    "entry, fragment",
    [
        ("{requirement: x, pip_args: [--index-url=https://evil.example/simple]}", "is not a pip option"),
        ("{requirement: x, pip_args: [--target, /tmp]}", "is not a pip option"),
        ("{requirement: x, pip_args: [--no-binary]}", "write --no-binary=VALUE"),
        ("{requirement: x, pip_args: ['--no-binary=:all: -e .']}", "write --no-binary=VALUE"),
        ("{requirement: x, env: {'A B': 1}}", "env name 'A B' is not a variable name"),
        ("{requirement: x, check: ['horovodrun --check-build']}", "is not a program name or absolute path"),
        ("{requirement: x, check: []}", "check must be an argv"),
        ("{requirement: 'x; rm -rf /'}", "is not a pip requirement"),
        ("{requirement: x, shell: true}", "entry field 'shell' is not known"),
        ("{pip_args: [--no-deps]}", "needs requirement"),
    ],
)
def test_runtime_package_options_are_checked(entry, fragment):
    with pytest.raises(ProfileError, match="key 'runtime_packages'") as err:
        resolve("cpu", [f"runtime_packages=[{entry}]"])
    assert fragment in err.value.message


def test_allowed_pip_options_with_a_value():
    spec = resolve("cpu", ["runtime_packages=[{requirement: x, pip_args: ['--no-binary=:all:', --pre]}]"])
    assert option_packages(spec)[0].pip_args == ("--no-binary=:all:", "--pre")


# --------------------------------------------------------------------------- real installs


def _install(tmp: Path, wheel: Path, *sets: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # this machine's find-links and indexes
    env["PIP_CONFIG_FILE"] = os.devnull
    args = [str(TORCHBUILD), "install", "--prefix", str(tmp / "env"), "--wheel", str(wheel), "--out", str(tmp / "out")]
    args += ["--set", f"python_version={PYVER}", "--set", f"cache_dir={tmp / 'cache'}", "--no-index", *extra]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=300, check=False)


def _needs_env_entry(tmp: Path, with_mpi: str, pip_args: str = "[--no-build-isolation, --no-cache-dir]") -> str:
    source = tmp / "needs_no_isolation"
    if not source.exists():
        shutil.copytree(FIXTURES / "needs_no_isolation", source)
    return (
        f"runtime_packages=[{{requirement: 'tb-needs-env @ {source.as_uri()}', pip_args: {pip_args}, "
        f"env: {{TB_WITH_MPI: '{with_mpi}', CC: cc}}, check: [tb-needs-env-check]}}]"
    )


@needs_python
def test_a_package_that_needs_the_environment_installs_without_build_isolation_and_its_check_is_recorded(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    done = _install(tmp_path, wheel, _needs_env_entry(tmp_path, "1"), "install_system_site_packages=true")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    manifest = read_install(tmp_path / "env" / INSTALL_MANIFEST)
    (record,) = manifest.packages
    assert record.pip_args == ("--no-build-isolation", "--no-cache-dir") and record.check == ("tb-needs-env-check",)
    assert record.env == {"TB_WITH_MPI": "1", "CC": "cc"}
    assert "[X] MPI" in record.check_output and "built against tb_tiny 0.1.0 with CC=cc" in record.check_output
    assert manifest.runtime_packages[0].startswith("tb-needs-env @ file://")
    # the venv extends its interpreter's own packages, as a venv over cray-python does
    assert manifest.system_site_packages
    assert "include-system-site-packages = true" in (tmp_path / "env" / "pyvenv.cfg").read_text()


@needs_python
def test_a_failing_check_fails_the_install_with_its_output_and_leaves_nothing(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    done = _install(tmp_path, wheel, _needs_env_entry(tmp_path, "0"))
    assert done.returncode == 22, done.stdout[-3000:] + done.stderr
    assert "error: InstallFailed: the check of tb-needs-env @ file://" in done.stderr
    assert "[ ] MPI" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "env").exists()


@needs_python
def test_without_no_build_isolation_the_same_package_does_not_build(tmp_path):
    """The pip_args reach pip: the package's build imports tb_tiny, which only the environment has."""
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    done = _install(tmp_path, wheel, _needs_env_entry(tmp_path, "1", pip_args="[--no-cache-dir]"))
    assert done.returncode == 22, done.stdout[-3000:] + done.stderr
    assert "No module named 'tb_tiny'" in done.stdout + done.stderr
    assert "installing tb-needs-env @ file://" in done.stderr


def test_install_python_must_be_the_python_the_wheels_were_built_for(tmp_path):
    """install_python names the module's python3 (cray-python's); a wheel for another Python
    would not import there: a named error before anything is made."""
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{Path(sys._base_executable).resolve()}" "$@"\n')
    shim.chmod(0o755)
    other = "3.99"
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", f"cp399-cp399-linux_{platform.machine()}")
    done = _install(tmp_path, wheel, f"install_python={shim}")
    assert done.returncode == 22, done.stdout + done.stderr
    assert f"install_python {shim} ({shim}) is Python {PYVER}, the wheels were built for {other}" in done.stderr
    assert not (tmp_path / "env").exists()


def test_install_python_that_is_not_here_is_named(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    done = _install(tmp_path, wheel, "install_python=python3-of-no-module-tb")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "error: ToolMissing: install_python python3-of-no-module-tb is not a program here" in done.stderr
    assert "cray-python" in done.stderr


def test_a_check_that_does_not_end_fails_the_install_by_name(tmp_path, monkeypatch):
    """A hung check (a launcher waiting for an allocation) cannot hang the install."""
    import types

    from torchbuild.core.errors import InstallFailed
    from torchbuild.install import step as install

    monkeypatch.setattr(install, "CHECK_TIMEOUT", 1)
    step = types.SimpleNamespace(prefix=tmp_path, env={"PATH": os.defpath})
    pkg = RuntimePackage("tb-slow==1", check=("sleep", "30"))
    with pytest.raises(InstallFailed, match=r"the check of tb-slow==1 did not end in 1 s: sleep 30"):
        install._run_check(step, pkg)
