"""invoke install: from built wheels to an environment people run torch in.

`install()` runs on the host: it checks the prefix, the wheels and the runtime before anything
is written, stages the wheels as a wheelhouse in the output directory, and hands the `install`
step to a backend (natively, in the toolchain image or in the SIF). The prefix is bound at its
own path, because a venv is not relocatable: an environment made in the image or the SIF runs
there (bind the prefix at the same path), one made natively runs on the host.

`run_install_step()` is the step, where the backend runs it:
  1. `python<version> -m venv PREFIX`;
  2. the wheels with `pip install --no-index --find-links WHEELHOUSE --no-deps name==version`,
     so nothing from an index can stand in for them; then their dependencies and the profile's
     runtime_packages (from the index, or with --no-index from --find-links only);
  3. mpi4py from its sdist with MPICC set (the profile's mpicc, default mpicc), never a cached
     binary wheel, when the profile has MPI; `pip check`;
  4. each wheel's package imported in the new environment, with its version checked;
  5. runtime_env into bin/activate (restored by deactivate), Lmod and Tcl modulefiles in
     PREFIX/modulefiles/<name>/<version>, and PREFIX/torchbuild-install.json (pip freeze).
A failure at any point removes the prefix: there is no half-made environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from torchbuild import __version__
from torchbuild.core import console
from torchbuild.core.errors import (
    BuildInterrupted,
    InstallFailed,
    PathError,
    ToolMissing,
    UsageError,
    named_os_errors,
    writable_dir,
)
from torchbuild.core.process import interrupts_unwind
from torchbuild.core.safeio import user_path
from torchbuild.delivery.manifest import (
    INSTALL_MANIFEST,
    InstallManifest,
    MpiRecord,
    WheelRecord,
    read_install,
    write_install,
)
from torchbuild.delivery.modulefiles import ModuleInfo, add_activate_hook, write_modulefiles
from torchbuild.delivery.pipenv import keep_built
from torchbuild.delivery.wheelhouse import WheelFile, add_wheels, check_mix, wheels_in
from torchbuild.inputs.config import BuildSpec, cache_dir, spec_from_dict
from torchbuild.inputs.environment import runtime_env
from torchbuild.launch.backends import PARTIAL_PREFIX, Backend, Binds

# a prefix ends up in shebangs, PATH, apptainer --bind and modulefiles: keep it to plain characters
_PREFIX_BAD = re.compile(r"[\s:,\"'\\$`]")
MPI4PY = "mpi4py"


def wants_mpi4py(spec: BuildSpec) -> bool:
    """mpi4py is built when the profile has an MPI, or names its compiler wrapper."""
    return spec.mpi != "none" or "mpi" in spec.distributed or bool(spec.mpicc)


def mpi4py_requirement(spec: BuildSpec) -> str:
    """The mpi4py requirement: runtime_packages' own entry for it (a version pin), else mpi4py."""
    for item in spec.runtime_packages:
        if canonicalize_name(Requirement(item).name) == MPI4PY:
            return item
    return MPI4PY


def other_packages(spec: BuildSpec) -> list[str]:
    """runtime_packages without mpi4py, when mpi4py is built on its own."""
    if not wants_mpi4py(spec):
        return list(spec.runtime_packages)
    return [p for p in spec.runtime_packages if canonicalize_name(Requirement(p).name) != MPI4PY]


# --------------------------------------------------------------------------- the host side


