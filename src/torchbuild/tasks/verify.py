"""invoke verify: check a built wheel (or an installed torch) in a fresh venv."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from ..config import DEFAULT_PROFILE, BuildSpec
from ..errors import ProfileError
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
    spec = spec_from(profile, set_, arch)
    run_verify(
        spec,
        wheel=Path(wheel).expanduser().resolve() if wheel else None,
        installed=installed,
        where="docker" if in_container else "native",
        expect_version=expect_version,
        report=Path(report).expanduser().resolve() if report else None,
    )


def run_verify(
    spec: BuildSpec,
    *,
    wheel: Path | None = None,
    installed: str = "",
    where: str = "native",
    expect_version: str = "",
    report: Path | None = None,
    sif: Path | None = None,
    apptainer: str = "auto",
    user: str = "",
) -> None:
    """Verify natively, in the toolchain image (docker) or in the SIF (apptainer); VerifyFailed on a failure."""
    from ..errors import VerifyFailed

    req: dict[str, object] = {
        "spec": spec.to_dict(),
        "expect_version": expect_version or spec.build_version,
        "installed": installed,
    }
    if wheel is not None:
        if not wheel.is_file():
            raise ProfileError(f"--wheel {wheel}: no such file", hint="point --wheel at the .whl `invoke build` wrote")
        req["wheel"] = str(wheel)
        req["json"] = str(report or Path(str(wheel) + ".verify.json"))
    elif report is not None:
        req["json"] = str(report)
    host_dir = Path(str(req.get("wheel") or req.get("json") or Path.cwd() / "x")).parent
    request = host_dir / f".verify-{uuid.uuid4().hex[:8]}.json"
    if where == "native":
        from ..verify import main_inside

        request.write_text(json.dumps(req))
        try:
            main_inside(str(request))
        finally:
            request.unlink(missing_ok=True)
        return
    for key in ("wheel", "json"):
        if key in req:
            req[key] = f"/out/{Path(str(req[key])).name}"
    request.write_text(json.dumps(req))
    command = ["verify-inside", f"/out/{request.name}"]
    try:
        if where == "apptainer":
            from ..sif import check_sif, default_sif, locate, run_args

            runner = locate(spec, apptainer)
            image = (sif or default_sif(spec)).resolve()
            check_sif(spec, runner, image)
            rc = runner.call(
                run_args(image, {host_dir: "/out"}, command, flags=runner.run_flags),
                paths=[host_dir, image.parent],
            )
            what = image.name
        else:
            from ..engine import Engine
            from ..image import require_image
            from ..runner import caller_user

            engine = Engine.connect()
            require_image(spec, engine)
            rc = engine.run(
                spec.image_tag,
                ["torchbuild", *command],
                mounts={str(host_dir): "/out"},
                user=user or caller_user(),
                environment={"HOME": "/tmp", "PYTHONUNBUFFERED": "1"},
                workdir="/tmp",
                platform=spec.arch.docker_platform,
            )
            what = spec.image_tag
    finally:
        request.unlink(missing_ok=True)
    if rc != 0:
        raise VerifyFailed(f"verification in {what} failed (exit {rc}); the table above names the checks")
