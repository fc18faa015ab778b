"""What the features hand the runtime (core/handover.py): filled by torchbuild.tasks, which
every entry point imports before a task runs, and named when it was not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchbuild.core.handover import Slot

# a fresh interpreter: nothing is handed over until the console script's program is made
FRESH = """
from torchbuild.runtime import engine, steps
for slot in (steps.TABLE, engine.IMAGE_CHECK):
    try:
        slot.get()
    except RuntimeError as exc:
        print("before:", exc)
from torchbuild.cli import program
program()
from torchbuild.image.host import require_image
from torchbuild.runtime.apptainer import BUILDER_IMAGE
from torchbuild.sif.host import ensure_builder
print("image check:", engine.IMAGE_CHECK.get() is require_image)
print("builder image:", BUILDER_IMAGE.get() is ensure_builder)
print("steps:", ", ".join(steps.TABLE.get().steps), "|", steps.TABLE.get().tasks)
"""


def test_the_console_script_hands_the_runtime_what_it_needs_from_the_features_before_a_task_runs():
    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "before: the steps table (tasks/steps.py) was not handed over: import torchbuild.tasks first"
    assert lines[1].startswith("before: the toolchain image's check (image.host.require_image) was not handed")
    assert lines[2:] == [
        "image check: True",
        "builder image: True",
        "steps: build, verify, install, mpi, comms, companions, develop, bench | {'mpi': 'mpi-check'}",
    ]


def test_a_step_run_from_its_request_file_in_a_fresh_process_reaches_the_step(tmp_path):
    """What the docker and apptainer backends run in the image or the SIF: `torchbuild
    inside.step NAME FILE` (here `python -m torchbuild`) finds the step in the table the
    Collection handed over, and its refusal names the task that writes such requests."""
    path = tmp_path / "r.json"
    path.write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "torchbuild", "inside.step", "mpi", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert f"{path}: the mpi request" in done.stderr and "spec: missing" in done.stderr, done.stderr
    assert "`invoke mpi-check` writes these requests" in done.stderr
    assert "unknown step" not in done.stderr and "Traceback" not in done.stderr


def test_an_empty_slot_names_what_is_missing_and_who_fills_it():
    slot: Slot[int] = Slot("the answer")
    with pytest.raises(RuntimeError, match=r"the answer was not handed over: import torchbuild\.tasks first"):
        slot.get()
    slot.fill(42)
    slot.fill(43)  # filled again (a second import path): the last one holds
    assert slot.get() == 43
