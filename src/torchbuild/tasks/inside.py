"""What backends call inside the toolchain image and the SIF: `torchbuild inside.step NAME FILE`
runs one step from its request file; `torchbuild inside.sif-labels SIF` prints a SIF's labels
(in the apptainer-builder container). Not meant to be typed by people."""

from __future__ import annotations

import json
from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context

from torchbuild.core.errors import ToolMissing
from torchbuild.runtime.apptainer import LABELS_PREFIX, HostApptainer, host_apptainer
from torchbuild.runtime.steps import run_step_file
from torchbuild.runtime.tasks import handles_errors, task
from torchbuild.tasks.steps import STEPS


@task(help={"name": f"the step: {', '.join(STEPS)}", "request": "the request file (JSON) its backend wrote"})
@handles_errors
def step(c: Context, name: str, request: str) -> None:
    """Run one step from its request file (what the docker and apptainer backends call)."""
    run_step_file(name, request)


@task(help={"sif": "the SIF"})
@handles_errors
def sif_labels(c: Context, sif: str) -> None:
    """Print a SIF's labels as one JSON line (used in the apptainer-builder container)."""
    exe = host_apptainer()
    if not exe:
        raise ToolMissing("apptainer is not installed here")
    print(LABELS_PREFIX + json.dumps(HostApptainer(exe).labels(Path(sif))), flush=True)


inside = Collection("inside", step, sif_labels)