def check_prefix(prefix: Path, force: bool) -> bool:
    """Whether prefix must be replaced (an earlier torchbuild install, with force). PathError
    for characters a venv cannot live under, a symbolic link, an existing non-empty directory
    that torchbuild did not install at this path (never removed: its torchbuild-install.json
    must name this prefix), or an earlier install without --force."""
    if _PREFIX_BAD.search(str(prefix)):
        raise PathError(
            f"--prefix {prefix}: whitespace, quotes, '$', '`', ':' and ',' cannot be used in an environment's path",
            hint="venv scripts' shebangs, PATH and apptainer --bind cannot hold them; choose a plain path",
        )
    with named_os_errors(prefix, "--prefix"):
        if prefix.is_symlink():
            raise PathError(
                f"--prefix {prefix} is a symbolic link (to {os.readlink(prefix)})",
                hint="give the directory it points to as --prefix: a venv records its own path, and torchbuild "
                "never replaces a link",
            )
        if not prefix.exists():
            writable_dir(prefix.parent, "the parent of --prefix")
            return False
        if not prefix.is_dir():
            raise PathError(f"--prefix {prefix} exists and is not a directory", hint="choose a new directory")
        if not any(prefix.iterdir()):
            return False
        if not (prefix / INSTALL_MANIFEST).is_file():
            raise PathError(
                f"--prefix {prefix} is not empty and holds no {INSTALL_MANIFEST}: torchbuild did not make it",
                hint="choose a new directory (torchbuild never removes what it did not install)",
            )
    made = read_install(prefix / INSTALL_MANIFEST)  # a manifest we cannot read is not ours to remove
    if not _same_dir(made.prefix, prefix):
        raise PathError(
            f"--prefix {prefix} holds a {INSTALL_MANIFEST} of the environment at {made.prefix or '(no prefix)'}: "
            "torchbuild did not make this directory (it was copied or moved here)",
            hint="choose a new directory (torchbuild never removes what it did not install)",
        )
    if not force:
        raise PathError(
            f"--prefix {prefix} already holds an environment torchbuild installed",
            hint="add --force to replace it, or choose another --prefix",
        )
    return True


def _same_dir(recorded: str, prefix: Path) -> bool:
    """Whether the prefix an install manifest records is prefix (the same path, or the same
    directory reached through another path)."""
    if not recorded or not os.path.isabs(recorded):
        return False
    if os.path.normpath(recorded) == os.path.normpath(prefix):
        return True
    try:
        return os.path.samefile(recorded, prefix)
    except OSError:
        return False


def choose_wheels(wheels: Sequence[Path], out_dir: Path) -> list[WheelFile]:
    """The wheels to install: those given, else every wheel in out_dir. One version per project
    (UsageError otherwise), and one local label (WheelhouseConflict)."""
    found = [WheelFile.read(user_path(w).resolve()) for w in wheels] if wheels else wheels_in(out_dir)
    if not found:
        raise UsageError(
            f"no wheels to install in {out_dir}", hint="build one first (`invoke build`), or give --wheel W"
        )
    projects: dict[str, list[WheelFile]] = {}
    for w in found:
        projects.setdefault(w.project, []).append(w)
    for project, ws in projects.items():
        if len(ws) > 1:
            names = ", ".join(w.path.name for w in ws)
            raise UsageError(
                f"{len(ws)} wheels of {project} to install: {names}", hint="choose one with --wheel W (repeatable)"
            )
    check_mix(found, what="the environment")
    return found


def wheel_python(wheels: Sequence[WheelFile]) -> str:
    """The Python X.Y the wheels were built for, from their CPython tags (cp311: 3.11); "" when
    none says (pure-Python wheels). UsageError when they name different Pythons."""
    wanted: dict[str, list[str]] = {}
    for w in wheels:
        versions = {_cp_version(t.interpreter) for t in w.tags} - {""}
        if len(versions) == 1:
            wanted.setdefault(versions.pop(), []).append(w.path.name)
    if len(wanted) > 1:
        shown = "; ".join(f"{v}: {', '.join(names)}" for v, names in sorted(wanted.items()))
        raise UsageError(
            f"the wheels were built for different Pythons ({shown}); one environment runs one Python",
            hint="choose the wheels of one Python with --wheel W (repeatable)",
        )
    return next(iter(wanted), "")


def _cp_version(interpreter: str) -> str:
    """3.11 for the interpreter tag cp311, "" for any other tag (py3, pp310...)."""
    m = re.fullmatch(r"cp(\d)(\d+)", interpreter)
    return f"{m[1]}.{m[2]}" if m else ""


