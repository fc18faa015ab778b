"""invoke build / source / patches: the main job."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from ..config import DEFAULT_PROFILE
from ..errors import ProfileError
from ..patches import load_series
from ..progress import MODES
from ..runner import build_in_container, build_native, cache_dir, get_source, patch_tree, prepare
from ..source import update_tree
from .common import HELP, handles_errors, spec_from

SOURCE_HELP = "git URL, local tree, tarball or Debian .dsc (default: the profile's torch_repo at its ref)"


@task(
    help={
        **HELP,
        "in_container": "build inside the profile's toolchain image or SIF (default: natively, on this machine)",
        "engine": "with --in-container: docker (the toolchain image) or apptainer (the SIF from `invoke sif`)",
        "sif": "with --engine apptainer: the SIF (default ./torch-build-<profile>-<arch>.sif)",
        "apptainer": "with --engine apptainer: auto (this host's apptainer, else the builder container), host, docker",
        "nv": "with --engine apptainer: pass --nv (NVIDIA driver and GPUs into the SIF; for GPU nodes)",
        "source": SOURCE_HELP,
        "ref": "git tag, branch or commit (default: the profile's torch_ref, else v<torch_version>)",
        "out": "output directory for the wheel, its manifest and logs (default ./out)",
        "preflight": "configure and build only the preflight targets and canaries (minutes, not hours)",
        "target": "preflight CMake target (repeatable; default: the profile's preflight_targets)",
        "canary": "preflight canary source file (repeatable; default: the profile's canaries)",
        "clean": "remove the tree's build/ directory first (ccache still helps)",
        "jobs": "parallel compile jobs (default: planned from cores and memory)",
        "user": "uid:gid the container runs as (default: yours; docker engine only)",
        "memory": "memory limit of the build container, e.g. 8g (default: none)",
        "no_verify": "skip `invoke verify` of the wheel after the build (it runs where the build ran)",
        "no_retry": "fail with OutOfMemory at the first out-of-memory kill instead of resuming with fewer jobs",
        "progress": "bar (a terminal), lines (a progress line every 30 s, for CI logs), raw (every line); default auto",
    },
    iterable=["set_", "target", "canary"],
)
@handles_errors
def build(
    c: Context,
    profile: str = DEFAULT_PROFILE,
    arch: str = "",
    set_: list[str] | None = None,
    in_container: bool = False,
    engine: str = "docker",
    sif: str = "",
    apptainer: str = "auto",
    nv: bool = False,
    source: str = "",
    ref: str = "",
    out: str = "out",
    preflight: bool = False,
    target: list[str] | None = None,
    canary: list[str] | None = None,
    clean: bool = False,
    jobs: int = 0,
    user: str = "",
    memory: str = "",
    progress: str = "auto",
    no_retry: bool = False,
    no_verify: bool = False,
) -> None:
    """Fetch and patch the source, then build a wheel (or --preflight) with a manifest and a log."""
    spec = spec_from(profile, set_, arch)
    if engine not in ("docker", "apptainer"):
        raise ProfileError(f"unknown --engine {engine!r}", hint="use --engine docker or --engine apptainer")
    if progress not in MODES:
        raise ProfileError(f"unknown --progress {progress!r}", hint=f"use one of {', '.join(MODES)}")
    if progress == "auto":  # decided here: inside a container stdout is never a terminal
        progress = "bar" if sys.stdout.isatty() else "lines"
    if (engine != "docker" or sif or nv) and not in_container:
        raise ProfileError("--engine, --sif and --nv choose a container", hint="add --in-container")
    out_dir = Path(out).expanduser().resolve()
    req = prepare(
        spec,
        source=source,
        ref=ref,
        out_dir=out_dir,
        cache_root=cache_dir(spec),
        preflight=preflight,
        clean=clean,
        jobs=jobs,
        targets=tuple(target or ()),
        canaries=tuple(canary or ()),
        progress=progress,
        oom_retry=not no_retry,
    )
    tree = Path(req.source)
    if in_container and engine == "apptainer":
        from ..sif import build_with_sif, default_sif, locate

        outcome = build_with_sif(
            locate(spec, apptainer),
            Path(sif).expanduser() if sif else default_sif(spec),
            req,
            host_source=tree,
            host_out=out_dir,
            host_cache=cache_dir(spec),
            nv=nv,
            memory_limit=memory or None,
        )
    elif in_container:
        from ..engine import Engine

        outcome = build_in_container(
            Engine.connect(),
            req,
            host_source=tree,
            host_out=out_dir,
            host_cache=cache_dir(spec),
            user=user,
            memory_limit=memory or None,
        )
    else:
        outcome = build_native(req)
    what = outcome.wheel if outcome.wheel else "preflight passed"
    print(f"{what}\nmanifest: {outcome.manifest}\nlog: {outcome.log}")
    if outcome.wheel and not no_verify:
        from ..verify import verify_in

        verify_in(
            ("apptainer" if engine == "apptainer" else "docker") if in_container else "native",
            spec,
            wheel=outcome.wheel,
            sif=Path(sif).expanduser() if sif else None,
            apptainer=apptainer,
            user=user,
        )


def _print_patches(directory: Path | None, applied: tuple[str, ...], skipped: tuple[str, ...]) -> None:
    if directory is None:
        print("patches: none for this version")
        return
    print(f"patches from {directory}: {len(applied)} applied, {len(skipped)} already in the tree")


@task(
    help={
        **HELP,
        "source": SOURCE_HELP,
        "ref": "git tag, branch or commit (default: the profile's)",
        "dest": "where to put the tree (default <cache_dir>/src/pytorch-<ref>)",
        "update": "bring an existing checkout (--dest or --source DIR) to the head of its branch",
        "no_patch": "do not apply the patch series",
    },
    iterable=["set_"],
)
@handles_errors
def source(
    c: Context,
    profile: str = DEFAULT_PROFILE,
    arch: str = "",
    set_: list[str] | None = None,
    source: str = "",
    ref: str = "",
    dest: str = "",
    update: bool = False,
    no_patch: bool = False,
) -> None:
    """Fetch the PyTorch source (git with submodules via a cached mirror, dir, tarball, .dsc) and patch it."""
    spec = spec_from(profile, set_, arch)
    if update:
        tree = Path(dest or source).expanduser()
        info = update_tree(tree)
    else:
        info = get_source(spec, source, ref, dest)
    if not no_patch:
        series, result = patch_tree(spec, info.path)
        _print_patches(series.directory, result.applied, result.skipped)
    print(f"{info.path} ({info.kind}{', ' + info.commit[:12] if info.commit else ''})")


@task(
    help={
        "version": "PyTorch version (default: the profile's torch_version)",
        "profile": HELP["profile"],
        "set_": HELP["set_"],
    },
    iterable=["set_"],
)
@handles_errors
def patches(c: Context, version: str = "", profile: str = DEFAULT_PROFILE, set_: list[str] | None = None) -> None:
    """List the patch series that applies to a PyTorch version, with each patch's sha256."""
    spec = spec_from(profile, set_, "")
    v = version or spec.torch_version
    series = load_series(spec.patches, v)
    if series.directory is None:
        print(f"no patches for pytorch {v}")
        return
    print(f"pytorch {v}: {series.directory} (series sha256 {series.checksum[:16]})")
    for p in series.patches:
        print(f"  {p.name}  {p.sha256[:16]}")
