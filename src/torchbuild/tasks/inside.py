"""What backends call inside the toolchain image and the SIF: `torchbuild inside.step NAME FILE`
runs one step from its request file; `torchbuild inside.sif-labels SIF` prints a SIF's labels
(in the apptainer-builder container). Not meant to be typed by people.

Their arguments are positional (the backends pass them so: runtime/backends, runtime/apptainer.py),
so their models' fields are positional() ones (core/options.py): no default, invoke's positional
arguments, with their help."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context

from torchbuild.core.errors import ToolMissing
from torchbuild.core.options import positional
from torchbuild.runtime.apptainer import LABELS_PREFIX, HostApptainer, host_apptainer
from torchbuild.runtime.steps import run_step_file
from torchbuild.runtime.tasks import options_task
from torchbuild.tasks.steps import STEPS


@dataclasses.dataclass(frozen=True)
class StepFile:
    """The step a backend runs and the request file it wrote."""

    name: str = positional(f"the step: {', '.join(STEPS)}")
    request: str = positional("the request file (JSON) its backend wrote")


@dataclasses.dataclass(frozen=True)
class SifFile:
    """The SIF whose labels are read."""

    sif: str = positional("the SIF")


@options_task(models={"call": StepFile})
def step(c: Context, call: StepFile) -> None:
    """Run one step from its request file (what the docker and apptainer backends call)."""
    run_step_file(call.name, call.request)


@options_task(models={"given": SifFile})
def sif_labels(c: Context, given: SifFile) -> None:
    """Print a SIF's labels as one JSON line (used in the apptainer-builder container)."""
    exe = host_apptainer()
    if not exe:
        raise ToolMissing("apptainer is not installed here")
    print(LABELS_PREFIX + json.dumps(HostApptainer(exe).labels(Path(given.sif))), flush=True)


inside = Collection("inside", step, sif_labels)