def module_identity(wheels: Sequence[WheelFile], name: str = "") -> tuple[str, str]:
    """(name, version) of the modulefile: torch's version when torch is among the wheels,
    else the first wheel's project and version, with its local label after a `-`
    (torch/2.6.0-gh200); name (--module-name) replaces the name."""
    main = next((w for w in wheels if w.project == "torch"), wheels[0])
    # Environment Modules 5 reads `+x` in a module name as a variant: 2.6.0+gh200 is 2.6.0-gh200
    return name or str(main.project), str(main.version).replace("+", "-")


def install(
    spec: BuildSpec,
    backend: Backend,
    *,
    prefix: Path,
    wheels: Sequence[Path] = (),
    out_dir: Path,
    find_links: Sequence[Path] = (),
    no_index: bool = False,
    force: bool = False,
    python: str = "",
    module_name: str = "",
) -> InstallManifest:
    """Make the environment at prefix with backend; returns its manifest. Every check comes
    before the first write; a failure or an interrupt leaves no prefix behind."""
    prefix = user_path(prefix).absolute()
    replace = check_prefix(prefix, force)
    chosen = choose_wheels(wheels, out_dir)
    built_for = wheel_python(chosen)
    links = [_existing_dir(p, "--find-links") for p in find_links]
    if module_name and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*", module_name):
        raise UsageError(f"--module-name {module_name!r} is not a module name", hint="letters, digits, . _ + -")
    runtime_env(spec)  # a runtime_env that clashes with the build's is refused now, not in the step
    backend.check()
    out_dir = writable_dir(out_dir, "--out")
    cache = writable_dir(cache_dir(spec), "cache_dir")
    run_id = uuid.uuid4().hex[:12]
    stage = out_dir / f"{PARTIAL_PREFIX}{run_id}-wheelhouse"
    # TMPDIR of the step's processes (ensurepip's and pip's temporary trees): a process stopped
    # by SIGTERM cleans up nothing, so they go where this call removes them on every way out
    tmp = out_dir / f"{PARTIAL_PREFIX}{run_id}-tmp"
    name, version = module_identity(chosen, module_name)
    binds = Binds(cache=cache, out=out_dir, extra=(prefix, *links))
    view = backend.view(binds)
    request = {
        "run_id": run_id,
        "spec": spec.to_dict(),
        "prefix": str(prefix),
        "wheelhouse": str(view.out / stage.name),
        "tmp": str(view.out / tmp.name),
        "wheels": [{"file": w.path.name, "project": str(w.project), "version": str(w.version)} for w in chosen],
        "find_links": [str(p) for p in links],
        "no_index": no_index,
        "python": python,
        "python_version": built_for,  # the wheels' Python (their cpXY tag), not the profile's
        "cache": str(view.cache),
        "engine": backend.engine,
        "module": {"name": name, "version": version},
    }
    started = time.monotonic()
    _run_staged(backend, request, binds, Staging(prefix, replace, stage, tmp, [w.path for w in chosen]))
    manifest = read_install(prefix / INSTALL_MANIFEST)
    _summary(manifest, time.monotonic() - started)
    return manifest


@dataclasses.dataclass(frozen=True)
class Staging:
    """What install() makes around the step: the prefix (replaced with --force), the staged
    wheelhouse and the step's TMPDIR, all under paths the user gave."""

    prefix: Path
    replace: bool
    stage: Path
    tmp: Path
    wheels: list[Path]


