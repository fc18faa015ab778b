"""invoke verify: check a built wheel (or an installed torch) in a fresh venv, natively, in the
toolchain image or in the SIF."""

from __future__ import annotations

from invoke.context import Context

from torchbuild.core.safeio import user_path
from torchbuild.launch.runner import verify_with
from torchbuild.tasks.common import Launch, launch_task


@launch_task(
    help={
        "wheel": "the wheel to verify (its directory also gets <wheel>.verify.json)",
        "installed": "verify this already-installed package instead (e.g. torch from the image's distribution)",
        "expect_version": "the version the package must report (default: the profile's, e.g. 2.6.0+gh200)",
        "report": "where to write the JSON report (default <wheel>.verify.json; --installed: none)",
    },
)
def verify(
    c: Context,
    launch: Launch,
    wheel: str = "",
    installed: str = "",
    expect_version: str = "",
    report: str = "",
) -> None:
    """Verify a wheel: tags, version, fresh-venv install, import; for torch also its configuration,
    tensor/autograd, 2-process gloo all_reduce and broadcast, CUDA when a GPU is visible."""
    if bool(wheel) == bool(installed):
        from torchbuild.core.errors import UsageError

        raise UsageError("give exactly one of --wheel W and --installed NAME", hint="invoke verify --wheel out/x.whl")
    spec = launch.spec()
    verify_with(
        spec,
        launch.backend(spec),
        wheel=user_path(wheel).resolve() if wheel else None,
        installed=installed,
        expect_version=expect_version,
        report=user_path(report).resolve() if report else None,
    )
