"""Where a step runs: natively, in the toolchain image (Docker) or in the SIF (Apptainer).

One interface for all three. A task chooses a backend once (`choose`), calls `check()` before
it touches anything (engine reachable, image or SIF current), builds the step's request with
the paths the backend shows it (`view`), and calls `run()`. No other module knows which backend
runs a step, and a backend does not know which step it runs: it hands over a request and maps
the exit. Every backend mounts only the declared binds, runs as the caller, applies the memory
cap where it can, and cleans up on every exit (Ctrl-C and SIGTERM included).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from torchbuild.core.errors import UsageError
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.backends.base import (
    CONTAINER_VIEW,
    Backend,
    Binds,
    Options,
    container_view,
    failure,
    remove_partials,
)
from torchbuild.runtime.environment import BACKENDS

__all__ = [
    "CONTAINER_VIEW",
    "ENGINES",
    "ENGINE_HELP",
    "Backend",
    "Binds",
    "Options",
    "choose",
    "container_view",
    "engine_for",
    "failure",
    "remove_partials",
]

ENGINES = BACKENDS
ENGINE_HELP = "native (this machine), docker (the toolchain image) or apptainer (the SIF from `invoke sif`)"


def engine_for(engine: str, in_container: bool = False, default: str = "native") -> str:
    """The one check of an --engine value: one of ENGINES, the same in every task. engine ''
    (not given) is docker with --in-container (its shorthand), else the task's default;
    --in-container with --engine native contradicts itself."""
    if not engine:
        return "docker" if in_container else default
    if engine not in ENGINES:
        close = [e for e in ENGINES if e.startswith(engine[:2].lower())]
        sugg = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown --engine {engine!r}{sugg}", hint=f"use --engine {ENGINE_HELP}")
    if engine == "native" and in_container:
        raise UsageError("--in-container and --engine native contradict each other", hint="drop one of them")
    return engine


_OPTIONS_REFUSED: dict[str, Callable[[Options], dict[str, object]]] = {
    "native": lambda o: {
        "--user": o.user,
        "--memory": o.memory,
        "--sif": o.sif,
        "--apptainer": o.apptainer != "auto",
        "--nv": o.nv,
        "--rebuild-image": o.rebuild_image,
        "--host-mpi": o.host_mpi,
    },
    "docker": lambda o: {"--sif": o.sif, "--apptainer": o.apptainer != "auto", "--nv": o.nv},
    "apptainer": lambda o: {"--user": o.user, "--rebuild-image": o.rebuild_image},
}


def choose(spec: BuildSpec, engine: str, options: Options, out: TextIO = sys.stdout) -> Backend:
    """The backend for --engine (native, docker, apptainer: engine_for); options it cannot honour are refused."""
    from torchbuild.runtime.backends.apptainer import ApptainerBackend
    from torchbuild.runtime.backends.docker import DockerBackend
    from torchbuild.runtime.backends.native import NativeBackend

    kinds: dict[str, type[Backend]] = {b.name: b for b in (NativeBackend, DockerBackend, ApptainerBackend)}
    engine = engine_for(engine)
    given = [flag for flag, value in _OPTIONS_REFUSED[engine](options).items() if value]
    if given:
        where = "a native build" if engine == "native" else f"--engine {engine}"
        fix = (
            "choose the container with --engine docker or apptainer"
            if engine == "native"
            else "drop it, or choose the engine that takes it"
        )
        raise UsageError(f"{', '.join(given)} cannot be used with {where}", hint=fix)
    return kinds[engine](spec, options, out)
