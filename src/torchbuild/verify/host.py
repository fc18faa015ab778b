"""Verify from the host: `invoke verify` (and the build's verify) to the verify step run by a
backend, natively, in the toolchain image or in the SIF.

    verify_with        check the wheel, then the request in the paths the backend shows the
                       step: the NCCL the wheel was built with (comms_for_verify), the tree
                       whose test/ holds PyTorch's own tests (tests_tree)
    backend.run("verify", ...)

Other features import verify only from here: check_wheel_file and request are verify.step's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchbuild.comms.host import COMMS_MANIFEST, read_manifest
from torchbuild.core import records
from torchbuild.core.errors import TorchbuildError, UsageError, writable_dir
from torchbuild.profile.config import BuildSpec, cache_dir
from torchbuild.profile.config import wanted as comms_wanted
from torchbuild.runtime import manifest
from torchbuild.runtime.backends import Backend, Binds
from torchbuild.verify.step import check_wheel_file as check_wheel_file
from torchbuild.verify.step import request as request


def comms_for_verify(wheel: Path, cache: Path, view_cache: Path) -> dict[str, Any]:
    """Where the NCCL and plugin the wheel was built with are, as the verify step sees them,
    and their comms manifest; {"error": why} when the wheel's manifest does not say."""
    path = Path(f"{wheel}{manifest.SUFFIX}")
    try:
        record = manifest.read(path).comms
    except TorchbuildError as err:
        return {"error": f"the wheel's manifest cannot say which NCCL it was linked to: {err.message}"}
    if record is None:
        return {"error": f"{path.name} records no NCCL built by `invoke comms`: the wheel was built without it"}
    prefix = Path(record.prefix)
    if not (prefix / COMMS_MANIFEST).is_file() or not prefix.is_relative_to(cache):
        return {"error": f"{prefix} (the NCCL the wheel was built with) is not in the cache {cache} any more"}
    return {"prefix": str(view_cache / prefix.relative_to(cache)), "manifest": read_manifest(prefix / COMMS_MANIFEST)}


def built_tree(manifest_path: Path) -> Path | None:
    """The source tree a wheel was built from (its manifest's source.path), where it still is."""
    try:
        source = manifest.read(manifest_path).source
    except TorchbuildError:
        return None
    tree = Path(source.path) if source is not None and source.path else None
    return tree if tree is not None and tree.is_dir() else None


def tests_tree(spec: BuildSpec, wheel: Path) -> Path | None:
    """For `invoke verify --wheel W` on its own: the tree W's manifest names, where it still is,
    whose test/ holds PyTorch's own tests (as verify after the build has); None when the profile
    asks for none or W has no manifest beside it."""
    manifest_path = Path(f"{wheel}.manifest.json")
    if not spec.verify_tests or not manifest_path.is_file():
        return None
    return built_tree(manifest_path)


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
    python: str = "",
    tree: Path | None = None,
) -> None:
    """Verify a wheel (or an installed package) with `backend`: natively, in the image or in
    the SIF. The wheel's (or the report's) directory is the step's output bind; tree: the source
    the wheel was built from, whose test/ holds PyTorch's own tests (verify_tests)."""
    if wheel is None and not installed:
        raise UsageError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")
    if wheel is not None:
        check_wheel_file(wheel)
        tree = tree or tests_tree(spec, wheel)
    if not checked:
        backend.check()
    host_dir = (wheel or report or Path.cwd() / "-").parent
    binds = Binds(cache=writable_dir(cache or cache_dir(spec), "cache_dir"), out=host_dir, src=tree)
    view = backend.view(binds)
    req = request(
        spec,
        wheel=view.out / wheel.name if wheel else None,
        installed=installed,
        expect_version=expect_version,
        report=view.out / report.name if report else None,
        python=python,
        comms=comms_for_verify(wheel, binds.cache, view.cache) if wheel is not None and comms_wanted(spec) else None,
        tests_dir=str(view.src / "test") if view.src is not None and spec.verify_tests else "",
    )
    backend.run("verify", records.to_dict(req), binds)
