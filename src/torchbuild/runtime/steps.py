"""The steps a backend runs: each gets its request as plain data (JSON), parsed here into the
step's typed Request (records.from_dict: a missing key, an unknown key or a value of the wrong
type is one UsageError naming the request file and the key), and returns an exit code, raising
named errors. Natively they are called in this process (the native backend's `run_step`); in
the image or the SIF through `torchbuild inside.step NAME REQUEST.json` (`run_step_file`).

Which steps there are is the features' (each feature's step module): the table is
tasks/steps.py's, handed over by torchbuild.tasks when it is imported (`register`, TABLE),
which every entry point does before a task runs. A step added there runs on every backend
without change."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from torchbuild.core import records
from torchbuild.core.errors import UsageError
from torchbuild.core.handover import Slot
from torchbuild.core.safeio import MANIFEST_LIMIT, loads_json, read_text


@dataclasses.dataclass(frozen=True)
class Step:
    """A step: the type its request is parsed into (records.from_dict), and the function that
    runs it with the parsed request."""

    request: type[Any]
    run: Callable[[Any], int]


@dataclasses.dataclass(frozen=True)
class Table:
    """The steps there are (name -> a loader that imports the step's module when it is run) and,
    where it is not the step's own name, the task whose launching side writes its requests."""

    steps: Mapping[str, Callable[[], Step]]
    tasks: Mapping[str, str]


# tasks/steps.py's STEPS and TASKS: the steps are the features' (the layers contract keeps them
# out of the runtime); torchbuild.tasks hands the table over when it is imported
TABLE: Slot[Table] = Slot("the steps table (tasks/steps.py)")


def register(steps: Mapping[str, Callable[[], Step]], tasks: Mapping[str, str]) -> None:
    """Hand over the steps table (torchbuild.tasks does, before any task runs)."""
    TABLE.fill(Table(dict(steps), dict(tasks)))


def _load(name: str) -> Step:
    steps = TABLE.get().steps
    load = steps.get(name)
    if load is None:
        raise UsageError(f"unknown step {name!r}", hint=f"steps: {', '.join(steps)}")
    return load()


def _parse(name: str, step: Step, payload: Mapping[str, Any]) -> Any:
    hint = f"`invoke {TABLE.get().tasks.get(name, name)}` writes these requests"
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
