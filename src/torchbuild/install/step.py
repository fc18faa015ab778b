"""invoke install, the step: from built wheels to an environment people run torch in.

The host side (checks, staging, the backend) is install/host.py.
`run_install_step()` runs where the backend runs it (natively, in the image or the SIF):
  1. `python<version> -m venv PREFIX` (the profile's install_python, or --python, when given;
     with --system-site-packages when install_system_site_packages says so);
  2. the wheels with `pip install --no-index --find-links WHEELHOUSE --no-deps name==version`,
     so nothing from an index can stand in for them; then their dependencies and the profile's
     runtime_packages (from the index, or with --no-index from --find-links only);
  3. mpi4py, when the profile has MPI: the wheel the site built once against its MPI
     (`invoke wheelhouse --add-mpi4py`, a linux_<arch> wheel in a --find-links directory),
     else from its sdist with MPICC set (the profile's mpicc, default mpicc), never a cached or
     PyPI binary wheel; then each runtime_packages entry written as a mapping, on its own with
     its pip_args and env, and its check run in the environment (install_packages); `pip check`;
  4. when the wheel was built with the NCCL and plugin of `invoke comms`: that prefix copied
     into PREFIX/comms (the environment does not depend on the build cache surviving), its
     lib/ directories first on LD_LIBRARY_PATH and NCCL_NET_PLUGIN naming the plugin;
  5. each wheel's package imported in the new environment, with its version checked; with
     comms, proof that torch maps PREFIX/comms' libnccl and that the plugin NCCL would open
     is PREFIX/comms' and resolves ncclNetPlugin_v* (ncclprobe.py), else InstallFailed;
  6. runtime_env (and the comms variables) into bin/activate (restored by deactivate), Lmod and
     Tcl modulefiles in PREFIX/modulefiles/<name>/<version>, and PREFIX/torchbuild-install.json
     (pip freeze, and the comms record).
A failure at any point removes the prefix: there is no half-made environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from torchbuild import __version__
from torchbuild.core import console
from torchbuild.core.errors import InstallFailed, ToolMissing, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.install.modulefiles import ModuleInfo, add_activate_hook, write_modulefiles
from torchbuild.profile.config import BuildSpec, requirement_of
from torchbuild.profile.keys import RuntimePackage
from torchbuild.runtime.environment import comms_install_env, runtime_env
from torchbuild.runtime.manifest import (
    INSTALL_MANIFEST,
    InstallCommsRecord,
    InstallManifest,
    MpiRecord,
    PackageInstallRecord,
    WheelRecord,
    write_install,
)
from torchbuild.runtime.pipenv import keep_built

MPI4PY = "mpi4py"


def wants_mpi4py(spec: BuildSpec) -> bool:
    """mpi4py is built when the profile has an MPI, or names its compiler wrapper."""
    return spec.mpi != "none" or "mpi" in spec.distributed or bool(spec.mpicc)


def mpi4py_requirement(spec: BuildSpec) -> str:
    """The mpi4py requirement: runtime_packages' own entry for it (a version pin), else mpi4py."""
    for item in spec.runtime_packages:
        if isinstance(item, str) and canonicalize_name(Requirement(item).name) == MPI4PY:
            return item
    return MPI4PY


def site_mpi4py_wheel(dirs: Sequence[Path], requirement: str, interpreter: str) -> Path | None:
    """The newest mpi4py wheel in dirs (the install's --find-links) that was built at the site
    (platform linux_<arch>: a tag no package index takes, so never a PyPI binary wheel) for this
    interpreter (cp311) and within the requirement's pin; None when there is none."""
    pin = Requirement(requirement).specifier
    best: tuple[Version, Path] | None = None
    for d in dirs:
        if not d.is_dir():
            continue
        for path in d.glob("mpi4py-*.whl"):
            try:
                _name, version, _build, tags = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            here = any(t.interpreter == interpreter and t.platform.startswith("linux_") for t in tags)
            if here and pin.contains(version, prereleases=True) and (best is None or version > best[0]):
                best = (version, path)
    return best[1] if best else None


