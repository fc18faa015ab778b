"""invoke build / source / patches: the main job."""

from __future__ import annotations

import sys

from invoke.context import Context

from torchbuild.builder import companions
from torchbuild.builder import host as runner
from torchbuild.builder.host import SOURCE_HELP, BuildInputs, BuildRun, describe_patches, patch_tree
from torchbuild.core.console import printable
from torchbuild.core.errors import UsageError, writable_dir
from torchbuild.core.problems import Problems
from torchbuild.core.progress import MODES
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import cache_dir, parse_jobs_option
from torchbuild.runtime.options import BuildOptions
from torchbuild.runtime.tasks import HELP, Launch, handles_errors, launch_task, spec_from, task
from torchbuild.source.fetch import get_source, load_series, update_tree


@launch_task(models={"where": BuildInputs, "options": BuildOptions, "run": BuildRun})
def build(c: Context, launch: Launch, where: BuildInputs, options: BuildOptions, run: BuildRun) -> None:
    """Fetch and patch the source, then build a wheel (or --preflight) with a manifest and a log."""
    spec = launch.spec()
    pythons = runner.pythons_option(spec, run.python)
    backend = launch.backend(spec)
    runner.build_pythons(
        spec,
        backend,
        runner.places(spec, where.source, where.out),
        pythons,
        ref=where.ref,
        options=options,
        progress=progress_mode(run.progress),
        verify=run.verify,
        resume=run.resume,
    )


def progress_mode(progress: str) -> str:
    """--progress; auto is decided here: inside a container stdout is never a terminal."""
    if progress not in MODES:
        raise UsageError(f"unknown --progress {progress!r}", hint=f"use one of {', '.join(MODES)}")
    if progress == "auto":
        return "bar" if sys.stdout.isatty() else "lines"
    return progress


@task(
    help={
        **HELP,
        "source": SOURCE_HELP,
        "ref": "git tag, branch or commit (default: the profile's)",
        "dest": "where to put the tree (default <cache_dir>/src/pytorch-<ref>)",
        "update": "bring an existing checkout (--dest or --source DIR) and the profile's companion checkouts to the "
        "head of their branches (fast-forward; submodules too)",
        "no_patch": "do not apply the patch series",
    },
    iterable=["set_"],
)
@handles_errors
def source(
    c: Context,
    profile: str = "",
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
    cache = cache_dir(spec)
    if update:
        tree = user_path(dest or source)
        info = update_tree(tree)
        companions.update(spec, cache)  # every companion checkout of the profile, fast-forwarded too
    else:
        info = get_source(spec, source, ref, dest)
        companions.fetch(spec, cache)  # through the same mirror cache, checked against the table
    if not no_patch:
        series, result = patch_tree(spec, info.path)
        print(describe_patches(series, result))
    print(printable(f"{info.path} ({info.kind}{', ' + info.commit[:12] if info.commit else ''})"))


@launch_task(
    help={
        "wheel": "the torch wheel to build the profile's companions against (their wheels go beside it)",
        "jobs": "parallel compile jobs, an integer >= 1 (default: planned from cores and memory)",
        "no_retry": "fail with OutOfMemory at the first out-of-memory kill instead of resuming with fewer jobs",
    },
    name="companions",
)
def companions_(c: Context, launch: Launch, wheel: str = "", jobs: str = "", no_retry: bool = False) -> None:
    """Build the profile's companions (torchvision, torchaudio, torchtext) against a torch wheel, natively, in the image or the SIF."""
    if not wheel:
        raise UsageError("--wheel is required", hint="invoke companions --wheel out/torch-2.6.0+site-....whl")
    # everything local first (the wheel, --jobs, the profile, the engine, the cache), all of it
    # named at once; only then the companions' sources are fetched
    problems = Problems()
    torch_wheel = user_path(wheel).absolute()
    torch_version = problems.check(lambda: companions.check_torch_wheel(torch_wheel))
    max_jobs = problems.check(lambda: parse_jobs_option(jobs))
    spec = problems.check(launch.spec)
    if spec and not spec.companions:
        problems.add(
            UsageError(
                f"profile {spec.profile} lists no companions", hint="--set 'companions=[torchvision, torchaudio]'"
            )
        )
    backend = problems.check(lambda: launch.backend(spec)) if spec else None
    image = problems.check(backend.check) if backend else None
    cache = problems.check(lambda: writable_dir(cache_dir(spec), "cache_dir")) if spec else None
    problems.raise_any()
    assert spec and backend and cache and torch_version is not None and max_jobs is not None
    fetched = companions.fetch(spec, cache, torch_version=str(torch_version))
    options = BuildOptions(jobs=max_jobs, oom_retry=not no_retry)
    runner.companions_with(spec, backend, fetched, torch_wheel, cache=cache, options=options, image=image)


@task(
    help={
        "version": "PyTorch version (default: the profile's torch_version)",
        "profile": HELP["profile"],
        "set_": HELP["set_"],
    },
    iterable=["set_"],
)
@handles_errors
def patches(c: Context, version: str = "", profile: str = "", set_: list[str] | None = None) -> None:
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
