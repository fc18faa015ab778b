"""invoke install without containers: the host-side checks (prefix, wheels, module name, mpi4py),
the runtime keys of a profile, the runtime pieces of the backends, mpiinfo, and one real native
install of a tiny pure-Python wheel (venv, pip, activate, modulefiles, manifest)."""

from __future__ import annotations

import ctypes.util
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TORCH_TAG, make_wheel
from packaging.utils import canonicalize_name

from torchbuild.core.errors import PathError, ProfileError, UsageError
from torchbuild.install.host import check_prefix, choose_wheels, module_identity, record_files, wheel_python
from torchbuild.install.mpiinfo import MPI_LIBRARY
from torchbuild.install.step import mpi4py_requirement, other_packages, wants_mpi4py
from torchbuild.install.wheelhouse import WheelFile
from torchbuild.profile.config import resolve
from torchbuild.runtime.backends import Options, choose
from torchbuild.runtime.backends.apptainer import run_args
from torchbuild.runtime.environment import readonly_shell_variables, runtime_env
from torchbuild.runtime.manifest import INSTALL_MANIFEST, InstallManifest, read_install, write_install
from torchbuild.sif.host import runtime_hash

REPO = Path(__file__).resolve().parents[3]
TORCHBUILD = Path(sys.executable).with_name("torchbuild")


# --------------------------------------------------------------------------- check_prefix


@pytest.mark.parametrize("bad", ["my env", "a:b", "a,b", "it's", 'say"x', "$HOME", "a`b", "back\\slash", "new\nline"])
def test_prefix_with_characters_a_venv_cannot_live_under_is_refused(tmp_path, bad):
    with pytest.raises(PathError, match="cannot be used"):
        check_prefix(tmp_path / bad, force=True)
    assert not (tmp_path / bad).exists()


def test_prefix_that_torchbuild_did_not_make_is_refused_and_left_alone(tmp_path):
    prefix = tmp_path / "theirs"
    prefix.mkdir()
    (prefix / "data.txt").write_text("precious")
    with pytest.raises(PathError, match="torchbuild did not make it"):
        check_prefix(prefix, force=True)
    assert (prefix / "data.txt").read_text() == "precious"


def test_prefix_new_or_empty_is_used_as_it_is(tmp_path):
    assert check_prefix(tmp_path / "new", force=False) is False
    (tmp_path / "empty").mkdir()
    assert check_prefix(tmp_path / "empty", force=False) is False


def _earlier_install(prefix: Path, recorded: str | None = None, files: bool = True) -> None:
    """An environment as an install leaves it: its manifest and (files) the list of its files."""
    prefix.mkdir()
    (prefix / "bin").mkdir()
    write_install(
        InstallManifest(
            schema_version=1,
            torchbuild_version="0",
            run_id="r",
            profile="cpu",
            profile_hash="h",
            engine="native",
            prefix=str(prefix) if recorded is None else recorded,
            python="python3",
            python_version="3.12.0",
            started="",
            finished="",
            duration_s=0.0,
            wheels=(),
            runtime_env={},
            runtime_packages=(),
            runtime_modules=(),
            mpi=None,
            module="torch/2.6.0",
            modulefiles=(),
            frozen=(),
            size_bytes=0,
        ),
        prefix / INSTALL_MANIFEST,
    )
    if files:
        record_files(prefix)


def test_prefix_of_an_earlier_install_is_replaced_only_with_force(tmp_path):
    prefix = tmp_path / "env"
    _earlier_install(prefix)
    with pytest.raises(PathError, match="already holds an environment torchbuild installed"):
        check_prefix(prefix, force=False)
    assert check_prefix(prefix, force=True) is True
    assert (prefix / "bin").is_dir()  # checking removes nothing