def other_packages(spec: BuildSpec) -> list[str]:
    """runtime_packages' plain requirements (installed with the wheels' dependencies), without
    mpi4py when mpi4py is built on its own; the entries with options are option_packages'."""
    plain = [p for p in spec.runtime_packages if isinstance(p, str)]
    if not wants_mpi4py(spec):
        return plain
    return [p for p in plain if canonicalize_name(Requirement(p).name) != MPI4PY]


def option_packages(spec: BuildSpec) -> list[RuntimePackage]:
    """runtime_packages' entries written as mappings: each installed on its own, after mpi4py."""
    return [p for p in spec.runtime_packages if isinstance(p, RuntimePackage)]


# --------------------------------------------------------------------------- the requests


@dataclasses.dataclass(frozen=True)
class WheelPin:
    """A wheel in the staged wheelhouse: its file name, and the project and version it installs."""

    file: str
    project: str
    version: str


@dataclasses.dataclass(frozen=True)
class ModuleName:
    """The modulefile's name and version (torch/2.6.0-gh200)."""

    name: str
    version: str


@dataclasses.dataclass(frozen=True)
class CommsSource:
    """The comms prefix the wheel was built with: where the step sees it, where it is on the
    host (recorded), and its torchbuild-comms.json (read by the host)."""

    prefix: str
    host_prefix: str
    manifest: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class InstallRequest:
    """The install step's request (install/host.py writes it; paths as the step sees them)."""

    spec: BuildSpec
    prefix: str
    wheelhouse: str
    wheels: tuple[WheelPin, ...]
    cache: str
    module: ModuleName
    run_id: str = ""
    tmp: str = ""  # the TMPDIR of the step's processes; the host removes it on every way out
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    python: str = ""  # --python; "" for python<python_version> (or the profile's)
    python_version: str = ""  # the wheels' Python (their cpXY tag), not the profile's
    engine: str = "native"
    comms: CommsSource | None = None


@dataclasses.dataclass(frozen=True)
class MpiRequest:
    """The mpi step's request (install/host.py mpi_check writes it)."""

    spec: BuildSpec
    python: str = ""  # the interpreter to ask; "" for the step's own
    host_mpi: tuple[str, ...] = ()  # host MPI directories bound in: the library must come from one


# --------------------------------------------------------------------------- the step


def run_install_step(req: InstallRequest) -> int:
    """The install step where the backend runs it (see the module's docstring)."""
    prefix = Path(req.prefix)
    try:
        _Step(req).run()
    except BaseException:
        empty_dir(prefix)
        raise
    return 0


def empty_dir(prefix: Path) -> None:
    """Remove what the step made inside prefix (the host removes prefix itself)."""
    if prefix.is_dir():
        for p in prefix.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class _Carried:
    """The comms stack copied into the environment: where, from what, and what puts it first."""

    prefix: Path
    source: CommsSource
    dirs: list[str]
    env: dict[str, str]


def _on_path(name: str, problem: str, hint: str) -> str:
    """The path of the program name on PATH; ToolMissing saying problem when there is none."""
    found = shutil.which(name)
    if not found:
        raise ToolMissing(problem, hint=hint)
    return found


