"""Host side of `invoke build` and `invoke source`: get the tree, patch it, then run the build
in the toolchain container (or natively) with the source, cache and output mounted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from .build import PARTIAL_PREFIX, BuildRequest, Outcome, run_build
from .config import BuildSpec
from .engine import Engine
from .errors import BuildFailed, BuildInterrupted, OutOfMemory, TorchbuildError
from .image import LABEL_PREFIX, require_image
from .patches import ApplyResult, Series, apply_series, load_series
from .source import SourceInfo, describe_dir, fetch_git, looks_like_url, unpack_archive

CONTAINER_SRC, CONTAINER_CACHE, CONTAINER_OUT = "/src", "/cache", "/out"


def cache_dir(spec: BuildSpec) -> Path:
    return Path(spec.cache_dir).expanduser()


def default_tree(spec: BuildSpec, ref: str) -> Path:
    safe = ref.replace("/", "_")
    return cache_dir(spec) / "src" / f"pytorch-{safe}"


def get_source(
    spec: BuildSpec, source: str = "", ref: str = "", dest: str = "", out: TextIO = sys.stdout
) -> SourceInfo:
    """--source as given: a git URL, a directory, a tarball or .dsc; empty means the profile's repo."""
    cache = cache_dir(spec)
    ref = ref or spec.git_ref
    if not source or looks_like_url(source):
        url = source or spec.torch_repo
        tree = Path(dest).expanduser() if dest else default_tree(spec, ref)
        if tree.is_dir():
            print(f"using existing checkout {tree} (`invoke source --update` refreshes a branch)", file=out)
            return dataclasses.replace(describe_dir(tree), kind="git", ref=ref)
        return fetch_git(url, ref, tree, cache, out=out)
    path = Path(source).expanduser().resolve()
    if path.is_dir():
        return describe_dir(path)
    return unpack_archive(path, Path(dest).expanduser() if dest else cache / "src", out=out)


def prepare(
    spec: BuildSpec,
    *,
    source: str,
    ref: str,
    out_dir: Path,
    cache_root: Path,
    out: TextIO = sys.stdout,
    **options: Any,
) -> BuildRequest:
    """Get and patch the tree, then describe the build (options: BuildRequest's preflight,
    clean, jobs, targets, canaries)."""
    info = get_source(spec, source, ref, out=out)
    series, result = patch_tree(spec, info.path)
    if series.directory is None:
        print("patches: none for this version", file=out)
    else:
        print(
            f"patches from {series.directory}: {len(result.applied)} applied, "
            f"{len(result.skipped)} already in the tree",
            file=out,
        )
    return BuildRequest(
        spec=spec,
        source=str(info.path),
        out_dir=str(out_dir),
        cache_root=str(cache_root),
        provenance=provenance(info, series, result),
        **options,
    )


def patch_tree(spec: BuildSpec, tree: Path) -> tuple[Series, ApplyResult]:
    series = load_series(spec.patches, spec.torch_version)
    return series, apply_series(tree, series)


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


