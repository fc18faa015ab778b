"""The native backend: the step runs in this process, on this machine (a login node with its
modules loaded, or inside the toolchain image or SIF, where `torchbuild build` runs natively)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchbuild.core.arch import Arch, host_machine
from torchbuild.core.errors import ProfileError
from torchbuild.runtime.backends.base import Backend, Binds


class NativeBackend(Backend):
    name = "native"
    hands_over_file = False
    stopped = "its processes were stopped"

    def check(self) -> dict[str, Any] | None:
        """Inside a SIF, its record; refuses a profile for another arch than this machine's
        (a native build would compile for the host, not the target)."""
        if self.spec.arch is not Arch.host_or_none():
            raise ProfileError(
                f"profile {self.spec.profile} targets {self.spec.arch}, and this host is {host_machine()}: "
                "a native build or run here would be for the wrong arch",
                hint=f"run it on an {self.spec.arch} node (`invoke submit`), or in its image (--engine docker)",
            )
        return inside_sif()

    @property
    def engine(self) -> str:
        """apptainer when this process runs in a SIF (`apptainer run torch-build.sif build`)."""
        return "apptainer" if inside_sif() else "native"

    def view(self, binds: Binds) -> Binds:
        return binds

    @property
    def where(self) -> str:
        return "this host"

    def launch(self, step: str, request: Mapping[str, Any], binds: Binds, request_file: str) -> int:
        from torchbuild.runtime.steps import run_step

        return run_step(step, request)


def inside_sif() -> dict[str, Any] | None:
    """What the manifest records when this process runs in a SIF: its path (as mounted) and
    the labels of the image it came from."""
    path = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if not path:
        return None
    labels: dict[str, str] = {}
    with_labels = Path("/.singularity.d/labels.json")
    if with_labels.is_file():
        labels = json.loads(with_labels.read_text())
    from torchbuild.runtime.backends.apptainer import sif_record

    return sif_record(labels, path)
