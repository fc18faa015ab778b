"""What the features hand the runtime (runtime/handover.py): filled by torchbuild.tasks, which
every entry point imports before a task runs, and named when it was not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchbuild.runtime.handover import Slot

# a fresh interpreter: nothing is handed over until the console script's program is made
FRESH = """
from torchbuild.runtime import engine
try:
    engine.IMAGE_CHECK.get()
except RuntimeError as exc:
    print("before:", exc)
from torchbuild.cli import program
program()
from torchbuild.image.host import require_image
from torchbuild.runtime.apptainer import BUILDER_IMAGE
from torchbuild.sif.host import ensure_builder
print("image check:", engine.IMAGE_CHECK.get() is require_image)
print("builder image:", BUILDER_IMAGE.get() is ensure_builder)
"""


def test_the_console_script_hands_the_runtime_what_it_needs_from_the_features_before_a_task_runs():
    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    before, *after = done.stdout.splitlines()
    assert before.startswith("before: the toolchain image's check (image.host.require_image) was not handed")
    assert after == ["image check: True", "builder image: True"]


def test_an_empty_slot_names_what_is_missing_and_who_fills_it():
    slot: Slot[int] = Slot("the answer")
    with pytest.raises(RuntimeError, match=r"the answer was not handed to the runtime: import torchbuild\.tasks first"):
        slot.get()
    slot.fill(42)
    slot.fill(43)  # filled again (a second import path): the last one holds
    assert slot.get() == 43
