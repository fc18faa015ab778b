"""The one launch path: from `invoke build` (or `torchbuild build` in the image or SIF) to a
step run by a backend.

    check the backend (engine, image or SIF)   -- before anything is fetched or patched
    check the output and cache directories     -- named errors, nothing written elsewhere
    get the tree, apply the patch series
    the build request, in the paths the backend shows the step
    backend.run("build", ...), then the manifest of that run
    backend.run("verify", ...) on the wheel, where the build ran (verify/host.py's verify_with)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from torchbuild.builder.buildenv import BuildVenv as BuildVenv  # re-exported: batch/jobplaces.py
from torchbuild.builder.buildenv import ensure as ensure  # re-exported: batch/jobplaces.py
from torchbuild.builder.companions import Fetched, Job
from torchbuild.builder.companions import Request as CompanionsRequest
from torchbuild.builder.companions import derived_refs as derived_refs  # re-exported: configview/render.py
from torchbuild.builder.companions import fetch as fetch_companions
from torchbuild.builder.repro import source_date_epoch
from torchbuild.builder.resume import Record, request_key
from torchbuild.builder.step import BuildRequest, Outcome
from torchbuild.comms.host import comms as build_comms
from torchbuild.comms.host import link_env
from torchbuild.core import records
from torchbuild.core.errors import SourceError, TorchbuildError, UsageError, named_os_errors, writable_dir
from torchbuild.core.options import option
from torchbuild.core.safeio import sha256_file, user_path
from torchbuild.profile.config import BuildSpec, cache_dir
from torchbuild.profile.config import wanted as comms_wanted
from torchbuild.runtime import manifest
from torchbuild.runtime.backends import Backend, Binds
from torchbuild.runtime.environment import cuda_home
from torchbuild.runtime.options import BuildOptions
from torchbuild.source.fetch import (
    ApplyResult,
    Series,
    SourceInfo,
    apply_series,
    get_source,
    load_series,
    looks_like_url,
)
from torchbuild.verify.host import built_tree, verify_with


def in_container() -> bool:
    """True inside the toolchain image (Docker) or a SIF."""
    return (
        bool(os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER"))
        or Path("/.dockerenv").exists()
    )


def _bound(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


@dataclasses.dataclass(frozen=True)
class Places:
    """Where a build reads and writes on the host: the source as given, the output, the cache."""

    source: str
    out: Path
    cache: Path


def places(spec: BuildSpec, source: str, out: str) -> Places:
    """The paths a build uses. Inside the image or a SIF the binds are the defaults: the tree
    at /src, the output at /out (else ./out) and the cache at /cache (else cache_dir)."""
    inside = in_container()
    if source and not looks_like_url(source):
        user_path(source, "--source")  # ~user of no user, a NUL byte: named before --out is made
    if not source and inside:
        if not any(Path("/src", f).is_file() for f in ("setup.py", "pyproject.toml")):
            raise SourceError(
                "no PyTorch tree at /src",
                hint="bind one (apptainer run --bind /path/to/pytorch:/src ...) or pass --source",
            )
        source = "/src"
    if not out:
        out = "/out" if inside and _bound("/out") else "out"
    cache = Path("/cache") if inside and _bound("/cache") else cache_dir(spec)
    return Places(source, Path(out), cache)


def patch_tree(spec: BuildSpec, tree: Path) -> tuple[Series, ApplyResult]:
    series = load_series(spec.patches, spec.torch_version)
    return series, apply_series(tree, series)


def describe_patches(series: Series, result: ApplyResult) -> str:
    if series.directory is None:
        return "patches: none for this version"
    return f"patches from {series.directory}: {len(result.applied)} applied, {len(result.skipped)} already in the tree"


def provenance(info: SourceInfo, series: Series, result: ApplyResult) -> dict[str, Any]:
    return {
        "source": info.to_dict(),
        "patches": {
            "series": str(series.directory) if series.directory else None,
            "checksum": series.checksum,
            "patches": [p.to_dict() for p in series.patches],
            "applied_now": list(result.applied),
            "already_applied": list(result.skipped),
        },
    }


SOURCE_HELP = "git URL, local tree, tarball or Debian .dsc (default: the profile's torch_repo at its ref)"
_REF_HELP = "git tag, branch or commit (default: the profile's torch_ref, else v<torch_version>)"


# What `invoke build` takes, in three models (core/options.py): where the build reads and writes
# (BuildInputs), what it asks of the compile (BuildOptions), and how the run goes (BuildRun).
# Each field is one flag of `invoke build` (and of `invoke submit`, which passes them on to the
# build in its job: core.options.to_argv), with its help.


@dataclasses.dataclass(frozen=True)
class BuildInputs:
    """The source the build reads and the directory it writes."""

    source: str = option("", SOURCE_HELP + "; in the image or SIF: /src")
    ref: str = option("", _REF_HELP)
    out: str = option(
        "", "output directory for the wheel, its manifest and logs (default ./out; in the image or SIF: /out)"
    )


@dataclasses.dataclass(frozen=True)
class BuildRun:
    """How the run goes: its progress display, the wheel's check, resuming, and the Pythons."""

    progress: str = option(
        "auto", "bar (a terminal), lines (a progress line every 30 s, for CI logs), raw (every line); default auto"
    )
    verify: bool = option(
        True, "skip `invoke verify` of the wheel after the build (it runs where the build ran)", flag="no_verify"
    )
    resume: bool = option(
        False,
        "skip the steps an earlier run of this same request finished (source, wheel, verify); batch jobs always resume",
    )
    python: str = option(
        "",
        "X.Y[,X.Y...] or all: one wheel per Python from one tree and ccache (the profile's python_version and "
        "python_versions); default: the interpreter the build runs on",
    )


