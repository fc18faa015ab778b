"""The apptainer backend: the step runs by the SIF's runscript (the torchbuild CLI) with
--cleanenv (host modules must not leak into the build), the declared binds at /src, /cache and
/out, and --nv on GPU nodes. Apptainer is this host's, or the apptainer-builder container's
(runtime/apptainer.py `locate`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild import __version__
from torchbuild.core.errors import ImageNotFound, UsageError
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.apptainer import SIF_LABEL, STEP_VARIABLE, Apptainer, check_sif_header, default_sif, locate
from torchbuild.runtime.backends.base import CONTAINER_VIEW, Backend, Binds, container_view
from torchbuild.runtime.engine import LABEL_PREFIX
from torchbuild.runtime.environment import allocation_env, launch_env
from torchbuild.runtime.manifest import ImageRecord


def check_sif(spec: BuildSpec, apptainer: Apptainer, sif: Path) -> dict[str, str]:
    """The SIF's labels, once it is known to hold the profile for this torchbuild version."""
    hint = f"make it with `invoke sif --profile {spec.profile} --arch {spec.arch}`"
    if not sif.is_file():
        raise ImageNotFound(f"SIF {sif} does not exist", hint=hint)
    check_sif_header(sif, "--sif", hint)
    labels = apptainer.labels(sif)
    for key, want in (("profile", spec.profile), ("arch", spec.arch.value), ("version", __version__)):
        got = labels.get(f"{LABEL_PREFIX}.{key}")
        if got != want:
            raise ImageNotFound(f"{sif} has {key} {got!r}, this build needs {want!r}", hint=hint)
    return labels


def sif_record(labels: Mapping[str, str], sif: str) -> dict[str, Any]:
    """What the manifest records of a SIF: its path, the image it came from and that image's inputs."""
    record = ImageRecord.from_labels(
        labels, tag=labels.get(f"{SIF_LABEL}.image"), image_id=labels.get(f"{SIF_LABEL}.image-id"), sif=sif
    )
    return dataclasses.asdict(record)


def run_args(
    sif: Path,
    binds: Mapping[Path, str],
    command: Sequence[str],
    *,
    flags: Sequence[str] = (),
    nv: bool = False,
    host_mpi: Sequence[str] = (),
    read_only: Sequence[str] = (),
    comms: Sequence[str] = (),
    step: str = "",
) -> list[str]:
    """`apptainer run` arguments: a clean environment, the binds, --nv for GPU nodes, the
    host MPI directories bound read-only at their own paths and first on LD_LIBRARY_PATH
    (Apptainer appends its /.singularity.d/libs after them), read_only directories bound
    read-only at their own paths, and comms: the bind specs of `invoke comms`'s prefix at
    SIF_COMMS (runtime_binds). step: the torchbuild step it runs (STEP_VARIABLE)."""
    args = ["run", *flags, "--cleanenv"]
    if nv:
        args.append("--nv")
    unbindable = [str(p) for p in (*binds, *binds.values(), *host_mpi, *read_only) if set(str(p)) & set(",:")]
    if unbindable:
        raise UsageError(
            f"apptainer cannot bind {unbindable[0]}: it splits --bind at ',' and ':'",
            hint="use a path without ',' or ':' (a symlink to it will do)",
        )
    specs = [f"{host}:{inside}" for host, inside in binds.items()]
    own = [d for d in dict.fromkeys([*host_mpi, *read_only]) if f"{d}:{d}:ro" not in comms]
    specs += [f"{d}:{d}:ro" for d in own] + list(comms)
    args += ["--bind", ",".join(specs)]
    env = {**launch_env("apptainer", str(CONTAINER_VIEW.cache)), **allocation_env()}
    if step:
        env[STEP_VARIABLE] = step
    if host_mpi:
        env["LD_LIBRARY_PATH"] = ":".join(host_mpi)
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    args += ["--", str(sif), *command]
    return args


class ApptainerBackend(Backend):
    name = "apptainer"
    stopped = "apptainer was stopped"
    runner: Apptainer
    sif: Path
    # the bind specs of the comms `invoke comms` built for this SIF (launch.comms sets them once
    # they are built or found): every later step sees them where a job running torch does
    comms_binds: tuple[str, ...] = ()

    def check(self) -> dict[str, Any] | None:
        self.runner = locate(self.spec, self.options.apptainer, out=self.out)
        self.sif = user_path(self.options.sif or default_sif(self.spec), "--sif").resolve()
        labels = check_sif(self.spec, self.runner, self.sif)
        return sif_record(labels, str(self.sif))

    def view(self, binds: Binds) -> Binds:
        return container_view(binds)

    @property
    def where(self) -> str:
        return self.sif.name

    def launch(self, step: str, request: Mapping[str, Any], binds: Binds, request_file: str) -> int:
        mounts = binds.mounts(self.view(binds))
        host_mpi = self.options.host_mpi
        comms = self.comms_binds if step != "comms" else ()
        return self.runner.call(
            run_args(
                self.sif,
                mounts,
                ["inside.step", step, request_file],
                flags=self.runner.run_flags,
                nv=self.options.nv,
                host_mpi=host_mpi,
                read_only=[str(d) for d in binds.read_only],
                comms=comms,
                step=step,
            ),
            paths=[
                *mounts,
                self.sif.parent,
                *(Path(d) for d in host_mpi),
                *binds.read_only,
                *(Path(c.split(":", 1)[0]) for c in comms),
            ],
            out=self.out,
            memory_limit=self.options.memory or None,
        )
