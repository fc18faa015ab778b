"""The steps there are: each feature's step (its typed Request and its run function), loaded
only when it is run, and handed to the runtime's registry (runtime/steps.py) by
torchbuild.tasks when it is imported. The runtime may import no feature (the layers contract),
so the table lives here, above them all."""

from __future__ import annotations

from collections.abc import Callable

from torchbuild.runtime.steps import Step

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


# the task whose launching side writes each step's request (named in a refusal's hint)
TASKS = {"mpi": "mpi-check"}
