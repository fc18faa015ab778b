"""The steps a backend runs: each gets its request as plain data (JSON), parsed here into the
step's typed Request (records.from_dict: a missing key, an unknown key or a value of the wrong
type is one UsageError naming the request file and the key), and returns an exit code, raising
named errors. Natively they are called in this process; in the image or the SIF through
`torchbuild inside.step NAME REQUEST.json`. A step added to STEPS runs on every backend without
change.

The package holds what runs in the container: the compile steps (torch's build, the
companions, editable trees, NCCL and its plugin, the benchmark) and the compile job they share.
It imports delivery (the install and verify steps it dispatches to), inputs and core; never the
launching side."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from torchbuild.core import records
from torchbuild.core.errors import UsageError
from torchbuild.core.safeio import MANIFEST_LIMIT, loads_json, read_text


@dataclasses.dataclass(frozen=True)
class Step:
    """A step: the type its request is parsed into (records.from_dict), and the function that
    runs it with the parsed request."""

    request: type[Any]
    run: Callable[[Any], int]


# Each loader imports its step only when it is run (a step module pulls in much of the package).


def _build() -> Step:
    from torchbuild.builder.step import BuildRequest, run_build_step

    return Step(BuildRequest, run_build_step)


def _verify() -> Step:
    from torchbuild.verify.step import Request, run_request

    return Step(Request, run_request)


def _install() -> Step:
    from torchbuild.install.step import InstallRequest, run_install_step

    return Step(InstallRequest, run_install_step)


def _mpi() -> Step:
    from torchbuild.install.step import MpiRequest, run_mpi_step

    return Step(MpiRequest, run_mpi_step)


def _comms() -> Step:
    from torchbuild.comms.step import Request, run_comms_step

    return Step(Request, run_comms_step)


def _companions() -> Step:
    from torchbuild.builder.companions import Request, run_companions_step

    return Step(Request, run_companions_step)


def _develop() -> Step:
    from torchbuild.devloop.step import Request, run_develop_step

    return Step(Request, run_develop_step)


def _bench() -> Step:
    from torchbuild.bench.step import Request, run_bench_step

    return Step(Request, run_bench_step)


STEPS: dict[str, Callable[[], Step]] = {
    "build": _build,
    "verify": _verify,
    "install": _install,
    "mpi": _mpi,
    "comms": _comms,
    "companions": _companions,
    "develop": _develop,
    "bench": _bench,
}


def _load(name: str) -> Step:
    load = STEPS.get(name)
    if load is None:
        raise UsageError(f"unknown step {name!r}", hint=f"steps: {', '.join(STEPS)}")
    return load()


# the task whose launching side writes each step's request (named in a refusal's hint)
TASKS = {"mpi": "mpi-check"}


def _parse(name: str, step: Step, payload: Mapping[str, Any]) -> Any:
    hint = f"`invoke {TASKS.get(name, name)}` writes these requests"
    return records.from_dict(step.request, payload, f"the {name} request", hint=hint)


def parse_request(name: str, payload: Mapping[str, Any]) -> Any:
    """The payload as step name's typed Request (a missing key, an unknown key or a value of the
    wrong type is a UsageError naming it)."""
    return _parse(name, _load(name), payload)


def run_step(name: str, payload: Mapping[str, Any]) -> int:
    """Run step name with its request as plain data (what a backend hands it)."""
    step = _load(name)
    return step.run(_parse(name, step, payload))


def run_step_file(name: str, request_file: str) -> int:
    """What `torchbuild inside.step NAME FILE` does in the image or the SIF."""
    # a request holds a profile and, for verify, a comms manifest: far below a manifest's bound
    text = read_text(request_file, MANIFEST_LIMIT, f"the {name} request")
    try:
        payload = loads_json(text)
    except ValueError as exc:
        raise UsageError(f"{name} request {request_file} is not JSON ({exc})", hint=REQUEST_HINT) from None
    if not isinstance(payload, dict):
        raise UsageError(f"{name} request {request_file} is not a JSON object", hint=REQUEST_HINT)
    try:
        return run_step(name, payload)
    except UsageError as err:
        raise UsageError(f"{request_file}: {err.message}", hint=err.hint) from None


REQUEST_HINT = "backends write these requests; run `invoke build` or `invoke verify` instead"