def build(
    spec: BuildSpec,
    backend: Backend,
    where: Places,
    *,
    ref: str = "",
    options: BuildOptions = BuildOptions(),
    verify: bool = True,
    resume: bool = False,
    python: str = "",
    progress: str = "lines",
    out: TextIO = sys.stdout,
) -> Outcome:
    """Check, fetch, patch, build with `backend`, then verify the wheel where it was built.
    With resume, the steps this request finished in an earlier run are skipped (resume.py).
    python: X.Y to build with (one of spec.pythons); "": the interpreter the step runs on.
    progress: the mode the step shows (bar, lines, raw: --progress as the task decided it)."""
    image = backend.check()
    out_dir = writable_dir(where.out, "--out")
    cache = writable_dir(where.cache, "cache_dir")
    done = (
        Record.load(out_dir, key_of(spec, where, ref, options, backend, python))
        if resume and not options.clean
        else Record.off()
    )
    outcome = _finished_build(done, out_dir, out)
    # the companions are fetched and paired with torch before anything compiles; they are built
    # with the step's own interpreter, so only beside a wheel for it
    primary = python in ("", spec.python_version)
    wanted = spec.companions and not options.preflight and primary
    fetched = fetch_companions(spec, cache, out=out) if wanted else []
    if outcome is None:
        dirs = Places(where.source, out_dir, cache)
        outcome = _build_step(spec, backend, dirs, ref, options, done, image, python, out, progress)
    print(f"{outcome.wheel or 'preflight passed'}\nmanifest: {outcome.manifest}\nlog: {outcome.log}", file=out)
    if outcome.wheel and fetched:
        companions_with(spec, backend, fetched, outcome.wheel, cache=cache, options=options, image=image, out=out)
    if outcome.wheel and verify:
        _verify_once(spec, backend, done, outcome.wheel, outcome.manifest, cache=cache, python=python, out=out)
    return outcome


def _verify_once(
    spec: BuildSpec,
    backend: Backend,
    done: Record,
    wheel: Path,
    built: Path,
    *,
    cache: Path,
    python: str,
    out: TextIO,
) -> None:
    """Verify the wheel where it was built (built: its manifest), unless an earlier run of this request verified
    this very wheel (resume)."""
    digest = sha256_file(wheel)
    if _verified(done, wheel, digest):
        print(
            f"resume: skipping verify: {wheel.name} passed it before ({wheel}.verify.json)",
            file=out,
        )
    else:
        tree = built_tree(built)
        verify_with(spec, backend, wheel=wheel, cache=cache, checked=True, python=python, tree=tree)
        done.done("verify", wheel_sha256=digest)


