"""invoke verify: check a built wheel (or an installed torch) in a fresh venv."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from ..config import DEFAULT_PROFILE
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
    version = expect_version or spec.build_version
    req: dict[str, object] = {"spec": spec.to_dict(), "expect_version": version, "installed": installed}
    if wheel:
        path = Path(wheel).expanduser().resolve()
        if not path.is_file():
            raise ProfileError(f"--wheel {wheel}: no such file", hint="point --wheel at the .whl `invoke build` wrote")
        req["wheel"] = str(path)
        req["json"] = str(Path(report).expanduser().resolve()) if report else str(path) + ".verify.json"
    elif report:
        req["json"] = str(Path(report).expanduser().resolve())
    if not in_container:
        from ..verify import main_inside

        request = Path(str(req.get("json") or "verify-request.json")).with_suffix(".request.json")
        request.write_text(json.dumps(req))
        try:
            main_inside(str(request))
        finally:
            request.unlink(missing_ok=True)
        return
    from ..engine import Engine
    from ..errors import VerifyFailed
    from ..image import require_image
    from ..runner import caller_user

    engine = Engine.connect()
    require_image(spec, engine)
    host_dir = Path(str(req.get("wheel") or req.get("json") or Path.cwd() / "x")).parent
    inside = Path("/out")
    for key in ("wheel", "json"):
        if key in req:
            req[key] = str(inside / Path(str(req[key])).name)
    request = host_dir / f".verify-{uuid.uuid4().hex[:8]}.json"
    request.write_text(json.dumps(req))
    try:
        rc = engine.run(
            spec.image_tag,
            ["torchbuild", "verify-inside", f"/out/{request.name}"],
            mounts={str(host_dir): "/out"},
            user=caller_user(),
            environment={"HOME": "/tmp", "PYTHONUNBUFFERED": "1"},
            workdir="/tmp",
            platform=spec.arch.docker_platform,
        )
    finally:
        request.unlink(missing_ok=True)
    if rc != 0:
        raise VerifyFailed(f"verification in {spec.image_tag} failed (exit {rc}); the table above names the checks")
