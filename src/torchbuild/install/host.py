"""`invoke install` and `invoke mpi-check` on the host: check the prefix, the wheels and the
runtime before anything is written, stage the wheels as a wheelhouse in the output directory,
and hand the `install` step (install/step.py) to a backend, natively, in the toolchain
image or in the SIF. The prefix is bound at its own path, because a venv is not relocatable.
When the wheel was built with the NCCL and plugin of `invoke comms` (its manifest's `comms`),
that prefix goes to the step too, which copies it into the environment and checks that torch
loads it. A failure or an interrupt leaves no prefix behind."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchbuild.comms.host import COMMS_MANIFEST, read_manifest
from torchbuild.core import console, records
from torchbuild.core.atomic import PARTIAL_PREFIX, atomic_write_text
from torchbuild.core.errors import (
    BuildInterrupted,
    CommsFailed,
    PathError,
    UsageError,
    named_os_errors,
    writable_dir,
)
from torchbuild.core.process import interrupts_unwind
from torchbuild.core.safeio import MANIFEST_LIMIT, read_json, user_path
from torchbuild.install.step import (
    CommsSource,
    InstallRequest,
    ModuleName,
    MpiRequest,
    WheelPin,
    empty_dir,
    say,
)
from torchbuild.install.step import mpi4py_requirement as mpi4py_requirement  # re-exported: batch/host.py
from torchbuild.install.step import wants_mpi4py as wants_mpi4py  # re-exported: batch/host.py
from torchbuild.install.wheelhouse import WheelFile, add_wheels, check_mix, wheels_in
from torchbuild.install.wheelhouse import scan as scan  # re-exported: batch/host.py
from torchbuild.profile.config import BuildSpec, cache_dir
from torchbuild.runtime import elffloor
from torchbuild.runtime import manifest as wheel_manifest
from torchbuild.runtime.backends import Backend, Binds
from torchbuild.runtime.environment import runtime_env
from torchbuild.runtime.manifest import INSTALL_MANIFEST, InstallManifest, read_install

# a prefix ends up in shebangs, PATH, apptainer --bind and modulefiles: keep it to plain characters
_PREFIX_BAD = re.compile(r"[\s:,\"'\\$`]")
# every entry an install made, written when it finished: --force removes an environment only
# when it holds nothing else (what the user added since would go with it)
INSTALL_FILES = "torchbuild-install.files.json"
_CACHE_DIR = "__pycache__"  # bytecode Python writes as the environment is used: nobody's work
_SHOWN = 10


def _entries(prefix: Path) -> set[str]:
    """Every entry under prefix by its relative path (a directory's ends in /), bytecode caches
    aside; a symlink to a directory is listed, not followed."""
    found: set[str] = set()
    for top, dirs, files in os.walk(prefix):
        dirs[:] = [d for d in dirs if d != _CACHE_DIR]
        rel = Path(top).relative_to(prefix)
        found.update(f"{(rel / d).as_posix()}/" for d in dirs)
        found.update((rel / f).as_posix() for f in files)
    return found


def record_files(prefix: Path) -> None:
    """Write prefix's INSTALL_FILES: what the install made (the list itself included)."""
    entries = sorted(_entries(prefix) | {INSTALL_FILES})
    atomic_write_text(prefix / INSTALL_FILES, json.dumps({"schema_version": 1, "entries": entries}) + "\n")


def _check_only_ours(prefix: Path) -> None:
    """PathError unless every entry in prefix is one its install recorded (INSTALL_FILES)."""
    what = f"--prefix {prefix}: {INSTALL_FILES}"
    if not (prefix / INSTALL_FILES).is_file():
        raise PathError(
            f"--prefix {prefix} was installed by a torchbuild that kept no list of its files ({INSTALL_FILES}): "
            "--force cannot tell them from files you added",
            hint=f"move out what you added, remove {prefix} yourself, then install again (or choose another --prefix)",
        )
    data = read_json(prefix / INSTALL_FILES, MANIFEST_LIMIT, what)
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise PathError(f"{what} is not a list of entries", hint=f"remove {prefix} yourself, then install again")
    strangers = sorted(_entries(prefix) - set(entries))
    if strangers:
        more = f" and {len(strangers) - _SHOWN} more" if len(strangers) > _SHOWN else ""
        raise PathError(
            f"--prefix {prefix} holds {len(strangers)} entries torchbuild did not install: "
            f"{', '.join(strangers[:_SHOWN])}{more}",
            hint="move them out of the environment (--force would remove them with it), then run again with --force",
        )


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
        if _new_or_empty(prefix):
            return False
    _check_replaceable(prefix, force)
    return True


def _new_or_empty(prefix: Path) -> bool:
    """Whether prefix is missing (its parent writable) or an empty directory; False for one holding an install
    manifest. PathError for a link, a non-directory, or a non-empty directory without that manifest."""
    if prefix.is_symlink():
        raise PathError(
            f"--prefix {prefix} is a symbolic link (to {os.readlink(prefix)})",
            hint="give the directory it points to as --prefix: a venv records its own path, and torchbuild "
            "never replaces a link",
        )
    if not prefix.exists():
        writable_dir(prefix.parent, "the parent of --prefix")
        return True
    if not prefix.is_dir():
        raise PathError(f"--prefix {prefix} exists and is not a directory", hint="choose a new directory")
    if not any(prefix.iterdir()):
        return True
    if not (prefix / INSTALL_MANIFEST).is_file():
        raise PathError(
            f"--prefix {prefix} is not empty and holds no {INSTALL_MANIFEST}: torchbuild did not make it",
            hint="choose a new directory (torchbuild never removes what it did not install)",
        )
    return False


def _check_replaceable(prefix: Path, force: bool) -> None:
    """PathError unless prefix holds the install torchbuild made at this very path, only that, and --force is
    given."""
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
    with named_os_errors(prefix, "--prefix"):
        _check_only_ours(prefix)


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


def wheel_comms(wheels: Sequence[WheelFile]) -> tuple[Path, dict[str, Any]] | None:
    """The comms prefix (and its torchbuild-comms.json) the wheels' manifests say torch was built
    with; None when none records one (a wheel without a manifest records nothing). CommsFailed
    when that prefix, or a library its manifest names, is gone: the environment could not load it."""
    for w in wheels:
        path = Path(f"{w.path}{wheel_manifest.SUFFIX}")
        if not path.is_file():
            continue
        record = wheel_manifest.read(path).comms
        if record is None:
            continue
        prefix = Path(record.prefix)
        hint = f"run `invoke comms` with the wheel's profile again (it rebuilds {prefix.name}), then install"
        if not (prefix / COMMS_MANIFEST).is_file():
            raise CommsFailed(
                f"{w.path.name} was built with the NCCL of `invoke comms` at {prefix}, which is not there any more",
                hint=hint,
            )
        made = read_manifest(prefix / COMMS_MANIFEST)
        for part in ("nccl", "plugin"):
            library = str((made.get(part) or {}).get("library", ""))
            if library and not (prefix / library).exists():
                raise CommsFailed(f"{prefix / library} ({part} of `invoke comms`) is missing", hint=hint)
        return prefix, made
    return None


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
    _check_module_name(module_name)
    _check_runtime(spec, backend, chosen)
    comms = wheel_comms(chosen)
    backend.check()
    out_dir = writable_dir(out_dir, "--out")
    cache = writable_dir(cache_dir(spec), "cache_dir")
    run_id, stage, tmp = _staging_paths(out_dir)
    name, version = module_identity(chosen, module_name)
    # the comms prefix bound at its own path (it may be in another profile's cache_dir)
    binds = Binds(cache=cache, out=out_dir, extra=(prefix, *links, *([comms[0]] if comms else [])))
    view = backend.view(binds)
    request = InstallRequest(
        spec=spec,
        prefix=str(prefix),
        wheelhouse=str(view.out / stage.name),
        wheels=tuple(WheelPin(w.path.name, str(w.project), str(w.version)) for w in chosen),
        cache=str(view.cache),
        module=ModuleName(name, version),
        run_id=run_id,
        tmp=str(view.out / tmp.name),
        find_links=tuple(str(p) for p in links),
        no_index=no_index,
        python=python,
        python_version=built_for,  # the wheels' Python (their cpXY tag), not the profile's
        engine=backend.engine,
        comms=CommsSource(str(comms[0]), str(comms[0]), comms[1]) if comms else None,
    )
    return _run_and_summarise(backend, request, binds, Staging(prefix, replace, stage, tmp, [w.path for w in chosen]))


def _run_and_summarise(backend: Backend, request: InstallRequest, binds: Binds, staging: Staging) -> InstallManifest:
    """Run the staged install step, then print the summary of the manifest it wrote (and return it)."""
    started = time.monotonic()
    _run_staged(backend, request, binds, staging)
    manifest = read_install(staging.prefix / INSTALL_MANIFEST)
    _summary(manifest, time.monotonic() - started)
    return manifest


def _check_module_name(module_name: str) -> None:
    """A UsageError for a --module-name that is no module name (letters, digits, . _ + -)."""
    if module_name and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*", module_name):
        raise UsageError(f"--module-name {module_name!r} is not a module name", hint="letters, digits, . _ + -")


def _check_runtime(spec: BuildSpec, backend: Backend, chosen: Sequence[WheelFile]) -> None:
    """Refuse now, not in the step, a runtime_env that clashes with the build's and (natively) wheels this host's
    glibc cannot run."""
    runtime_env(spec)  # a runtime_env that clashes with the build's is refused now, not in the step
    if backend.engine == "native":  # in the image or the SIF the environment runs on the image's glibc
        elffloor.check_host([w.path for w in chosen])


def _staging_paths(out_dir: Path) -> tuple[str, Path, Path]:
    """A new run id, and the staged wheelhouse and the step's TMPDIR it names under out_dir."""
    run_id = uuid.uuid4().hex[:12]
    stage = out_dir / f"{PARTIAL_PREFIX}{run_id}-wheelhouse"
    # TMPDIR of the step's processes (ensurepip's and pip's temporary trees): a process stopped
    # by SIGTERM cleans up nothing, so they go where this call removes them on every way out
    tmp = out_dir / f"{PARTIAL_PREFIX}{run_id}-tmp"
    return run_id, stage, tmp


@dataclasses.dataclass(frozen=True)
class Staging:
    """What install() makes around the step: the prefix (replaced with --force), the staged
    wheelhouse and the step's TMPDIR, all under paths the user gave."""

    prefix: Path
    replace: bool
    stage: Path
    tmp: Path
    wheels: list[Path]


def _run_staged(backend: Backend, request: InstallRequest, binds: Binds, st: Staging) -> None:
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
                say(f"removing the environment torchbuild installed at {prefix} (--force)")
                with named_os_errors(prefix, "removing the earlier environment (--force)"):
                    shutil.rmtree(prefix)
            with named_os_errors(prefix, "--prefix"):
                prefix.mkdir(exist_ok=True)
            backend.run("install", records.to_dict(request), binds)
            with named_os_errors(prefix, "recording the environment's files"):
                record_files(prefix)
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
        empty_dir(prefix)
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
        ("python", f"{m.python} ({m.python_version})" + (", with its site-packages" if m.system_site_packages else "")),
        ("wheels", ", ".join(w.name for w in m.wheels)),
        ("packages", str(len(m.frozen))),
        ("mpi4py", f"{m.mpi.mpi4py} against {m.mpi.library_version.splitlines()[0]}" if m.mpi else "-"),
        *((f"checked {p.requirement}", f"{' '.join(p.check)}: ok") for p in m.packages if p.check),
        ("comms", f"{m.comms.prefix} (copied from {m.comms.source})" if m.comms else "-"),
        ("size", f"{m.size_bytes / 2**20:.1f} MiB"),
        ("time", f"{seconds:.1f} s"),
        ("activate", f"source {m.prefix}/bin/activate"),
        ("module", f"module use {m.prefix}/modulefiles && module load {m.module}"),
    ]
    print(console.table(["installed", ""], rows, header=False), flush=True)


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
    request = MpiRequest(
        spec=spec, python=python, host_mpi=tuple(str(d) for d in getattr(backend.options, "host_mpi", ()))
    )
    backend.run("mpi", records.to_dict(request), binds)