def _run_staged(backend: Backend, request: dict[str, Any], binds: Binds, st: Staging) -> None:
    """Stage the wheels, make the prefix and run the install step; on any failure or interrupt
    the prefix is removed (emptied, where it is a directory the user made), and the staged
    wheelhouse and TMPDIR go on every way out."""
    prefix, replace, stage, tmp = st.prefix, st.replace, st.stage, st.tmp
    theirs = prefix.is_dir() and not replace  # an empty directory the user made: emptied, never removed
    try:
        with interrupts_unwind():
            add_wheels(stage, st.wheels)
            with named_os_errors(tmp, "the install's temporary directory"):
                tmp.mkdir(exist_ok=True)
            if replace:
                _say(f"removing the environment torchbuild installed at {prefix} (--force)")
                with named_os_errors(prefix, "removing the earlier environment (--force)"):
                    shutil.rmtree(prefix)
            with named_os_errors(prefix, "--prefix"):
                prefix.mkdir(exist_ok=True)
            backend.run("install", request, binds)
    except (KeyboardInterrupt, BuildInterrupted):
        _undo(prefix, theirs)
        earlier = " (the earlier environment there had been removed, --force)" if replace else ""
        raise BuildInterrupted(
            f"install interrupted: {prefix} was {'emptied' if theirs else 'removed'}{earlier}, "
            "with the staged wheels and temporary files",
            hint="nothing of this install is left: run the same command again to install from the start",
        ) from None
    except BaseException:
        _undo(prefix, theirs)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _undo(prefix: Path, keep_dir: bool) -> None:
    """Remove what an install made at prefix: its contents, and prefix itself unless it was
    there before (an empty directory the user made)."""
    if keep_dir:
        _empty(prefix)
    else:
        shutil.rmtree(prefix, ignore_errors=True)


def _existing_dir(path: Path, what: str) -> Path:
    p = user_path(path).absolute()
    if not p.is_dir():
        raise PathError(f"{what} {p} is not a directory", hint="give a directory of wheels (or sdists)")
    return p


def _summary(m: InstallManifest, seconds: float) -> None:
    rows = [
        ("prefix", m.prefix),
        ("python", f"{m.python} ({m.python_version})"),
        ("wheels", ", ".join(w.name for w in m.wheels)),
        ("packages", str(len(m.frozen))),
        ("mpi4py", f"{m.mpi.mpi4py} against {m.mpi.library_version.splitlines()[0]}" if m.mpi else "-"),
        ("size", f"{m.size_bytes / 2**20:.1f} MiB"),
        ("time", f"{seconds:.1f} s"),
        ("activate", f"source {m.prefix}/bin/activate"),
        ("module", f"module use {m.prefix}/modulefiles && module load {m.module}"),
    ]
    print(console.table(["installed", ""], rows, header=False), flush=True)


# --------------------------------------------------------------------------- the step


def run_install_step(payload: Mapping[str, Any]) -> int:
    """The install step where the backend runs it (see the module's docstring)."""
    for key in ("spec", "prefix", "wheelhouse", "wheels", "cache", "module"):
        if key not in payload:
            raise UsageError(f"the install request has no {key!r}", hint="`invoke install` writes these requests")
    spec = spec_from_dict(payload["spec"], "install request")
    prefix = Path(payload["prefix"])
    step = _Step(spec, prefix, payload)
    try:
        step.run()
    except BaseException:
        _empty(prefix)
        raise
    return 0


def _empty(prefix: Path) -> None:
    """Remove what the step made inside prefix (the host removes prefix itself)."""
    if prefix.is_dir():
        for p in prefix.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def _on_path(name: str, problem: str, hint: str) -> str:
    """The path of the program name on PATH; ToolMissing saying problem when there is none."""
    found = shutil.which(name)
    if not found:
        raise ToolMissing(problem, hint=hint)
    return found


