"""`invoke comms` on the host: everything that can be checked here is checked (libfabric_prefix,
which is bound at its own path; natively also nvcc, make and autotools), every problem named at
once; the sources are fetched and unpacked into the cache; the comms step runs through the
backend into <cache>/comms/<key> unless that prefix is there already (comms/step.py has the
step and the key)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from torchbuild.comms.step import COMMS_MANIFEST as COMMS_MANIFEST  # re-exported: builder, install
from torchbuild.comms.step import (
    NCCL_ARCHIVE,
    OFI_ARCHIVE,
    OFI_PINS,
    Part,
    Request,
    check_libfabric,
    comms_dir,
    comms_key,
    find_library,
    no_libfabric,
    plugin_needs_autotools,
    tool_problems,
)
from torchbuild.comms.step import link_env as link_env  # re-exported: builder/host.py
from torchbuild.comms.step import read_manifest as read_manifest  # re-exported: builder, install
from torchbuild.core import console, records
from torchbuild.core.errors import UsageError, named_os_errors, writable_dir
from torchbuild.core.problems import Problems
from torchbuild.profile.config import BuildSpec, cache_dir, wanted
from torchbuild.runtime.apptainer import runtime_binds, sif_id
from torchbuild.runtime.backends import Backend, Binds
from torchbuild.runtime.backends.apptainer import ApptainerBackend
from torchbuild.runtime.environment import build_env
from torchbuild.runtime.libraries import copy_dependencies, host_dependencies
from torchbuild.source.fetch import Source, fetch


@dataclasses.dataclass(frozen=True)
class Comms:
    """What `comms` made (or found made): the prefix on the host and as the step sees it."""

    prefix: Path
    view: Path
    manifest: dict[str, Any]
    built_now: bool


def comms(
    spec: BuildSpec,
    backend: Backend,
    *,
    out_dir: Path,
    out: TextIO = sys.stdout,
    jobs: int = 0,
    oom_retry: bool = True,
) -> Comms:
    """Build NCCL and the plugin the profile asks for with backend, unless a prefix of the same
    key is there already. jobs: --jobs (0: planned where the step runs, from its cores and
    memory); oom_retry: resume a make with fewer jobs after an out-of-memory kill."""
    _check_wanted(spec)
    image, out_dir, cache, libfabric = _check(spec, backend, out_dir)
    nccl, plugin = _fetch(spec, cache, out)
    host_libs, host_digest = _host_libraries(spec, backend, cache, out) if plugin else (None, "")
    key = comms_key(spec, nccl, plugin, toolchain_identity(backend, image), libfabric, host_digest)
    prefix = cache / "comms" / comms_dir(spec, key)
    binds = _binds(spec, backend, cache, out_dir, (nccl, plugin))
    view = backend.view(binds)
    view_prefix = view.cache / prefix.relative_to(cache)
    done = prefix / COMMS_MANIFEST
    if done.is_file():
        return _up_to_date(spec, backend, prefix, view_prefix, out)
    request = Request(
        spec=spec,
        key=key,
        prefix=str(view_prefix),
        run_id=uuid.uuid4().hex[:12],
        nccl=Part.of(nccl, nccl.tree) if nccl else None,
        plugin=Part.of(plugin, plugin.tree) if plugin else None,
        image=image,
        engine=backend.engine,
        jobs=jobs,
        oom_retry=oom_retry,
        host_libs=str(view.cache / host_libs.relative_to(cache)) if host_libs else "",
    )
    _run_step(backend, request, binds, prefix)
    manifest = read_manifest(done)
    _summary(manifest, prefix)
    return _bound(spec, backend, Comms(prefix, view_prefix, manifest, built_now=True))


def _binds(
    spec: BuildSpec, backend: Backend, cache: Path, out_dir: Path, sources: tuple[Source | None, Source | None]
) -> Binds:
    """The step's binds: the cache, out_dir, the NCCL and plugin trees, and (in a container) the site's libfabric,
    read-only."""
    read_only = (Path(spec.libfabric_prefix),) if spec.libfabric_prefix and backend.name != "native" else ()
    return Binds(cache=cache, out=out_dir, extra=tuple(s.tree for s in sources if s), read_only=read_only)


def _check_wanted(spec: BuildSpec) -> None:
    """UsageError for a profile that builds neither NCCL nor a plugin."""
    if not wanted(spec):
        raise UsageError(
            f"profile {spec.profile} builds neither NCCL nor a plugin (nccl: {spec.nccl}, no aws_ofi_nccl_version)",
            hint="set nccl: source and/or aws_ofi_nccl_version (e.g. --set nccl=source)",
        )


def _up_to_date(spec: BuildSpec, backend: Backend, prefix: Path, view_prefix: Path, out: TextIO) -> Comms:
    """The prefix already built with this key: said so, and bound for backend."""
    manifest = read_manifest(prefix / COMMS_MANIFEST)
    print(f"comms: {prefix} is up to date (built {manifest.get('finished', '?')}); nothing to do", file=out)
    return _bound(spec, backend, Comms(prefix, view_prefix, manifest, built_now=False))


def _run_step(backend: Backend, request: Request, binds: Binds, prefix: Path) -> None:
    """Run the comms step that builds prefix; its partial directory is removed on every way out."""
    with named_os_errors(prefix.parent, "cache_dir"):
        prefix.parent.mkdir(parents=True, exist_ok=True)
    try:
        backend.run("comms", records.to_dict(request), binds)
    finally:  # a container stopped mid-build cannot clean up after itself
        shutil.rmtree(prefix.with_name(f"{prefix.name}.partial-{request.run_id}"), ignore_errors=True)


def _host_libraries(spec: BuildSpec, backend: Backend, cache: Path, out: TextIO) -> tuple[Path | None, str]:
    """For a step in a container: the libraries the site's libfabric takes from this host's own
    directories (a Cray node's /usr/lib64/libcxi.so.1, libjson-c...), which the container does not
    have, copied once into <cache>/hostlibs/<digest> (the step links against those its
    container lacks, and the plugin carries them in deps/lib). (None, "") natively, without a
    libfabric_prefix, or when libfabric takes nothing from outside its prefix."""
    if backend.name == "native" or not spec.libfabric_prefix:
        return None, ""
    root = Path(spec.libfabric_prefix)
    library = find_library(root, "libfabric.so.1") or find_library(root, "libfabric.so")
    if library is None:
        return None, ""
    env = dict(os.environ)  # as the site's libfabric module has it: its directory on the path
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(library.parent), env.get("LD_LIBRARY_PATH", "")) if p)
    deps = host_dependencies(library, root, env)
    if not deps:
        return None, ""
    stats = [(d.name, os.path.realpath(d.path), os.stat(d.path).st_size, os.stat(d.path).st_mtime_ns) for d in deps]
    digest = hashlib.sha256(json.dumps(sorted(stats)).encode()).hexdigest()
    dest = cache / "hostlibs" / digest[:16]
    partial = dest.with_name(f"{dest.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        with named_os_errors(partial, "cache_dir (copying the host's libraries libfabric links)"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.is_dir():
                copy_dependencies(deps, partial)
                try:
                    partial.rename(dest)
                except OSError:
                    if not dest.is_dir():  # else another run made the same copy first
                        raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"comms: libfabric takes {', '.join(sorted(d.name for d in deps))} from this host: {dest}", file=out)
    return dest, digest


def toolchain_identity(backend: Backend, image: Mapping[str, Any] | None) -> str:
    """What the key records of the toolchain the step ran in: the image's id (the same for the
    image and the SIF converted from it, which carries what the image built), else the SIF's own
    ID (a recipe SIF: another SIF, even from the same recipe, builds again), else the backend's
    name (natively: this host's tools)."""
    if image and image.get("id"):
        return str(image["id"])
    if isinstance(backend, ApptainerBackend):
        return f"sif:{sif_id(backend.sif)}"
    return backend.name


def _bound(spec: BuildSpec, backend: Backend, made: Comms) -> Comms:
    """The SIF's later steps in this run (the build, verify, install) see the comms at SIF_COMMS
    and the site's libfabric, as a job running torch in the SIF does (runtime_binds)."""
    if isinstance(backend, ApptainerBackend):
        backend.comms_binds = tuple(runtime_binds(made.prefix, spec))
    return made


def _check(spec: BuildSpec, backend: Backend, out_dir: Path) -> tuple[dict[str, Any] | None, Path, Path, str]:
    """Everything that can be checked here, all of it named at once, before any download: the
    image (or SIF) record, the output and the cache directories, and the version of the
    libfabric at libfabric_prefix ("" when the image's own is used)."""
    problems = Problems()
    native = backend.name == "native"
    libfabric = ""
    if spec.aws_ofi_nccl_version and (spec.libfabric_prefix or native):
        # libfabric_prefix is bound at its own path (a container engine would create a missing
        # bind source as root); natively the step's libfabric is this host's
        found = problems.check(lambda: check_libfabric(spec))
        libfabric = f"{found[1][0]}.{found[1][1]}" if found and spec.libfabric_prefix else ""
    elif spec.libfabric_prefix and not native and not Path(spec.libfabric_prefix).is_dir():
        problems.add(no_libfabric(f"libfabric_prefix: no libfabric at {spec.libfabric_prefix} (not a directory)"))
    if native:  # the step runs here: its compilers and tools are this host's
        path = {**os.environ, **build_env(spec, cache_root=str(cache_dir(spec)), jobs=1)}.get("PATH")
        for problem in tool_problems(spec, bool(spec.nccl == "source"), plugin_needs_autotools(spec), path):
            problems.add(problem)
    image = problems.check(backend.check)
    out_dir = problems.check(lambda: writable_dir(out_dir, "--out")) or out_dir
    cache = problems.check(lambda: writable_dir(cache_dir(spec), "cache_dir")) or cache_dir(spec)
    problems.raise_any()
    return image, out_dir, cache, libfabric


def _fetch(spec: BuildSpec, cache: Path, out: TextIO) -> tuple[Source | None, Source | None]:
    """NCCL's and the plugin's sources, as the profile asks for them (None: not built)."""
    nccl = plugin = None
    if spec.nccl == "source":
        default = NCCL_ARCHIVE.format(version=spec.nccl_version)
        nccl = fetch("nccl", spec.nccl_source, default, spec.nccl_sha256, cache, out, ref=f"v{spec.nccl_version}")
    if spec.aws_ofi_nccl_version:
        default = OFI_ARCHIVE.format(version=spec.aws_ofi_nccl_version)
        sha = spec.aws_ofi_nccl_sha256 or (
            "" if spec.aws_ofi_nccl_source else OFI_PINS.get(spec.aws_ofi_nccl_version, "")
        )
        ref = f"v{spec.aws_ofi_nccl_version}"
        plugin = fetch("aws_ofi_nccl", spec.aws_ofi_nccl_source, default, sha, cache, out, ref=ref)
    return nccl, plugin


def _summary(m: Mapping[str, Any], prefix: Path) -> None:
    rows = [("prefix", str(prefix))]
    if m.get("nccl"):
        n = m["nccl"]
        rows.append(
            ("nccl", f"{n['version']} ({n['gencode']}), {n['seconds']:.0f} s, {n['size_bytes'] / 2**20:.1f} MiB")
        )
    if m.get("plugin"):
        p = m["plugin"]
        rows.append(
            (
                "aws-ofi-nccl",
                f"{p['version']} against libfabric {p['libfabric_version']}, {p['seconds']:.0f} s, "
                f"{p['size_bytes'] / 2**20:.1f} MiB, {', '.join(p['symbols'])}",
            )
        )
    print(console.table(["comms", ""], rows, header=False), flush=True)