def _build_provenance(
    source: Mapping[str, Any], backend: Backend, image: dict[str, Any] | None, linked: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The build request's provenance: the source's, the engine, and the image and comms prefix where there are."""
    return {
        **source,
        "engine": backend.engine,
        **({"image": image} if image else {}),
        **({"comms": linked} if linked else {}),
    }


def _build_step(
    spec: BuildSpec,
    backend: Backend,
    where: Places,
    ref: str,
    options: BuildOptions,
    done: Record,
    image: dict[str, Any] | None,
    python: str,
    out: TextIO,
    progress: str,
) -> Outcome:
    """NCCL first where the profile builds it, the patched tree, then the build step's typed
    request handed to the backend; what the step wrote (where: the checked directories)."""
    out_dir, cache = where.out, where.cache
    extra_env, linked = _comms(spec, backend, out_dir, out, options)
    info, series, result = _source(spec, where, ref, done, out)
    epoch = source_date_epoch(info, {**os.environ, **spec.env})
    binds = Binds(cache=cache, out=out_dir, src=info.path)
    view = backend.view(binds)
    req = BuildRequest(
        spec=spec,
        source=str(view.src),
        out_dir=str(view.out),
        cache_root=str(view.cache),
        provenance=_build_provenance(provenance(info, series, result), backend, image, linked),
        backend=backend.name,
        extra_env=extra_env,
        python=python,
        progress=progress,
        source_date_epoch=epoch.seconds,
        epoch_origin=epoch.origin,
        cuda_home=cuda_home(spec, backend.name)[0] if spec.cuda else "",
        **dataclasses.asdict(options),
    )
    backend.run("build", records.to_dict(req), binds)
    outcome = outcome_of(out_dir, req.run_id)
    done.done("wheel", run_id=req.run_id)
    return outcome


def pythons_option(spec: BuildSpec, text: str) -> tuple[str, ...]:
    """--python: "" (the step's own interpreter), "all" (spec.pythons) or X.Y[,X.Y...], each one
    the profile provides (python_version or python_versions): the image has only those."""
    if not text.strip():
        return ()
    if text.strip() == "all":
        return spec.pythons
    asked = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    unknown = [v for v in asked if v not in spec.pythons]
    if unknown or not asked:
        raise UsageError(
            f"--python {text}: {', '.join(unknown) or 'no version'} is not among the profile's Pythons "
            f"({', '.join(spec.pythons)})",
            hint="add it to python_versions (then `invoke image`), or choose from those; `--python all` builds each",
        )
    return asked


def build_pythons(
    spec: BuildSpec, backend: Backend, where: Places, pythons: Sequence[str], *, out: TextIO = sys.stdout, **kw: Any
) -> list[Outcome]:
    """One wheel per Python from one tree and one ccache, in order: each build reconfigures for
    its interpreter, and ninja and ccache reuse every object whose compile does not involve
    Python. Each wheel is verified in its own interpreter. Stops at the first failure."""
    outcomes = []
    for i, python in enumerate(pythons or ("",)):
        if len(pythons) > 1:
            print(f"== Python {python} ({i + 1} of {len(pythons)})", file=out)
        outcomes.append(build(spec, backend, where, python=python, out=out, **kw))
    if len(outcomes) > 1:
        for python, o in zip(pythons, outcomes):
            print(f"Python {python}: {o.wheel}", file=out)
    return outcomes


def _comms(
    spec: BuildSpec, backend: Backend, out_dir: Path, out: TextIO, options: BuildOptions = BuildOptions()
) -> tuple[dict[str, str], dict[str, Any] | None]:
    """NCCL and the plugin the profile builds from source (a no-op when they are built): the
    variables that link torch to that NCCL, and what the wheel's manifest records of them."""
    if not comms_wanted(spec):
        return {}, None
    made = build_comms(spec, backend, out_dir=out_dir, out=out, jobs=options.jobs, oom_retry=options.oom_retry)
    m = made.manifest
    record: dict[str, Any] = {"prefix": str(made.prefix), "key": m.get("key", "")}
    if m.get("nccl"):
        record["nccl"] = {k: m["nccl"][k] for k in ("version", "version_code", "sha256", "gencode", "library")}
    if m.get("plugin"):
        record["plugin"] = {
            k: m["plugin"][k]
            for k in ("version", "sha256", "libfabric_prefix", "libfabric_version", "library", "symbols")
        }
    return link_env(str(made.view), m), record


def companions_with(
    spec: BuildSpec,
    backend: Backend,
    fetched: list[Fetched],
    torch_wheel: Path,
    *,
    cache: Path,
    options: BuildOptions = BuildOptions(),
    run_id: str = "",
    image: dict[str, Any] | None = None,
    out: TextIO = sys.stdout,
) -> list[Path]:
    """Build the fetched companions against torch_wheel with `backend` (the companions step);
    their wheels land beside it. A tree outside the cache is bound at its own path."""
    out_dir = torch_wheel.parent
    local = tuple(f.tree for f in fetched if not f.tree.is_relative_to(cache))
    binds = Binds(cache=cache, out=out_dir, extra=local)
    view = backend.view(binds)
    jobs = tuple(
        Job.of(f, str(view.cache / f.tree.relative_to(cache)) if f.tree.is_relative_to(cache) else str(f.tree))
        for f in fetched
    )
    req = CompanionsRequest(
        spec=spec,
        torch_wheel=str(view.out / torch_wheel.name),
        jobs=jobs,
        out_dir=str(view.out),
        cache_root=str(view.cache),
        run_id=run_id or uuid.uuid4().hex[:12],
        backend=backend.name,
        max_jobs=options.jobs,
        oom_retry=options.oom_retry,
        provenance={"image": image} if image else {},
    )
    # run_id at the top: on a failure or Ctrl-C the backend removes the step's .partial-<run_id>* too
    backend.run("companions", records.to_dict(req), binds)
    return _companions_made(out_dir, req.run_id, out)


def _companions_made(out_dir: Path, run_id: str, out: TextIO) -> list[Path]:
    """The companion wheels the step of run_id made in out_dir (found through their manifests), each printed."""
    made = []
    with named_os_errors(out_dir, "looking for the companions' manifests"):
        for path in sorted(out_dir.glob(f"*{manifest.SUFFIX}")):
            if not manifest.mentions(path, f'"{run_id}.'):
                continue  # another run's
            m = manifest.read(path)
            if m.companion is not None and m.wheel is not None:
                made.append(out_dir / m.wheel.name)
                print(f"{m.companion.name}: {out_dir / m.wheel.name} ({m.companion.check})", file=out)
    return made


def key_of(
    spec: BuildSpec, where: Places, ref: str, options: BuildOptions, backend: Backend | str, python: str = ""
) -> str:
    """The request's hash (resume.request_key) for a build of where.source at ref."""
    source = where.source
    if source and not looks_like_url(source):
        source = str(user_path(source).absolute())
    return request_key(
        spec.hash,
        source,
        ref,
        preflight=options.preflight,
        targets=options.targets,
        canaries=options.canaries,
        backend=backend if isinstance(backend, str) else backend.name,
        python=python,
    )


def _source(
    spec: BuildSpec, where: Places, ref: str, done: Record, out: TextIO
) -> tuple[SourceInfo, Series, ApplyResult]:
    """The patched tree: fetched and patched now, or (resuming) as an earlier run left it."""
    series = load_series(spec.patches, spec.torch_version)
    earlier = done.get("source")
    if earlier is not None:
        info = SourceInfo.from_dict(earlier["info"])
        if info.path.is_dir() and earlier.get("series") == series.checksum:
            print(f"resume: skipping source: {info.path} was fetched and patched by an earlier run", file=out)
            return info, series, ApplyResult(applied=(), skipped=tuple(p.name for p in series.patches))
        done.forget("source", "wheel", "verify")
    info = get_source(spec, where.source, ref, out=out)
    result = apply_series(info.path, series)
    print(describe_patches(series, result), file=out)
    done.done("source", info=info.to_dict(), series=series.checksum)
    return info, series, result


def _finished_build(done: Record, out_dir: Path, out: TextIO) -> Outcome | None:
    """The outcome of the build step an earlier run of this request finished, while its wheel
    is still there with the sha256 its manifest records; None otherwise."""
    earlier = done.get("wheel")
    if earlier is None:
        return None
    try:
        m, path = manifest.find_run(out_dir, str(earlier["run_id"]))
    except TorchbuildError:
        m = None
    if m is not None and m.wheel is not None:
        wheel = out_dir / m.wheel.name
        if wheel.is_file() and sha256_file(wheel) == m.wheel.sha256:
            print(f"resume: skipping the build: {wheel.name} (sha256 {m.wheel.sha256[:16]}) is there", file=out)
            return Outcome(wheel, path, out_dir / "logs" / m.log)
    elif m is not None:
        print(f"resume: skipping the preflight: run {m.run_id} passed it", file=out)
        return Outcome(None, path, out_dir / "logs" / m.log)
    done.forget("wheel", "verify")
    return None


def _verified(done: Record, wheel: Path, digest: str) -> bool:
    earlier = done.get("verify")
    return bool(earlier and earlier.get("wheel_sha256") == digest and Path(f"{wheel}.verify.json").is_file())


def outcome_of(host_out: Path, run_id: str) -> Outcome:
    """Find what the step wrote: the manifest of this run names the wheel and the log."""
    m, path = manifest.find_run(host_out, run_id)
    return Outcome(host_out / m.wheel.name if m.wheel else None, path, host_out / "logs" / m.log)
