"""The one launch path: from `invoke build` / `invoke verify` (or `torchbuild build` in the
image or SIF) to a step run by a backend.

    check the backend (engine, image or SIF)   -- before anything is fetched or patched
    check the output and cache directories     -- named errors, nothing written elsewhere
    get the tree, apply the patch series
    the build request, in the paths the backend shows the step
    backend.run("build", ...), then the manifest of that run
    backend.run("verify", ...) on the wheel, where the build ran
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from . import manifest
from .backends import Backend, Binds
from .build import BuildRequest, Outcome
from .config import BuildSpec, cache_dir
from .errors import SourceError, UsageError, writable_dir
from .patches import ApplyResult, Series, apply_series, load_series
from .source import SourceInfo, get_source


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
    if not source and inside:
        if not Path("/src/setup.py").is_file():
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


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What `invoke build` asks of the build itself (BuildRequest's knobs)."""

    preflight: bool = False
    clean: bool = False
    jobs: int = 0
    targets: tuple[str, ...] = ()
    canaries: tuple[str, ...] = ()
    progress: str = "lines"
    oom_retry: bool = True


def build(
    spec: BuildSpec,
    backend: Backend,
    where: Places,
    *,
    ref: str = "",
    options: BuildOptions = BuildOptions(),
    verify: bool = True,
    out: TextIO = sys.stdout,
) -> Outcome:
    """Check, fetch, patch, build with `backend`, then verify the wheel where it was built."""
    image = backend.check()
    out_dir = writable_dir(where.out, "--out")
    cache = writable_dir(where.cache, "cache_dir")
    info = get_source(spec, where.source, ref, out=out)
    series, result = patch_tree(spec, info.path)
    print(describe_patches(series, result), file=out)
    binds = Binds(cache=cache, out=out_dir, src=info.path)
    view = backend.view(binds)
    req = BuildRequest(
        spec=spec,
        source=str(view.src),
        out_dir=str(view.out),
        cache_root=str(view.cache),
        provenance={
            **provenance(info, series, result),
            "engine": backend.engine,
            **({"image": image} if image else {}),
        },
        backend=backend.name,
        **dataclasses.asdict(options),
    )
    backend.run("build", req.to_dict(), binds)
    outcome = outcome_of(out_dir, req.run_id)
    print(f"{outcome.wheel or 'preflight passed'}\nmanifest: {outcome.manifest}\nlog: {outcome.log}", file=out)
    if outcome.wheel and verify:
        verify_with(spec, backend, wheel=outcome.wheel, cache=cache, checked=True)
    return outcome


def outcome_of(host_out: Path, run_id: str) -> Outcome:
    """Find what the step wrote: the manifest of this run names the wheel and the log."""
    m, path = manifest.find_run(host_out, run_id)
    return Outcome(host_out / m.wheel.name if m.wheel else None, path, host_out / "logs" / m.log)


def verify_with(
    spec: BuildSpec,
    backend: Backend,
    *,
    wheel: Path | None = None,
    installed: str = "",
    expect_version: str = "",
    report: Path | None = None,
    cache: Path | None = None,
    checked: bool = False,
) -> None:
    """Verify a wheel (or an installed package) with `backend`: natively, in the image or in
    the SIF. The wheel's (or the report's) directory is the step's output bind."""
    from .verify import check_wheel_file, request

    if wheel is None and not installed:
        raise UsageError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")
    if wheel is not None:
        check_wheel_file(wheel)
    if not checked:
        backend.check()
    host_dir = (wheel or report or Path.cwd() / "-").parent
    binds = Binds(cache=writable_dir(cache or cache_dir(spec), "cache_dir"), out=host_dir)
    view = backend.view(binds)
    req = request(
        spec,
        wheel=view.out / wheel.name if wheel else None,
        installed=installed,
        expect_version=expect_version,
        report=view.out / report.name if report else None,
    )
    backend.run("verify", req, binds)
