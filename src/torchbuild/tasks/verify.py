"""invoke verify: check a built wheel (or an installed torch) in a fresh venv."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from ..config import DEFAULT_PROFILE
from ..errors import ProfileError
from ..verify import verify_in
from .common import HELP, handles_errors, spec_from


@task(
    help={
        **HELP,
        "wheel": "the wheel to verify (its directory also gets <wheel>.verify.json)",
        "installed": "verify this already-installed package instead (e.g. torch from the image's distribution)",
        "in_container": "verify inside the profile's toolchain image (default: with this Python, natively)",
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
    profile: str = DEFAULT_PROFILE,
    arch: str = "",
    set_: list[str] | None = None,
    in_container: bool = False,
    expect_version: str = "",
    report: str = "",
) -> None:
    """Verify a wheel: tags, version, fresh-venv install, import; for torch also its configuration,
    tensor/autograd, 2-process gloo all_reduce and broadcast, CUDA when a GPU is visible."""
    if bool(wheel) == bool(installed):
        raise ProfileError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")
    verify_in(
        "docker" if in_container else "native",
        spec_from(profile, set_, arch),
        wheel=Path(wheel).expanduser().resolve() if wheel else None,
        installed=installed,
        expect_version=expect_version,
        report=Path(report).expanduser().resolve() if report else None,
    )