@pytest.mark.parametrize("recorded", ["elsewhere", "", "relative/env", "/nonexistent/env"])
def test_prefix_holding_the_manifest_of_another_prefix_is_not_replaced_even_with_force(tmp_path, recorded):
    """A torchbuild-install.json copied (or an environment moved) into a directory does not
    make that directory torchbuild's: --force removes only the prefix the manifest names."""
    if recorded == "elsewhere":
        recorded = str(tmp_path / "elsewhere")
        (tmp_path / "elsewhere").mkdir()
    prefix = tmp_path / "mine"
    _earlier_install(prefix, recorded=recorded)
    (prefix / "thesis.tex").write_text("precious")
    with pytest.raises(PathError, match="torchbuild did not make this directory") as info:
        check_prefix(prefix, force=True)
    assert info.value.status == 15
    assert (prefix / "thesis.tex").read_text() == "precious"


def test_prefix_reached_through_another_path_to_the_same_directory_is_replaced_with_force(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    _earlier_install(tmp_path / "real" / "env")
    assert check_prefix(tmp_path / "alias" / "env", force=True) is True


@pytest.mark.parametrize("target", ["an earlier install", "an empty directory", "nothing"])
def test_prefix_that_is_a_symbolic_link_is_refused_and_left_alone(tmp_path, target):
    real = tmp_path / "real"
    if target == "an earlier install":
        _earlier_install(real)
    elif target == "an empty directory":
        real.mkdir()
    link = tmp_path / "env"
    link.symlink_to(real)
    with pytest.raises(PathError, match="is a symbolic link") as info:
        check_prefix(link, force=True)
    assert str(real) in info.value.message and "OSError" not in info.value.message
    assert link.is_symlink()
    assert real.exists() == (target != "nothing")


def test_prefix_whose_parent_cannot_be_a_directory_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(PathError, match="parent of --prefix"):
        check_prefix(tmp_path / "file" / "env", force=False)
    with pytest.raises(PathError, match="not a directory"):
        check_prefix(tmp_path / "file", force=True)


# --------------------------------------------------------------------------- wheels and module


def test_choose_wheels_refuses_two_versions_of_a_project_and_an_empty_out(tmp_path):
    a = make_wheel(tmp_path / "out", "torch", "2.5.1+cpu", TORCH_TAG)
    b = make_wheel(tmp_path / "out", "torch", "2.6.0+cpu", TORCH_TAG)
    with pytest.raises(UsageError, match="2 wheels of torch"):
        choose_wheels([], tmp_path / "out")  # every wheel in --out
    assert [w.path for w in choose_wheels([b], tmp_path / "out")] == [b.resolve()]
    with pytest.raises(UsageError, match="2 wheels of torch"):
        choose_wheels([a, b], tmp_path / "elsewhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no wheels to install"):
        choose_wheels([], tmp_path / "empty")


def test_choose_wheels_takes_several_projects(tmp_path):
    torch = make_wheel(tmp_path, "torch", "2.6.0+cpu", TORCH_TAG)
    vision = make_wheel(tmp_path, "torchvision", "0.21.0+cpu", TORCH_TAG)
    assert {str(w.project) for w in choose_wheels([torch, vision], tmp_path)} == {"torch", "torchvision"}


def test_module_identity_is_torchs_version_and_the_name_can_be_overridden(tmp_path):
    # the local label after a `-`: Environment Modules 5 reads `+x` as a variant
    vision = WheelFile.read(make_wheel(tmp_path, "torchvision", "0.21.0+cpu", TORCH_TAG))
    torch = WheelFile.read(make_wheel(tmp_path, "torch", "2.6.0+cpu", TORCH_TAG))
    assert module_identity([vision, torch]) == ("torch", "2.6.0-cpu")
    assert module_identity([vision]) == ("torchvision", "0.21.0-cpu")
    assert module_identity([vision, torch], "pytorch") == ("pytorch", "2.6.0-cpu")
    foo = WheelFile.read(make_wheel(tmp_path, "Foo_Bar", "1.0"))
    assert module_identity([foo]) == ("foo-bar", "1.0")


@pytest.mark.parametrize(
    ("sets", "wants", "requirement", "others"),
    [
        ([], False, "mpi4py", []),
        (["runtime_packages=[mpi4py==4.0.3, numpy<2]"], False, "mpi4py==4.0.3", ["mpi4py==4.0.3", "numpy<2"]),
        (["mpi=openmpi"], True, "mpi4py", []),
        (["mpi=openmpi", "runtime_packages=[mpi4py==4.0.3, numpy<2]"], True, "mpi4py==4.0.3", ["numpy<2"]),
        (["mpi=openmpi", "runtime_packages=[MPI4Py>=4, numpy<2]"], True, "MPI4Py>=4", ["numpy<2"]),
        (["mpicc=cc", "runtime_packages=[horovod]"], True, "mpi4py", ["horovod"]),
    ],
)
def test_mpi4py_is_built_apart_exactly_when_the_profile_has_mpi(sets, wants, requirement, others):
    spec = resolve("cpu", sets)
    assert wants_mpi4py(spec) is wants
    assert mpi4py_requirement(spec) == requirement
    assert other_packages(spec) == others


# --------------------------------------------------------------------------- runtime keys


def test_runtime_packages_must_be_requirements():
    with pytest.raises(ProfileError, match=r"runtime_packages.*'numpy <<2' is not a pip requirement"):
        resolve("cpu", ["runtime_packages=[numpy <<2]"])


@pytest.mark.parametrize("var", ["PATH", "VIRTUAL_ENV", "PYTHONHOME"])
def test_runtime_env_cannot_set_what_the_environment_sets_itself(var):
    with pytest.raises(ProfileError, match=f"runtime_env.*{var}"):
        resolve("cpu", [f"runtime_env={{{var}: /x}}"])


@pytest.mark.parametrize("bad", ["lib", "/opt/a:/opt/b", "/opt/a b", "'/opt/a,/opt/b'"])
def test_host_mpi_must_be_absolute_paths_without_separators(bad):
    with pytest.raises(ProfileError, match="host_mpi"):
        resolve("cpu", [f"host_mpi=[{bad}]"])
    assert resolve("cpu", ["host_mpi=[/opt/cray/pe/mpich/8.1.30/ofi/gnu/12.3/lib]"]).host_mpi == (
        "/opt/cray/pe/mpich/8.1.30/ofi/gnu/12.3/lib",
    )


def test_runtime_keys_do_not_change_the_build_but_change_the_sifs_environment():
    plain = resolve("cpu")
    nccl = resolve("cpu", ["runtime_env={NCCL_NET: ofi}"])
    other = resolve("cpu", ["runtime_env={NCCL_NET: socket}"])
    more = resolve(
        "cpu", ["runtime_packages=[numpy<2]", "runtime_modules=[cray-mpich]", "mpicc=cc", "host_mpi=[/opt/m]"]
    )
    assert plain.hash == nccl.hash == other.hash == more.hash  # the same build: no rebuild
    assert len({runtime_hash(plain), runtime_hash(nccl), runtime_hash(other), runtime_hash(more)}) == 4
    assert runtime_hash(resolve("cpu", ["runtime_env={NCCL_NET: ofi}"])) == runtime_hash(nccl)


@pytest.mark.parametrize("var", ["UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO", "ZSH_SUBSHELL"])
def test_runtime_env_cannot_set_a_read_only_shell_variable(var):
    """`export UID=5` in bin/activate fails ("readonly variable") and stops a `set -e` job."""
    with pytest.raises(ProfileError, match=f"{var} is a read-only shell variable") as info:
        runtime_env(resolve("cpu", [f"runtime_env={{{var}: '5', NCCL_NET: ofi}}"]))
    assert info.value.status == 2


def test_read_only_shell_variables_are_asked_of_bash_and_known_without_it(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "bash"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'declare -ir SITE_RO=\"1\"'\necho 'declare -x NOT_RO=\"2\"'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    readonly_shell_variables.cache_clear()
    try:
        asked = readonly_shell_variables()
        monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
        readonly_shell_variables.cache_clear()
        without = readonly_shell_variables()
    finally:
        readonly_shell_variables.cache_clear()
    assert "SITE_RO" in asked and "NOT_RO" not in asked and "UID" in asked
    assert {"UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO"} <= without


def test_install_with_a_read_only_shell_variable_in_runtime_env_makes_nothing(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    prefix = tmp_path / "env"
    done = _install(tmp_path, prefix, wheel, "runtime_env={UID: '5'}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: ProfileError" in done.stderr and "UID is a read-only shell variable" in done.stderr
    assert not prefix.exists() and not (tmp_path / "out").exists()


def test_runtime_env_must_agree_with_the_builds_own_variables():
    with pytest.raises(ProfileError, match=r"CC='clang'.*differs from the build's CC='gcc'"):
        runtime_env(resolve("cpu", ["runtime_env={CC: clang}"]))
    assert runtime_env(resolve("cpu", ["runtime_env={CC: gcc, NCCL_NET: ofi}"])) == {"CC": "gcc", "NCCL_NET": "ofi"}


# --------------------------------------------------------------------------- backends


def test_apptainer_binds_host_mpi_read_only_and_puts_it_first(tmp_path):
    args = run_args(
        tmp_path / "t.sif",
        {tmp_path / "cache": "/cache", tmp_path / "out": "/out"},
        ["inside.step", "mpi", "/out/r.json"],
        host_mpi=["/opt/mpich/lib", "/opt/pmi/lib"],
    )
    bind = args[args.index("--bind") + 1]
    assert (
        bind
        == f"{tmp_path / 'cache'}:/cache,{tmp_path / 'out'}:/out,/opt/mpich/lib:/opt/mpich/lib:ro,/opt/pmi/lib:/opt/pmi/lib:ro"
    )
    envs = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
    assert "LD_LIBRARY_PATH=/opt/mpich/lib:/opt/pmi/lib" in envs
    assert args[-4:] == [str(tmp_path / "t.sif"), "inside.step", "mpi", "/out/r.json"]
    plain = run_args(tmp_path / "t.sif", {tmp_path / "out": "/out"}, ["x"])
    assert not any(a.startswith("LD_LIBRARY_PATH=") for a in plain) and ":ro" not in plain[plain.index("--bind") + 1]


def test_host_mpi_is_refused_natively():
    with pytest.raises(UsageError, match="--host-mpi"):
        choose(resolve("cpu"), "native", Options(host_mpi=("/opt/mpich/lib",)))
    assert choose(resolve("cpu"), "apptainer", Options(host_mpi=("/opt/mpich/lib",))).name == "apptainer"


# --------------------------------------------------------------------------- mpiinfo


@pytest.mark.parametrize(
    ("name", "matches"),
    [
        ("libmpi.so.12", True),
        ("libmpich.so.12.3.0", True),
        ("libmpi_cray.so.12", True),
        ("libmpi.so.40.30.0", True),
        ("libmpi.so", True),
        ("libmpi_gnu_123.so.12", True),
        ("libmpi_mpifh.so.40", False),
        ("libmpicxx.so.12", False),
        ("libmpi.so.12.bak", False),
        ("libopen-pal.so.40", False),
    ],
)
def test_mpi_library_pattern(name, matches):
    assert bool(MPI_LIBRARY.search(name)) is matches


def test_mpiinfo_reports_the_mpi_it_loads_or_that_there_is_none():
    proc = subprocess.run(
        [sys.executable, str(REPO / "src" / "torchbuild" / "install" / "mpiinfo.py"), "no_such_module_xyz"],
        capture_output=True,
        text=True,
        env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent-lib-dir"},
        timeout=60,
        check=False,
    )
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["ld_library_path"] == "/nonexistent-lib-dir"
    if ctypes.util.find_library("mpi") is None:
        assert proc.returncode == 3
        assert info["error"] == "no MPI library could be loaded"
    else:  # an MPI is installed here
        assert proc.returncode == 0
        assert MPI_LIBRARY.search(os.path.basename(info["library"])) and info["version"]


# --------------------------------------------------------------------------- a real native install

PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
needs_python = pytest.mark.skipif(
    shutil.which(f"python{PYVER}") is None, reason=f"python{PYVER} is not on PATH (the install makes its venv from it)"
)


def _install(
    tmp: Path, prefix: Path, wheel: Path, *sets: str, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # this machine's find-links and indexes
    env["PIP_CONFIG_FILE"] = os.devnull
    args = [str(TORCHBUILD), "install", "--prefix", str(prefix), "--wheel", str(wheel), "--out", str(tmp / "out")]
    args += ["--set", f"python_version={PYVER}", "--set", f"cache_dir={tmp / 'cache'}", "--no-index", *extra]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """One real install: (tmp, prefix, wheel, completed process)."""
    if shutil.which(f"python{PYVER}") is None:
        pytest.skip(f"python{PYVER} is not on PATH")
    tmp = tmp_path_factory.mktemp("install")
    wheel = make_wheel(tmp / "wheels", "tb_tiny", "0.1.0+cpu", module="tb_tiny")
    prefix = tmp / "env"
    done = _install(
        tmp, prefix, wheel, 'runtime_env={A_VAR: "x y", B_VAR: "$HOME"}', "runtime_modules=[cray-mpich/8.1.30]"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return tmp, prefix, wheel, done


@needs_python
def test_install_records_the_environment_in_its_manifest(installed):
    _tmp, prefix, wheel, done = installed
    manifest = read_install(prefix / INSTALL_MANIFEST)
    assert manifest.prefix == str(prefix)
    assert [w.name for w in manifest.wheels] == [wheel.name]
    assert manifest.wheels[0].sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    frozen = {canonicalize_name(line.split("==")[0]): line.split("==")[1] for line in manifest.frozen if "==" in line}
    assert frozen["tb-tiny"] == "0.1.0+cpu"
    assert manifest.runtime_env == {"A_VAR": "x y", "B_VAR": "$HOME"}
    assert manifest.module == "tb-tiny/0.1.0-cpu"
    assert manifest.modulefiles == ("modulefiles/tb-tiny/0.1.0-cpu.lua", "modulefiles/tb-tiny/0.1.0-cpu")
    assert manifest.python_version.startswith(PYVER + ".")
    assert f"source {prefix}/bin/activate" in done.stdout


@needs_python
def test_install_records_the_real_interpreter_not_the_shim_on_path(tmp_path):
    """A pyenv or conda `python3.X` on PATH is a script that execs the real one: the manifest
    names the interpreter the venv runs on, which outlives the shim's settings."""
    real = Path(sys._base_executable).resolve()
    shim = tmp_path / "shims" / f"python{PYVER}"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    shim.chmod(0o755)
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    done = _install(tmp_path, tmp_path / "env", wheel, extra=("--python", str(shim)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    recorded = read_install(tmp_path / "env" / INSTALL_MANIFEST).python
    assert recorded != str(shim) and Path(recorded).resolve() == real, recorded


@needs_python
def test_installed_environment_runs_the_package_with_runtime_env(installed):
    tmp, prefix, _wheel, _done = installed
    script = f'. {prefix}/bin/activate && python -c "import tb_tiny, os; print(tb_tiny.__version__); print(os.environ[\'A_VAR\']); print(os.environ[\'B_VAR\'])" && deactivate && printf "%s" "${{A_VAR-unset}}"'
    proc = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["0.1.0+cpu", "x y", "$HOME", "unset"]


@needs_python
def test_install_writes_modulefiles_and_leaves_nothing_partial(installed):
    tmp, prefix, _wheel, _done = installed
    lua = prefix / "modulefiles" / "tb-tiny" / "0.1.0-cpu.lua"
    tcl = prefix / "modulefiles" / "tb-tiny" / "0.1.0-cpu"
    lua_lines = lua.read_text().splitlines()
    assert 'depends_on("cray-mpich/8.1.30")' in lua_lines
    assert f'prepend_path("PATH", "{prefix}/bin")' in lua_lines
    assert 'pushenv("A_VAR", "x y")' in lua_lines
    assert 'pushenv "B_VAR" "\\$HOME"' in tcl.read_text().splitlines()
    assert sorted(p.name for p in (tmp / "out").iterdir() if p.name.startswith(".partial-")) == []


@needs_python
def test_install_manifest_is_as_readable_as_the_rest_of_the_environment(installed):
    _tmp, prefix, _wheel, _done = installed
    lua = prefix / "modulefiles" / "tb-tiny" / "0.1.0-cpu.lua"
    assert (prefix / INSTALL_MANIFEST).stat().st_mode & 0o777 == lua.stat().st_mode & 0o777


@needs_python
def test_install_over_an_earlier_install_needs_force(installed):
    tmp, prefix, wheel, _done = installed
    before = (prefix / INSTALL_MANIFEST).read_text()
    again = _install(tmp, prefix, wheel)
    assert again.returncode == 15, again.stdout + again.stderr
    assert "error: PathError" in again.stderr and "--force" in again.stderr
    assert (prefix / INSTALL_MANIFEST).read_text() == before
    assert check_prefix(prefix, force=True) is True


@needs_python
def test_a_failed_install_leaves_no_prefix_and_nothing_partial(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0+cpu", module="tb_tiny")
    prefix = tmp_path / "env"
    done = _install(tmp_path, prefix, wheel, "runtime_packages=[this-package-does-not-exist-xyz]")
    assert done.returncode == 22, done.stdout[-3000:] + done.stderr
    assert "error: InstallFailed" in done.stderr and "Traceback" not in done.stdout + done.stderr
    assert not prefix.exists()
    # nothing partial, and (issue 41 item 18) not the --out directory this failed install made
    assert not (tmp_path / "out").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())


@pytest.mark.parametrize("prefix_was", ["new", "an empty directory of the user's"])
def test_sigterm_during_install_leaves_no_temporary_files_and_says_what_is_left(tmp_path, prefix_was):
    """A batch system's SIGTERM while the venv is made: ensurepip (stopped by SIGTERM, which
    cleans up nothing) had its temporary tree where torchbuild removes it, and the message
    says what the interrupted install left instead of talking about ccache."""
    mark = tmp_path / "mktemp-made"
    shim = tmp_path / "shims" / "python-slow"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nmktemp -d > "{mark}.tmp" && mv "{mark}.tmp" "{mark}"\nexec sleep 60\n')
    shim.chmod(0o755)
    prefix = tmp_path / "env"
    if prefix_was != "new":
        prefix.mkdir()
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", module="tb_tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    args = [str(TORCHBUILD), "install", "--prefix", str(prefix), "--wheel", str(wheel), "--out", str(tmp_path / "out")]
    args += ["--set", f"cache_dir={tmp_path / 'cache'}", "--no-index", "--python", str(shim)]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    made = None
    try:
        for _ in range(600):
            if mark.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert mark.exists(), proc.communicate(timeout=60)
        made = Path(mark.read_text().strip())
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        leftover = made is not None and made.exists()
        if leftover and made is not None and not made.is_relative_to(tmp_path):
            shutil.rmtree(made)  # what the old code left in /tmp
    assert not leftover, f"{made} was left behind"
    assert proc.returncode == 130, out + err
    assert "error: BuildInterrupted: install interrupted" in err and "ccache" not in err
    assert "run the same command again" in err and "Traceback" not in out + err
    assert prefix.exists() == (prefix_was != "new")
    assert not prefix.exists() or list(prefix.iterdir()) == []
    assert not (tmp_path / "out").exists()  # nothing partial, nor the --out it made (issue 41 item 18)


def test_the_wheels_python_comes_from_their_tag_and_must_be_one(tmp_path):
    cp311 = WheelFile.read(make_wheel(tmp_path / "a", "torch", "2.6.0", "cp311-cp311-linux_x86_64"))
    pure = WheelFile.read(make_wheel(tmp_path / "a", "tb_pure", "1.0"))
    cp312 = WheelFile.read(make_wheel(tmp_path / "a", "torchvision", "0.21.0", "cp312-cp312-linux_x86_64"))
    assert wheel_python([cp311, pure]) == "3.11"
    assert wheel_python([pure]) == ""
    with pytest.raises(UsageError, match=r"different Pythons \(3\.11: torch-.*; 3\.12: torchvision-"):
        wheel_python([cp311, cp312])


def _other_python() -> str:
    """A Python X.Y the profile may name that is not on PATH here."""
    for version in ("3.14", "3.13", "3.12", "3.11", "3.10"):
        if version != PYVER and shutil.which(f"python{version}") is None:
            return version
    pytest.skip("every Python a profile may name is on PATH here")


@needs_python
def test_native_install_uses_the_python_the_wheel_was_built_for_not_the_profiles(tmp_path):
    """`invoke build` natively builds with the interpreter it runs on (here cpXY); the profile's
    python_version is another Python, not installed here: install with the wheel's."""
    xy = PYVER.replace(".", "")
    wheel = make_wheel(
        tmp_path / "wheels", "tb_tiny", "0.1.0", f"cp{xy}-cp{xy}-linux_{platform.machine()}", module="tb_tiny"
    )
    done = _install(tmp_path, tmp_path / "env", wheel, f"python_version={_other_python()}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert read_install(tmp_path / "env" / INSTALL_MANIFEST).python_version.startswith(PYVER + ".")


def test_install_names_the_wheels_python_when_it_is_not_here(tmp_path):
    version = _other_python()
    xy = version.replace(".", "")
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0", f"cp{xy}-cp{xy}-linux_{platform.machine()}")
    done = _install(tmp_path, tmp_path / "env", wheel)
    assert done.returncode == 5, done.stdout + done.stderr
    assert f"error: ToolMissing: no Python {version} here (the wheels were built for it)" in done.stderr
    assert f"--python /path/to/python{version}" in done.stderr
    assert not (tmp_path / "env").exists()


# issue 41 item 6: --force removes what torchbuild installed, never what the user added since
@needs_python
def test_force_refuses_to_remove_what_the_user_added_and_lists_it(tmp_path):
    wheel = make_wheel(tmp_path / "wheels", "tb_tiny", "0.1.0+cpu", module="tb_tiny")
    prefix = tmp_path / "env"
    first = _install(tmp_path, prefix, wheel)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    # using the environment writes bytecode caches: those are no stranger's
    subprocess.run([str(prefix / "bin" / "python"), "-c", "import tb_tiny, json, email.mime.text"], check=True)
    (prefix / "notes").mkdir()
    (prefix / "notes" / "thesis.tex").write_text("precious")
    (prefix / "bin" / "my-tool").write_text("#!/bin/sh\n")
    again = _install(tmp_path, prefix, wheel, extra=("--force",))
    assert again.returncode == 15, again.stdout[-3000:] + again.stderr
    assert "error: PathError:" in again.stderr and "3 entries torchbuild did not install" in again.stderr
    assert "bin/my-tool" in again.stderr and "notes/" in again.stderr and "notes/thesis.tex" in again.stderr
    assert again.stderr.splitlines()[-1].startswith("hint: ") and "__pycache__" not in again.stderr
    assert (prefix / "notes" / "thesis.tex").read_text() == "precious" and (prefix / "bin" / "python").exists()
    # moved out, the environment is replaced
    shutil.rmtree(prefix / "notes")
    (prefix / "bin" / "my-tool").unlink()
    third = _install(tmp_path, prefix, wheel, extra=("--force",))
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr


def test_force_refuses_an_install_that_kept_no_list_of_its_files(tmp_path):
    """An environment an older torchbuild installed has no record of its files: --force cannot
    tell them from the user's, and says how to replace it."""
    prefix = tmp_path / "env"
    _earlier_install(prefix, files=False)
    with pytest.raises(PathError, match="kept no list of its files") as err:
        check_prefix(prefix, force=True)
    assert err.value.status == 15 and err.value.hint
    assert (prefix / "bin").is_dir()


def test_the_mpi_library_text_loses_open_mpis_trailing_nul_bytes():
    """The real install's summary said `mpi4py 4.1.2 against Open MPI v5.0.7, ...\\x00`: Open MPI's
    MPI_Get_library_version fills its buffer with NULs, which json carries through."""
    from torchbuild.install.step import library_text

    raw = json.loads(json.dumps("Open MPI v5.0.7, package: Debian OpenMPI, ident: 5.0.7\n\x00\x00"))
    assert library_text(raw) == "Open MPI v5.0.7, package: Debian OpenMPI, ident: 5.0.7"
    assert library_text("MPICH Version:      4.2.0\nMPICH Release date: ...\n") == (
        "MPICH Version:      4.2.0\nMPICH Release date: ..."
    )
    assert library_text("\x00") == ""
