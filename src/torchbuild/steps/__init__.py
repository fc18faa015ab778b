"""The steps a backend runs: each takes its request as plain data (JSON) and returns an exit
code, raising named errors. Natively they are called in this process; in the image or the SIF
through `torchbuild inside.step NAME REQUEST.json`. Later steps (install, companions) are added
here, and every backend runs them without change.

The package holds what runs in the container: the compile steps (torch's build, the
companions, editable trees, NCCL and its plugin, the benchmark) and the compile job they share.
It imports delivery (the install and verify steps it dispatches to), inputs and core; never the
launching side."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchbuild.core.errors import UsageError, named_os_errors

Step = Callable[[Mapping[str, Any]], int]


def _build(payload: Mapping[str, Any]) -> int:
    from torchbuild.steps.build import run_build_step

    return run_build_step(payload)


def _verify(payload: Mapping[str, Any]) -> int:
    from torchbuild.delivery.verify import run_request

    return run_request(dict(payload))


def _install(payload: Mapping[str, Any]) -> int:
    from torchbuild.delivery.install import run_install_step

    return run_install_step(payload)


def _mpi(payload: Mapping[str, Any]) -> int:
    from torchbuild.delivery.install import run_mpi_step

    return run_mpi_step(payload)


def _comms(payload: Mapping[str, Any]) -> int:
    from torchbuild.steps.comms import run_comms_step

    return run_comms_step(payload)


def _companions(payload: Mapping[str, Any]) -> int:
    from torchbuild.steps.companions import run_companions_step

    return run_companions_step(payload)


def _develop(payload: Mapping[str, Any]) -> int:
    from torchbuild.steps.develop import run_develop_step

    return run_develop_step(payload)


def _bench(payload: Mapping[str, Any]) -> int:
    from torchbuild.steps.bench import run_bench_step

    return run_bench_step(payload)


STEPS: dict[str, Step] = {
    "build": _build,
    "verify": _verify,
    "install": _install,
    "mpi": _mpi,
    "comms": _comms,
    "companions": _companions,
    "develop": _develop,
    "bench": _bench,
}


def run_step(name: str, payload: Mapping[str, Any]) -> int:
    step = STEPS.get(name)
    if step is None:
        raise UsageError(f"unknown step {name!r}", hint=f"steps: {', '.join(STEPS)}")
    return step(payload)


def run_step_file(name: str, request_file: str) -> int:
    """What `torchbuild inside.step NAME FILE` does in the image or the SIF."""
    with named_os_errors(request_file, f"reading the {name} request"):
        text = Path(request_file).read_text()
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{name} request {request_file} is not JSON ({exc})", hint=REQUEST_HINT) from None
    if not isinstance(payload, dict):
        raise UsageError(f"{name} request {request_file} is not a JSON object", hint=REQUEST_HINT)
    try:
        return run_step(name, payload)
    except UsageError as err:
        raise UsageError(f"{request_file}: {err.message}", hint=err.hint) from None


REQUEST_HINT = "backends write these requests; run `invoke build` or `invoke verify` instead"