class _Step:
    def __init__(self, req: InstallRequest) -> None:
        self.req, self.spec, self.prefix = req, req.spec, Path(req.prefix)
        self.py = self.prefix / "bin" / "python"
        self.env = {
            **os.environ,
            "PIP_CACHE_DIR": f"{req.cache}/pip",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }
        self.env.pop("PYTHONHOME", None)
        if req.tmp:  # the host removes it on every way out
            self.env["TMPDIR"] = req.tmp
        self.index = [a for p in req.find_links for a in ("--find-links", p)]
        if req.no_index:
            self.index.insert(0, "--no-index")

    def run(self) -> None:
        started, t0 = datetime.now(timezone.utc), time.monotonic()
        mpi4py = wants_mpi4py(self.spec)
        mpicc = self._mpicc(required=not self._site_wheel_offered()) if mpi4py else ""
        self._make_venv()
        self._install_wheels()
        mpi = self._mpi4py(mpicc) if mpi4py else None
        packages = install_packages(self, option_packages(self.spec))
        self._pip(["check"], "pip check")
        runtime = runtime_env(self.spec)
        carried = self._carry_comms()
        # the comms variables first, runtime_env over them (as the SIF's %environment has it)
        env = {**(carried.env if carried else {}), **runtime}
        prepend = {"LD_LIBRARY_PATH": carried.dirs} if carried else {}
        run_env = self._run_env(env, prepend)
        self._import_check(run_env)
        comms = self._check_comms(carried, run_env) if carried else None
        frozen = self._capture([str(self.py), "-m", "pip", "freeze", "--all"], "pip freeze").splitlines()
        self._hook_activate(env, prepend)
        modulefiles = self._modulefiles(env, prepend)
        manifest = self._manifest(started, t0, runtime, mpi, packages, comms, frozen=frozen, modulefiles=modulefiles)
        write_install(manifest, self.prefix / INSTALL_MANIFEST)

    def _install_wheels(self) -> None:
        """The built wheels from the wheelhouse only (kept at their versions), then their dependencies and the
        profile's other runtime packages."""
        pins = [f"{w.project}=={w.version}" for w in self.req.wheels]
        house = self.req.wheelhouse
        built = {w.project: w.version for w in self.req.wheels}
        self.env.update(keep_built(Path(house, "torchbuild-constraints.txt"), built, str(self.py), self.env))
        say(f"installing {', '.join(pins)} from the local wheelhouse")
        self._pip(["install", "--no-index", "--find-links", house, "--no-deps", "--", *pins], "installing the wheels")
        extra = other_packages(self.spec)
        say("installing their dependencies" + (f" and {', '.join(extra)}" if extra else ""))
        self._pip(["install", "--find-links", house, *self.index, "--", *pins, *extra], "installing dependencies")

    def _manifest(
        self,
        started: datetime,
        t0: float,
        runtime: Mapping[str, str],
        mpi: MpiRecord | None,
        packages: tuple[PackageInstallRecord, ...],
        comms: InstallCommsRecord | None,
        *,
        frozen: Sequence[str],
        modulefiles: tuple[str, str],
    ) -> InstallManifest:
        """The install's record (PREFIX/torchbuild-install.json): the interpreter, the wheels, the runtime pieces,
        pip freeze, the size and the time it took (finished now)."""
        python_version, base_python = self._base_python()
        return InstallManifest(
            schema_version=1,
            torchbuild_version=__version__,
            run_id=self.req.run_id,
            profile=self.spec.profile,
            profile_hash=self.spec.hash,
            engine=self.req.engine,
            prefix=str(self.prefix),
            python=base_python,
            python_version=python_version,
            started=started.isoformat(timespec="seconds"),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            duration_s=round(time.monotonic() - t0, 1),
            wheels=tuple(WheelRecord.of(Path(self.req.wheelhouse, w.file)) for w in self.req.wheels),
            runtime_env=dict(runtime),
            runtime_packages=tuple(requirement_of(p) for p in self.spec.runtime_packages),
            runtime_modules=tuple(self.spec.runtime_modules),
            mpi=mpi,
            module=f"{self.req.module.name}/{self.req.module.version}",
            modulefiles=modulefiles,
            frozen=tuple(frozen),
            size_bytes=_size(self.prefix),
            comms=comms,
            packages=packages,
            system_site_packages=self.spec.install_system_site_packages,
        )

    def _base_python(self) -> tuple[str, str]:
        """The version (X.Y.Z) and path of the interpreter the venv runs on."""
        # the interpreter the venv runs on: `python3.13` on PATH may be a pyenv or conda shim
        python_version, base_python = self._capture(
            [str(self.py), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3]); print(sys._base_executable)"],
            "python",
        ).splitlines()[:2]
        return python_version, base_python

    def _modulefiles(self, env: Mapping[str, str], prepend: Mapping[str, Sequence[str]]) -> tuple[str, str]:
        """The Lmod and Tcl modulefiles in PREFIX/modulefiles; their paths under the prefix."""
        info = ModuleInfo(
            name=self.req.module.name,
            version=self.req.module.version,
            prefix=str(self.prefix),
            env=env,
            modules=self.spec.runtime_modules,
            description=f"PyTorch environment from torchbuild profile {self.spec.profile}",
            prepend=prepend,
        )
        with named_os_errors(self.prefix / "modulefiles", "writing the modulefiles"):
            lua, tcl = write_modulefiles(self.prefix / "modulefiles", info)
        return str(lua.relative_to(self.prefix)), str(tcl.relative_to(self.prefix))

    # -- pieces

    def _make_venv(self) -> None:
        """The venv at the prefix, from the chosen interpreter (_python); with its site-packages
        when install_system_site_packages says so (a venv over cray-python)."""
        base = self._python()
        site = ["--system-site-packages"] if self.spec.install_system_site_packages else []
        say(f"making the venv from {base}" + (", with its site-packages" if site else ""))
        self._call([base, "-m", "venv", *site, "--", str(self.prefix)], "creating the venv")

    def _python(self) -> str:
        """--python, else the profile's install_python (each checked to be the wheels' Python,
        interpreter_for), else the Python the wheels were built for (their cpXY tag; for
        pure-Python wheels the profile's python_version): pythonX.Y on PATH, else this
        interpreter or the image's /opt/venv-X.Y when it is X.Y. ToolMissing naming X.Y and the
        fix otherwise."""
        if self.req.python or self.spec.install_python:
            return interpreter_for(self.req, self.env)
        version = self.req.python_version or self.spec.python_version
        why = "the wheels were built for it" if self.req.python_version else "the profile's python_version"
        found = shutil.which(f"python{version}")
        if found:
            return found
        if version == "{}.{}".format(*sys.version_info[:2]):
            return sys.executable
        venv = Path(f"/opt/venv-{version}/bin/python")
        if venv.is_file():
            return str(venv)
        raise ToolMissing(
            f"no Python {version} here ({why}): python{version} is not on PATH",
            hint=f"install Python {version} or load its module, or give --python /path/to/python{version}",
        )

    def _mpicc(self, required: bool = True) -> str:
        """The MPI wrapper mpi4py is compiled with; "" where it is not on PATH and not required."""
        want = self.spec.mpicc or "mpicc"
        if not required:
            return shutil.which(want) or ""
        return _on_path(
            want,
            f"the MPI compiler wrapper {want!r} (mpicc) is not on PATH: mpi4py is built with it",
            "load the MPI module (e.g. cray-mpich, with mpicc: cc), or set mpicc to the wrapper",
        )

    def _site_wheel_offered(self) -> bool:
        """Whether a --find-links directory holds the site's mpi4py wheel for the wheels' Python
        (then no MPI wrapper need be on PATH: it is needed only to compile mpi4py)."""
        version = self.req.python_version.replace(".", "")
        dirs = [Path(d) for d in self.req.find_links]
        return bool(version) and site_mpi4py_wheel(dirs, mpi4py_requirement(self.spec), f"cp{version}") is not None

    def _mpi4py(self, mpicc: str) -> MpiRecord:
        req = mpi4py_requirement(self.spec)
        interpreter = self._capture(
            [str(self.py), "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"], "python"
        )
        wheel = site_mpi4py_wheel([Path(d) for d in self.req.find_links], req, interpreter.strip())
        if wheel is not None:  # built once against the site's MPI (`invoke wheelhouse --add-mpi4py`)
            say(f"installing {req} from the wheelhouse's {wheel.name}, built at the site (not compiled here)")
            self._pip(["install", "--no-index", "--no-deps", "--", str(wheel)], "installing the mpi4py wheel")
        else:
            mpicc = mpicc or self._mpicc()  # ToolMissing: no wheel of the site's, no wrapper to build one
            say(f"building {req} from source with MPICC={mpicc}")
            self._pip(
                ["install", "--no-binary", MPI4PY, "--no-cache-dir", *self.index, "--", req],
                "building mpi4py",
                env={"MPICC": mpicc},
            )
        probe = "from mpi4py import MPI; import mpi4py, json; print(json.dumps([mpi4py.__version__, MPI.Get_library_version()]))"
        text = self._capture([str(self.py), "-c", probe], "mpi4py's MPI library")
        version, library = json.loads(text.strip().splitlines()[-1])
        library = library_text(library)
        say(f"mpi4py {version} uses: {library.splitlines()[0] if library else '?'}")
        return MpiRecord(mpicc=mpicc, mpi4py=version, library_version=library)

    # -- the comms stack the wheel was built with

    def _carry_comms(self) -> _Carried | None:
        """The comms prefix copied into PREFIX/comms, and what puts it first (None without comms).
        Copied, not pointed at: the environment must outlive the build cache it came from."""
        src = self.req.comms
        if src is None:
            return None
        dest = self.prefix / "comms"
        say(f"copying the NCCL and net plugin of `invoke comms` from {src.host_prefix} into {dest}")
        with named_os_errors(dest, "copying the comms prefix into the environment"):
            shutil.copytree(src.prefix, dest, symlinks=True)
        dirs, env = comms_install_env(str(dest), src.manifest)
        return _Carried(dest, src, dirs, env)

    def _run_env(self, env: Mapping[str, str], prepend: Mapping[str, Sequence[str]]) -> dict[str, str]:
        """The step's environment as the activated venv has it: env set, then prepend's directories first."""
        run = {**self.env, **env}
        for var, dirs in prepend.items():
            run[var] = ":".join([*dirs, *([run[var]] if run.get(var) else [])])
        return run

    def _check_comms(self, carried: _Carried, run_env: Mapping[str, str]) -> InstallCommsRecord:
        """Proof that the venv's torch maps the carried libnccl and that the plugin NCCL would
        open is the carried one and resolves ncclNetPlugin_v* (ncclprobe.py); InstallFailed if not."""
        from torchbuild.install import ncclprobe
        from torchbuild.runtime.libraries import loaded_problems, net_plugin_symbols

        m = carried.source.manifest
        nccl = carried.prefix / str(m["nccl"]["library"]) if m.get("nccl") else None
        plugin = Path(carried.env["NCCL_NET_PLUGIN"]) if "NCCL_NET_PLUGIN" in carried.env else None
        cmd = [str(self.py), ncclprobe.__file__, *net_plugin_symbols()]
        text = self._capture(cmd, "the NCCL check (import torch)", env=run_env).strip().splitlines()
        probe: dict[str, Any] = json.loads(text[-1]) if text else {"error": "the NCCL check printed nothing"}
        problems = loaded_problems(probe, nccl, plugin)
        if problems:
            raise InstallFailed(
                f"the installed torch does not load the comms stack it was built with: {'; '.join(problems)}",
                hint=f"check {carried.source.host_prefix} (remove it and run `invoke comms` again) and "
                "LD_LIBRARY_PATH here; nothing was installed",
            )
        loaded = next((p for p in probe.get("nccl", []) if nccl and os.path.realpath(p) == os.path.realpath(nccl)), "")
        symbols = tuple(probe.get("plugin", {}).get("symbols", [])) if plugin else ()
        say(
            f"torch loads {loaded or 'no NCCL of comms'}"
            + (f"; NCCL opens {plugin} ({', '.join(symbols)})" if plugin else "")
        )
        return InstallCommsRecord(
            source=carried.source.host_prefix,
            prefix=str(carried.prefix),
            copied=True,
            key=str(m.get("key", "")),
            ld_library_path=tuple(carried.dirs),
            net_plugin=carried.env.get("NCCL_NET_PLUGIN", ""),
            nccl_loaded=loaded,
            plugin_symbols=symbols,
        )

    def _import_check(self, env: Mapping[str, str]) -> None:
        for w in self.req.wheels:
            module = w.project.replace("-", "_")
            code = f"import {module} as m; print(getattr(m, '__version__', ''))"
            got = self._capture([str(self.py), "-c", code], f"importing {module}", env=env).strip().splitlines()
            have = got[-1] if got else ""
            if have and have != w.version:
                raise InstallFailed(f"{module} imports as {have} in {self.prefix}, the wheel is {w.version}")
            say(f"import {module}: {have or 'ok'}")

    def _hook_activate(self, env: Mapping[str, str], prepend: Mapping[str, Sequence[str]]) -> None:
        activate = self.prefix / "bin" / "activate"
        with named_os_errors(activate, "adding runtime_env to the activate script"):
            text = activate.read_text()
            try:
                activate.write_text(add_activate_hook(text, env, prepend))
            except ValueError as exc:
                raise InstallFailed(f"{activate}: {exc}") from None

    def _pip(self, args: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> None:
        self._call([str(self.py), "-m", "pip", *args], what, env=env)

    def _call(self, cmd: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> None:
        from torchbuild.core.process import run_streamed

        def line(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        with named_os_errors(cmd[0], what):
            done = run_streamed(cmd, on_line=line, env={**self.env, **(env or {})})
        if done.returncode != 0:
            raise InstallFailed(f"{what} failed (exit {done.returncode}): {' '.join(cmd[:6])}")

    def _capture(self, cmd: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> str:
        with named_os_errors(cmd[0], what):
            proc = run_captured(cmd, env=env or self.env)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise InstallFailed(f"{what} failed in {self.prefix}: " + " | ".join(tail))
        return proc.stdout


# --------------------------------------------------------------------------- the interpreter and packages with options


def interpreter_for(req: InstallRequest, env: Mapping[str, str]) -> str:
    """The interpreter --python (else the profile's install_python) names, on PATH where the
    step runs; ToolMissing when it is not there, InstallFailed when it is not the Python the
    wheels were built for (their cp3X tag): a torch for 3.12 does not import on 3.11."""
    given, option = (req.python, "--python") if req.python else (req.spec.install_python, "install_python")
    found = _on_path(
        given,
        f"{option} {given} is not a program here",
        "load the Python module (e.g. cray-python) or give the path of a python3.X interpreter where the install runs",
    )
    if not req.python_version:
        return found
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    with named_os_errors(found, f"asking {option} {given} its version"):
        proc = run_captured([found, "-c", code], env=env, timeout=QUERY_TIMEOUT)
    have = proc.stdout.strip()
    if proc.returncode != 0 or have != req.python_version:
        raise InstallFailed(
            f"{option} {given} ({found}) is Python {have or '?'}, the wheels were built for {req.python_version}",
            hint=f"load the module of Python {req.python_version} or build the wheel with python_version: {have or 'X.Y'}",
        )
    return found


# the lines of a check's output kept in the manifest, and shown when it fails
CHECK_TAIL = 20
CHECK_TIMEOUT = 600  # seconds a runtime_packages check may take


def install_packages(step: _Step, packages: Sequence[RuntimePackage]) -> tuple[PackageInstallRecord, ...]:
    """Each runtime_packages entry with options installed on its own: `pip install` with its
    pip_args (the profile allowed them) and its env over the install's, then its check run in
    the environment (PREFIX/bin first on PATH, no shell); InstallFailed with the check's last
    lines when it fails. step is the install's _Step (its pip, index options and environment)."""
    records = []
    for pkg in packages:
        shown = " ".join([*pkg.pip_args, pkg.requirement])
        say(f"installing {shown}" + (f" with {', '.join(f'{k}={v}' for k, v in pkg.env)}" if pkg.env else ""))
        step._pip(
            ["install", *step.index, *pkg.pip_args, "--", pkg.requirement],
            f"installing {pkg.requirement}",
            env=pkg.environ,
        )
        output = _run_check(step, pkg) if pkg.check else ""
        records.append(PackageInstallRecord(pkg.requirement, pkg.pip_args, pkg.environ, pkg.check, output))
    return tuple(records)


def _run_check(step: _Step, pkg: RuntimePackage) -> str:
    """pkg's check in the environment: its output's last CHECK_TAIL lines, or InstallFailed."""
    bin_dir = step.prefix / "bin"
    env = {**step.env, "VIRTUAL_ENV": str(step.prefix), "PATH": f"{bin_dir}:{step.env.get('PATH', os.defpath)}"}
    program = shutil.which(pkg.check[0], path=env["PATH"])
    if program is None:
        raise InstallFailed(
            f"the check of {pkg.requirement}: {pkg.check[0]!r} is neither in {bin_dir} nor on PATH",
            hint="fix check in its runtime_packages entry (a program the package installs, e.g. horovodrun)",
        )
    say(f"checking {pkg.requirement}: {' '.join(pkg.check)}")
    with named_os_errors(program, f"the check of {pkg.requirement}"):
        proc = run_captured([program, *pkg.check[1:]], env=env, timeout=CHECK_TIMEOUT, merged=True)
    if proc.returncode is None:
        raise InstallFailed(
            f"the check of {pkg.requirement} did not end in {CHECK_TIMEOUT} s: {' '.join(pkg.check)}",
            hint="a check must end by itself (horovodrun --check-build takes seconds); nothing was installed",
        )
    tail = "\n".join(proc.stdout.rstrip().splitlines()[-CHECK_TAIL:])
    if proc.returncode != 0:
        raise InstallFailed(
            f"the check of {pkg.requirement} failed (exit {proc.returncode}): {' '.join(pkg.check)}\n{tail}",
            hint="the package installed but does not work here; its build log is above; nothing was installed",
        )
    print(tail, flush=True)
    return tail


# --------------------------------------------------------------------------- which MPI runs


def run_mpi_step(req: MpiRequest) -> int:
    from torchbuild.core.errors import VerifyFailed
    from torchbuild.install import mpiinfo

    python = req.python or sys.executable
    env = {**os.environ, **runtime_env(req.spec)}
    with named_os_errors(python, "--python"):
        # imports torch and mpi4py: seconds, minutes from a cold parallel file system
        proc = run_captured([python, mpiinfo.__file__, "mpi4py.MPI", "torch"], env=env, timeout=600)
    lines = proc.stdout.strip().splitlines()
    try:
        info = json.loads(lines[-1]) if lines else {}
    except ValueError:
        info = {}
    if proc.returncode != 0 or "library" not in info:
        detail = info.get("error") or (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise VerifyFailed(
            f"no MPI library could be loaded by {python}: {detail} (LD_LIBRARY_PATH={env.get('LD_LIBRARY_PATH', '')})",
            hint="install or load an MPI, or bind the host's with --host-mpi DIR",
        )
    rows = [
        ("library", info["library"]),
        ("loaded through", info.get("via") or "-"),
        ("version", info["version"].splitlines()[0] if info["version"] else "-"),
        ("LD_LIBRARY_PATH", info.get("ld_library_path") or "-"),
    ]
    host = list(req.host_mpi)
    if host:
        used = next((d for d in host if _under(info["library"], d) or _under(info.get("mapped", ""), d)), None)
        rows.append(
            ("host MPI", f"in use (from {used})" if used else "NOT in use: the library is not from " + ", ".join(host))
        )
    print(console.table(["MPI", ""], rows, header=False), flush=True)
    print("MPI_Get_library_version: " + info["version"], flush=True)
    if host and not used:
        raise VerifyFailed(
            f"the host MPI ({', '.join(host)}) was bound in, but the process loaded {info['library']}",
            hint="check that the directory holds libmpi.so.12 (MPICH ABI) and its dependencies",
        )
    return 0


def _under(path: str, directory: str) -> bool:
    return bool(path) and os.path.realpath(path).startswith(os.path.realpath(directory).rstrip("/") + "/")


def say(text: str) -> None:
    print(text, flush=True)


def _size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):  # a file removed meanwhile counts nothing
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def library_text(raw: str) -> str:
    """MPI_Get_library_version's text as a record keeps it: Open MPI's ends in NUL bytes (its
    buffer, not its text: the real install summary printed "Open MPI v5.0.7 ...\\x00"), and
    every implementation's in blank space."""
    return raw.replace("\x00", "").strip()
