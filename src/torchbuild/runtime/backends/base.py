"""The interface every backend implements (Backend), what a step may see (Binds), what the user
asked of the runtime (Options), and how a step's exit becomes a named error."""

from __future__ import annotations

import abc
import dataclasses
import json
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TextIO

from torchbuild.core.atomic import EXCHANGE, PARTIAL_PREFIX
from torchbuild.core.errors import BuildInterrupted, TorchbuildError, error_for_exit, named_os_errors
from torchbuild.core.process import interrupts_unwind
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.oom import OOM_EXITS, step_failure


@dataclasses.dataclass(frozen=True)
class Binds:
    """The host directories a step may use. src is the tree (None for steps without one)."""

    cache: Path
    out: Path
    src: Path | None = None
    # host directories the step sees at their own path (an install's prefix: a venv is not
    # relocatable; pip's --find-links directories)
    extra: tuple[Path, ...] = ()
    # host directories the step only reads, at their own path (a site's libfabric)
    read_only: tuple[Path, ...] = ()

    def mounts(self, view: Binds) -> dict[Path, str]:
        """host path -> the path the step sees, for each declared bind."""
        pairs = [(self.cache, view.cache), (self.out, view.out)]
        if self.src is not None and view.src is not None:
            pairs.append((self.src, view.src))
        pairs += [(p, p) for p in self.extra]
        return {host: str(inside) for host, inside in pairs}


@dataclasses.dataclass(frozen=True)
class Options:
    """What the user asked of the runtime (each backend refuses what it cannot honour)."""

    user: str = ""  # uid:gid (docker)
    memory: str = ""  # memory cap, e.g. 8g (docker, apptainer through the builder)
    sif: Path | None = None  # apptainer: the SIF
    apptainer: str = "auto"  # apptainer: auto | host | docker
    nv: bool = False  # apptainer: --nv
    rebuild_image: bool = False  # docker: rebuild an image built from other inputs instead of refusing it
    # containers: host MPI library directories, bound read-only and first on LD_LIBRARY_PATH
    host_mpi: tuple[str, ...] = ()

    def host_mpi_env(self) -> dict[str, str]:
        """LD_LIBRARY_PATH with the host MPI directories first (the container's own entries,
        Apptainer's /.singularity.d/libs among them, are added after them by the runtime)."""
        return {"LD_LIBRARY_PATH": ":".join(self.host_mpi)} if self.host_mpi else {}


CONTAINER_VIEW = Binds(cache=Path("/cache"), out=Path("/out"), src=Path("/src"))


def container_view(binds: Binds) -> Binds:
    """The binds as a step in the image or the SIF sees them: /cache, /out and /src."""
    return Binds(
        cache=CONTAINER_VIEW.cache,
        out=CONTAINER_VIEW.out,
        src=CONTAINER_VIEW.src if binds.src is not None else None,
        extra=binds.extra,
        read_only=binds.read_only,
    )


class Backend(abc.ABC):
    name: ClassVar[str]

    def __init__(self, spec: BuildSpec, options: Options, out: TextIO = sys.stdout) -> None:
        self.spec, self.options, self.out = spec, options, out

    @abc.abstractmethod
    def check(self) -> dict[str, Any] | None:
        """Everything that can be checked before the step: the engine, the image or SIF.
        Returns what the manifest records of the image (None natively outside any image)."""

    @property
    def engine(self) -> str:
        """What the manifest records as the engine (the runtime the step really ran in)."""
        return self.name

    @abc.abstractmethod
    def view(self, binds: Binds) -> Binds:
        """The binds as the step sees them."""

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """The runtime in words, for messages (`this host`, the image tag, the SIF's name)."""

    @abc.abstractmethod
    def launch(self, step: str, request: Mapping[str, Any], binds: Binds, request_file: str) -> int:
        """Run the step; request_file is the request as the step sees it. Returns its exit code."""

    def run(self, step: str, request: Mapping[str, Any], binds: Binds) -> None:
        """Run one step for request (its paths already in `view(binds)`); raise the step's named
        error when it fails. Partial outputs of the request's run_id are removed on failure."""
        run_id = str(request.get("run_id") or uuid.uuid4().hex[:12])
        host_file = binds.out / EXCHANGE / f"{step}-{run_id}.json"
        if self.hands_over_file:
            with named_os_errors(host_file.parent, "writing the step's request"):
                self.make_dirs(binds)
                host_file.write_text(json.dumps(request, indent=2))
        inside_file = str(self.view(binds).out / EXCHANGE / host_file.name)
        try:
            with interrupts_unwind():
                rc = self.launch(step, request, binds, inside_file)
        except KeyboardInterrupt:
            remove_partials(binds.out, run_id)
            raise BuildInterrupted(f"{step} interrupted; {self.stopped} and nothing partial was left") from None
        finally:
            host_file.unlink(missing_ok=True)
        if rc != 0:
            remove_partials(binds.out, run_id)
            raise failure(rc, step, self.where, binds.out / "logs")

    def make_dirs(self, binds: Binds) -> None:
        """Create the directories the step writes to (the request exchange among them)."""
        for d in (binds.out / EXCHANGE, binds.cache / "ccache", binds.cache / "pip"):
            d.mkdir(parents=True, exist_ok=True)

    stopped: ClassVar[str] = "it was stopped"
    hands_over_file: ClassVar[bool] = True  # containers read the request from a file in the out bind


def remove_partials(out_dir: Path, run_id: str) -> None:
    for p in out_dir.glob(f"{PARTIAL_PREFIX}{run_id}*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def failure(rc: int, step: str, where: str, logs: Path) -> TorchbuildError:
    """The host's named error for a step that exited rc: OutOfMemory for exit 13 or a SIGKILL,
    else the step's own class when rc is a named exit code (errors.error_for_exit; the step
    printed its message above), else BuildFailed for a build and a plain error for other steps."""
    if rc in OOM_EXITS:
        return step_failure(rc, where, logs)
    cls = error_for_exit(rc)  # the registry in errors.py: every named error, whatever is imported
    if cls is not None:
        return cls(f"the {step} step in {where} failed ({cls.__name__}, exit {rc}); its report is above")
    if step == "build":
        return step_failure(rc, where, logs)
    return TorchbuildError(f"the {step} step in {where} exited with {rc}; its output is above")


# --engine: where a step runs, with one meaning in every task that takes it (build, install,
# mpi-check, comms, config... and submit, where it is where the job builds on its node)
