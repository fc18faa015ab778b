"""invoke verify: check a built wheel (or an installed torch) in a fresh venv, natively, in the
toolchain image or in the SIF."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from ..runner import verify_with
from .common import HELP, RUNTIME_HELP, backend_from, handles_errors, spec_from


@task(
    help={
        **HELP,
        **RUNTIME_HELP,
        "wheel": "the wheel to verify (its directory also gets <wheel>.verify.json)",
        "installed": "verify this already-installed package instead (e.g. torch from the image's distribution)",
        "expect_version": "the version the package must report (default: the profile's, e.g. 2.6.0+gh200)",
        "report": "where to write the JSON report (default <wheel>.verify.json; --installed: none)",
    },
    iterable=["set_"],
)
@handles_errors
def verify(
    c: Context,
    wheel: str = "",
    installed: str = "",
    profile: str = "",
    arch: str = "",
    set_: list[str] | None = None,
    in_container: bool = False,
    engine: str = "docker",
    sif: str = "",
    apptainer: str = "auto",
    nv: bool = False,
    user: str = "",
    memory: str = "",
    rebuild_image: bool = False,
    expect_version: str = "",
    report: str = "",
) -> None:
    """Verify a wheel: tags, version, fresh-venv install, import; for torch also its configuration,
    tensor/autograd, 2-process gloo all_reduce and broadcast, CUDA when a GPU is visible."""
    if bool(wheel) == bool(installed):
        from ..errors import UsageError

        raise UsageError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")
    spec = spec_from(profile, set_, arch)
    backend = backend_from(spec, locals())
    verify_with(
        spec,
        backend,
        wheel=Path(wheel).expanduser().resolve() if wheel else None,
        installed=installed,
        expect_version=expect_version,
        report=Path(report).expanduser().resolve() if report else None,
    )