class _Step:
    def __init__(self, spec: BuildSpec, prefix: Path, req: Mapping[str, Any]) -> None:
        self.spec, self.prefix, self.req = spec, prefix, req
        self.py = prefix / "bin" / "python"
        self.env = {
            **os.environ,
            "PIP_CACHE_DIR": f"{req['cache']}/pip",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }
        self.env.pop("PYTHONHOME", None)
        if req.get("tmp"):  # the host removes it on every way out
            self.env["TMPDIR"] = str(req["tmp"])
        self.index = [a for p in req.get("find_links", []) for a in ("--find-links", p)]
        if req.get("no_index"):
            self.index.insert(0, "--no-index")

    def run(self) -> None:
        started, t0 = datetime.now(timezone.utc), time.monotonic()
        mpicc = self._mpicc() if wants_mpi4py(self.spec) else ""
        base = self._python()
        self._call([base, "-m", "venv", "--", str(self.prefix)], "creating the venv")
        pins = [f"{w['project']}=={w['version']}" for w in self.req["wheels"]]
        house = self.req["wheelhouse"]
        built = {str(w["project"]): str(w["version"]) for w in self.req["wheels"]}
        self.env.update(keep_built(Path(house, "torchbuild-constraints.txt"), built, str(self.py), self.env))
        _say(f"installing {', '.join(pins)} from the local wheelhouse")
        self._pip(["install", "--no-index", "--find-links", house, "--no-deps", "--", *pins], "installing the wheels")
        extra = other_packages(self.spec)
        _say("installing their dependencies" + (f" and {', '.join(extra)}" if extra else ""))
        self._pip(["install", "--find-links", house, *self.index, "--", *pins, *extra], "installing dependencies")
        mpi = None
        if mpicc:
            mpi = self._mpi4py(mpicc)
        self._pip(["check"], "pip check")
        self._import_check()
        frozen = self._capture([str(self.py), "-m", "pip", "freeze", "--all"], "pip freeze").splitlines()
        env = runtime_env(self.spec)
        self._hook_activate(env)
        name, version = self.req["module"]["name"], self.req["module"]["version"]
        info = ModuleInfo(
            name=name,
            version=version,
            prefix=str(self.prefix),
            env=env,
            modules=self.spec.runtime_modules,
            description=f"PyTorch environment from torchbuild profile {self.spec.profile}",
        )
        with named_os_errors(self.prefix / "modulefiles", "writing the modulefiles"):
            lua, tcl = write_modulefiles(self.prefix / "modulefiles", info)
        # the interpreter the venv runs on: `python3.13` on PATH may be a pyenv or conda shim
        python_version, base_python = self._capture(
            [str(self.py), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3]); print(sys._base_executable)"],
            "python",
        ).splitlines()[:2]
        house_dir = Path(house)
        manifest = InstallManifest(
            schema_version=1,
            torchbuild_version=__version__,
            run_id=str(self.req.get("run_id", "")),
            profile=self.spec.profile,
            profile_hash=self.spec.hash,
            engine=str(self.req.get("engine", "native")),
            prefix=str(self.prefix),
            python=base_python,
            python_version=python_version,
            started=started.isoformat(timespec="seconds"),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            duration_s=round(time.monotonic() - t0, 1),
            wheels=tuple(WheelRecord.of(house_dir / w["file"]) for w in self.req["wheels"]),
            runtime_env=dict(env),
            runtime_packages=tuple(self.spec.runtime_packages),
            runtime_modules=tuple(self.spec.runtime_modules),
            mpi=mpi,
            module=f"{name}/{version}",
            modulefiles=(str(lua.relative_to(self.prefix)), str(tcl.relative_to(self.prefix))),
            frozen=tuple(frozen),
            size_bytes=_size(self.prefix),
        )
        write_install(manifest, self.prefix / INSTALL_MANIFEST)

    # -- pieces

    def _python(self) -> str:
        """--python, else the Python the wheels were built for (their cpXY tag; for pure-Python
        wheels the profile's python_version): pythonX.Y on PATH, else this interpreter or the
        image's /opt/venv-X.Y when it is X.Y. ToolMissing naming X.Y and the fix otherwise."""
        given = self.req.get("python")
        if given:
            return _on_path(
                given,
                f"--python {given} is not a program here",
                "give the path of a python3.X interpreter where the install runs",
            )
        version = str(self.req.get("python_version") or self.spec.python_version)
        why = "the wheels were built for it" if self.req.get("python_version") else "the profile's python_version"
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

    def _mpicc(self) -> str:
        want = self.spec.mpicc or "mpicc"
        return _on_path(
            want,
            f"the MPI compiler wrapper {want!r} (mpicc) is not on PATH: mpi4py is built with it",
            "load the MPI module (e.g. cray-mpich, with mpicc: cc), or set mpicc to the wrapper",
        )

    def _mpi4py(self, mpicc: str) -> MpiRecord:
        req = mpi4py_requirement(self.spec)
        _say(f"building {req} from source with MPICC={mpicc}")
        self._pip(
            ["install", "--no-binary", MPI4PY, "--no-cache-dir", *self.index, "--", req],
            "building mpi4py",
            env={"MPICC": mpicc},
        )
        probe = "from mpi4py import MPI; import mpi4py, json; print(json.dumps([mpi4py.__version__, MPI.Get_library_version()]))"
        text = self._capture([str(self.py), "-c", probe], "mpi4py's MPI library")
        version, library = json.loads(text.strip().splitlines()[-1])
        first = library.strip().splitlines()[0] if library.strip() else "?"
        _say(f"mpi4py {version} uses: {first}")
        return MpiRecord(mpicc=mpicc, mpi4py=version, library_version=library.strip())

    def _import_check(self) -> None:
        env = {**self.env, **runtime_env(self.spec)}
        for w in self.req["wheels"]:
            module = str(w["project"]).replace("-", "_")
            code = f"import {module} as m; print(getattr(m, '__version__', ''))"
            got = self._capture([str(self.py), "-c", code], f"importing {module}", env=env).strip().splitlines()
            have = got[-1] if got else ""
            if have and have != w["version"]:
                raise InstallFailed(f"{module} imports as {have} in {self.prefix}, the wheel is {w['version']}")
            _say(f"import {module}: {have or 'ok'}")

    def _hook_activate(self, env: Mapping[str, str]) -> None:
        activate = self.prefix / "bin" / "activate"
        with named_os_errors(activate, "adding runtime_env to the activate script"):
            text = activate.read_text()
            try:
                activate.write_text(add_activate_hook(text, env))
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
            proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env or self.env, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise InstallFailed(f"{what} failed in {self.prefix}: " + " | ".join(tail))
        return proc.stdout