@contextmanager
def interrupts_unwind() -> Iterator[None]:
    """SIGINT and SIGTERM (Ctrl-C, a batch system ending the job) unwind as KeyboardInterrupt,
    so cleanup runs. SIGINT is set explicitly: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then never raises for it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def remove_partials(out_dir: Path, run_id: str) -> None:
    for p in out_dir.glob(f"{PARTIAL_PREFIX}{run_id}*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def caller_user() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def make_dirs_for(user: str, *dirs: Path) -> None:
    """Create dirs the container writes to; when root runs a build as another user (--user),
    hand the new directories to that user so the build can write them."""
    uid, _, gid = user.partition(":")
    for d in dirs:
        missing = [p for p in [d, *d.parents] if not p.exists()]
        d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and uid.isdigit() and int(uid) != 0:
            for p in missing:
                os.chown(p, int(uid), int(gid or uid))


def build_in_container(
    engine: Engine,
    req: BuildRequest,
    *,
    host_source: Path,
    host_out: Path,
    host_cache: Path,
    user: str = "",
    memory_limit: str | None = None,
    out: TextIO = sys.stdout,
) -> Outcome:
    """Run `torchbuild build-inside` in the profile's image with source, cache and out mounted."""
    spec = req.spec
    attrs = require_image(spec, engine)
    labels = (attrs.get("Config") or {}).get("Labels") or {}  # type: ignore[attr-defined]
    req = dataclasses.replace(
        req,
        source=CONTAINER_SRC,
        out_dir=CONTAINER_OUT,
        cache_root=CONTAINER_CACHE,
        provenance={
            **req.provenance,
            "image": {
                "tag": spec.image_tag,
                "id": attrs.get("Id"),
                "profile_hash": labels.get(f"{LABEL_PREFIX}.profile-hash"),
            },
            "engine": "docker",
        },
    )
    user = user or caller_user()
    make_dirs_for(
        user, host_out, host_cache / "home", host_cache / "ccache", host_cache / "pip", host_out / ".torchbuild"
    )
    env = {
        "HOME": f"{CONTAINER_CACHE}/home",
        # the tree belongs to the caller, not to the container's user table
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        "PYTHONUNBUFFERED": "1",
    }
    return run_request(
        req,
        host_out,
        lambda inside: engine.run(
            spec.image_tag,
            ["torchbuild", "build-inside", inside],
            mounts={str(host_source): CONTAINER_SRC, str(host_cache): CONTAINER_CACHE, str(host_out): CONTAINER_OUT},
            user=user,
            environment=env,
            workdir=CONTAINER_SRC,
            platform=spec.arch.docker_platform,
            memory_limit=memory_limit,
            out=out,
        ),
        where=spec.image_tag,
        stopped="its container was removed",
    )


def run_request(
    req: BuildRequest, host_out: Path, launch: Callable[[str], int], *, where: str, stopped: str
) -> Outcome:
    """Hand req to a container or SIF: write it to out/.torchbuild, launch(its path as seen at
    /out) and collect what the build wrote. Ctrl-C, SIGTERM and failures leave no partial wheel."""
    request_file = host_out / ".torchbuild" / f"request-{req.run_id}.json"
    request_file.write_text(req.to_json())
    try:
        with interrupts_unwind():
            rc = launch(f"{CONTAINER_OUT}/.torchbuild/{request_file.name}")
    except KeyboardInterrupt:
        remove_partials(host_out, req.run_id)
        raise BuildInterrupted(f"build interrupted; {stopped} and no wheel was written") from None
    finally:
        request_file.unlink(missing_ok=True)
    if rc != 0:
        remove_partials(host_out, req.run_id)
        raise failure(rc, where, host_out)
    return outcome_from_out(host_out, req)


def failure(rc: int, where: str, host_out: Path) -> TorchbuildError:
    """The host's error for a build that exited rc in a container or SIF (its own error was
    printed above by the build itself)."""
    logs = host_out / "logs"
    if rc == OutOfMemory.exit_code:
        return OutOfMemory(f"the build in {where} ran out of memory at its last retry; the log is in {logs}")
    if rc in (137, -9):
        return OutOfMemory(
            f"the build in {where} was killed (exit {rc}, SIGKILL: out of memory?); the log is in {logs}"
        )
    return BuildFailed(f"the build in {where} exited with {rc}; the log is in {logs}")


def outcome_from_out(host_out: Path, req: BuildRequest) -> Outcome:
    """Find what the container wrote: the manifest of this run names the wheel and the log."""
    for manifest in host_out.glob("*.manifest.json"):
        data = json.loads(manifest.read_text())
        if data.get("run_id") != req.run_id:
            continue
        wheel = host_out / data["wheel"]["name"] if "wheel" in data else None
        return Outcome(wheel, manifest, host_out / "logs" / data["log"])
    raise BuildFailed(f"the build finished but wrote no manifest for run {req.run_id} in {host_out}")


def build_native(
    req: BuildRequest, out: TextIO = sys.stdout, engine: str = "native", image: dict[str, Any] | None = None
) -> Outcome:
    """The same build in this process: natively on a login node (modules loaded), or by
    `torchbuild build` inside the image or a SIF (engine and image say which, for the manifest)."""
    Path(req.out_dir).mkdir(parents=True, exist_ok=True)
    prov = {**req.provenance, "engine": engine, **({"image": image} if image else {})}
    try:
        with interrupts_unwind():
            return run_build(dataclasses.replace(req, provenance=prov), out=out)
    except KeyboardInterrupt:
        remove_partials(Path(req.out_dir), req.run_id)
        raise BuildInterrupted("build interrupted; no wheel was written") from None
