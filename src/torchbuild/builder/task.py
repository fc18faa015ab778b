"""invoke build / source / patches: the main job."""

from __future__ import annotations

import dataclasses
import sys

from invoke.context import Context

from torchbuild.builder import companions
from torchbuild.builder import host as runner
from torchbuild.builder.host import SOURCE_HELP, BuildInputs, BuildRun, describe_patches, patch_tree
from torchbuild.core.console import printable
from torchbuild.core.errors import UsageError, writable_dir
from torchbuild.core.options import option
from torchbuild.core.problems import Problems
from torchbuild.core.progress import MODES
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import cache_dir
from torchbuild.runtime.options import NOT_COMPILE_OPTIONS, BuildOptions, ProfileChoice
from torchbuild.runtime.tasks import Launch, launch_task, options_task
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


@dataclasses.dataclass(frozen=True)
class SourceFetch:
    """`invoke source`'s own options: what to fetch, where to, and whether to patch it."""

    source: str = option("", SOURCE_HELP)
    ref: str = option("", "git tag, branch or commit (default: the profile's)")
    dest: str = option("", "where to put the tree (default <cache_dir>/src/pytorch-<ref>)")
    update: bool = option(
        False,
        "bring an existing checkout (--dest or --source DIR) and the profile's companion checkouts to the "
        "head of their branches (fast-forward; submodules too)",
    )
    no_patch: bool = option(False, "do not apply the patch series")


@options_task(models={"choice": ProfileChoice, "given": SourceFetch})
def source(c: Context, choice: ProfileChoice, given: SourceFetch) -> None:
    """Fetch the PyTorch source (git with submodules via a cached mirror, dir, tarball, .dsc) and patch it."""
    spec = choice.spec()
    cache = cache_dir(spec)
    if given.update:
        tree = user_path(given.dest or given.source)
        info = update_tree(tree)
        companions.update(spec, cache)  # every companion checkout of the profile, fast-forwarded too
    else:
        info = get_source(spec, given.source, given.ref, given.dest)
        companions.fetch(spec, cache)  # through the same mirror cache, checked against the table
    if not given.no_patch:
        series, result = patch_tree(spec, info.path)
        print(describe_patches(series, result))
    print(printable(f"{info.path} ({info.kind}{', ' + info.commit[:12] if info.commit else ''})"))


@dataclasses.dataclass(frozen=True)
class CompanionsWheel:
    """`invoke companions`' own option: the torch wheel (--jobs and --no-retry are BuildOptions')."""

    wheel: str = option("", "the torch wheel to build the profile's companions against (their wheels go beside it)")


@launch_task(models={"given": CompanionsWheel, "options": BuildOptions}, exclude=NOT_COMPILE_OPTIONS, name="companions")
def companions_(
    c: Context, launch: Launch, given: CompanionsWheel, *, options: BuildOptions, problems: Problems
) -> None:
    """Build the profile's companions (torchvision, torchaudio, torchtext) against a torch wheel, natively, in the image or the SIF."""
    if not given.wheel:
        raise UsageError("--wheel is required", hint="invoke companions --wheel out/torch-2.6.0+site-....whl")
    # everything local first (the wheel, --jobs, the profile, the engine, the cache), all of it
    # named at once; only then the companions' sources are fetched. A bad --jobs is in problems
    # already (from_flags): the wheel's problem goes before it, as the first problem's class is the exit code
    flag_problems, problems = problems, Problems()
    torch_wheel = user_path(given.wheel).absolute()
    torch_version = problems.check(lambda: companions.check_torch_wheel(torch_wheel))
    for found in flag_problems.found:
        problems.add(found)
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
    assert spec and backend and cache and torch_version is not None
    fetched = companions.fetch(spec, cache, torch_version=str(torch_version))
    runner.companions_with(spec, backend, fetched, torch_wheel, cache=cache, options=options, image=image)


@dataclasses.dataclass(frozen=True)
class PatchVersion:
    """`invoke patches`' own option: the PyTorch version (--profile and --set are ProfileChoice's; no --arch)."""

    version: str = option("", "PyTorch version (default: the profile's torch_version)")


@options_task(models={"given": PatchVersion, "choice": ProfileChoice}, exclude=("arch",))
def patches(c: Context, given: PatchVersion, choice: ProfileChoice) -> None:
    """List the patch series that applies to a PyTorch version, with each patch's sha256."""
    spec = choice.spec()  # no --arch: the default arch's
    v = given.version or spec.torch_version
    series = load_series(spec.patches, v)
    if series.directory is None:
        print(f"no patches for pytorch {v}")
        return
    print(f"pytorch {v}: {series.directory} (series sha256 {series.checksum[:16]})")
    for p in series.patches:
        print(f"  {p.name}  {p.sha256[:16]}")