# --------------------------------------------------------------------------- which MPI runs


def mpi_check(spec: BuildSpec, backend: Backend, *, out_dir: Path, python: str = "") -> None:
    """Print which MPI library a Python process really loads where backend runs (the image,
    the SIF with host MPI bound in, or here), and MPI_Get_library_version's answer.
    python: an interpreter (an install's bin/python, bound at its own path); default the
    runtime's own. VerifyFailed when host MPI directories were given and the library loaded
    is not from one of them."""
    extra: tuple[Path, ...] = ()
    if python:
        exe = user_path(python).absolute()
        if not exe.parent.parent.is_dir():
            raise PathError(f"--python {exe}: {exe.parent.parent} is not a directory", hint="give PREFIX/bin/python")
        python, extra = str(exe), (exe.parent.parent,)
    backend.check()
    binds = Binds(cache=writable_dir(cache_dir(spec), "cache_dir"), out=writable_dir(out_dir, "--out"), extra=extra)
    request = {
        "spec": spec.to_dict(),
        "python": python,
        "host_mpi": list(getattr(backend.options, "host_mpi", ())),
    }
    backend.run("mpi", request, binds)


def run_mpi_step(payload: Mapping[str, Any]) -> int:
    from torchbuild.core.errors import VerifyFailed
    from torchbuild.delivery import mpiinfo

    spec = spec_from_dict(payload["spec"], "mpi request")
    python = payload.get("python") or sys.executable
    env = {**os.environ, **runtime_env(spec)}
    with named_os_errors(python, "--python"):
        proc = subprocess.run(
            [python, mpiinfo.__file__, "mpi4py.MPI", "torch"], capture_output=True, text=True, env=env, check=False
        )
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
    host = [str(d) for d in payload.get("host_mpi") or []]
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


def _say(text: str) -> None:
    print(text, flush=True)


def _size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):  # a file removed meanwhile counts nothing
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total
