"""Apptainer for the runtime: where it runs, how a step is started in a SIF, and which SIF.

Apptainer is reached one of two ways, chosen by `locate()`:

* HostApptainer: `apptainer` (or `singularity`) on PATH, as on an HPC node.
* DockerApptainer: the apptainer-builder container on a Docker host without Apptainer
  (containers/apptainer-builder.Dockerfile). It gets the few privileges unprivileged Apptainer
  needs (SYS_ADMIN, /dev/fuse, unconfined seccomp/AppArmor/system paths; never --privileged),
  runs as the caller, and sees every host path it needs at the same path, so one command line
  means the same thing both ways. Its image is the sif feature's (sif.host.ensure_builder: its
  build context is the toolchain image's), handed over through BUILDER_IMAGE
  (core/handover.py).

spython drives `inspect` on the host. Builds and runs do not go through spython's build() and
run(): build() defaults to sudo, their streaming reads stderr only at the end (Apptainer
reports progress on stderr, and a full stderr pipe stalls it), environ= replaces the whole
environment, and the child cannot be stopped on Ctrl-C. `_stream` runs the same command lines
with both streams merged, the environment extended rather than replaced, and the child
terminated on interrupt.

Which SIF: a profile's default file name (`default_sif`), the SIF's global header (`check_sif_header`,
`sif_id`), its labels' namespace (SIF_LABEL); what a step in it is started with (STEP_VARIABLE)
and where the comms of `invoke comms` are bound in it (SIF_COMMS, `runtime_binds`). The SIF
itself is made by the sif feature (sif/host.py, sif/recipe.py).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TextIO, cast

from torchbuild.core.errors import ImageNotFound, SifError, ToolMissing
from torchbuild.core.handover import Slot
from torchbuild.core.process import QUERY_TIMEOUT, run_captured, run_streamed
from torchbuild.core.progress import Tee
from torchbuild.core.safeio import read_head
from torchbuild.profile.config import BuildSpec, cache_dir
from torchbuild.runtime.engine import LABEL_PREFIX, Engine

DEFAULT_SIF = "torch-build.sif"
SIF_LABEL = f"{LABEL_PREFIX}.sif"
# What unprivileged Apptainer needs inside a Docker container (shared/TESTBED.md); no --privileged.
BUILDER_CAPS = ["SYS_ADMIN"]
BUILDER_DEVICES = ["/dev/fuse:/dev/fuse:rwm"]
BUILDER_SECURITY = ["seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"]

# where a SIF carries the NCCL and plugin `invoke comms` built, or where they are bound at run time
SIF_COMMS = "/opt/torchbuild/comms"

# the variable a step torchbuild runs in the SIF is started with (apptainer backend, --env).
# The %environment's warning about comms that are not bound skips it when it is set, but
# Apptainer 1.4 sets --env values after %environment runs: the comms step's output shows it too
STEP_VARIABLE = "TORCHBUILD_STEP"


def sif_filename(spec: BuildSpec) -> str:
    return f"torch-build-{spec.profile}-{spec.arch.value}.sif"


def default_sif(spec: BuildSpec, directory: Path = Path()) -> Path:
    return directory / sif_filename(spec)


def runtime_binds(prefix: Path, spec: BuildSpec) -> list[str]:
    """The --bind specs a job running torch in the SIF needs for the comms `invoke comms`
    built at prefix: that prefix at SIF_COMMS and the site's libfabric at its own path, read-only."""
    binds = [f"{prefix}:{SIF_COMMS}:ro"]
    if spec.libfabric_prefix and spec.aws_ofi_nccl_version:
        binds.append(f"{spec.libfabric_prefix}:{spec.libfabric_prefix}:ro")
    return binds


# the SIF global header: a 32-byte launch script line, then this magic
SIF_MAGIC = b"SIF_MAGIC\x00"
SIF_MAGIC_OFFSET = 32


SIF_ID_OFFSET = SIF_MAGIC_OFFSET + len(SIF_MAGIC) + 3 + 3  # after the magic, version and arch


def sif_id(sif: Path) -> str:
    """The SIF's ID: the UUID its global header gets when it is built (each build a new one)."""
    head = read_head(sif, SIF_ID_OFFSET + 16, "--sif", ImageNotFound)
    return head[SIF_ID_OFFSET : SIF_ID_OFFSET + 16].hex()


def check_sif_header(sif: Path, what: str, hint: str) -> None:
    """ImageNotFound unless sif is a regular file that starts with the SIF global header (read:
    its first 64 bytes), so a text file or a squashfs given as --sif is named before Apptainer
    or a batch job is asked to run it."""
    head = read_head(sif, 64, what, ImageNotFound)
    if head[SIF_MAGIC_OFFSET : SIF_MAGIC_OFFSET + len(SIF_MAGIC)] != SIF_MAGIC:
        raise ImageNotFound(f"{sif} is not a SIF (no SIF header)", hint=hint)


# --------------------------------------------------------------------------- reaching apptainer


def _stream(cmd: Sequence[str], env: Mapping[str, str], out: TextIO, log: Path | None) -> int:
    """Run cmd with stdout and stderr merged and streamed line by line to out (and log).
    The environment is os.environ plus env. Ctrl-C or SIGTERM stops it and its children."""
    tee = Tee(log, out) if log else None
    try:
        return run_streamed(cmd, env={**os.environ, **env}, on_line=tee.write if tee else _writer(out)).returncode
    finally:
        if tee:
            tee.close()


def _writer(out: TextIO) -> Callable[[str], None]:
    def write(line: str) -> None:
        out.write(line)
        out.flush()

    return write


class Apptainer:
    """Where Apptainer runs. call() streams output and returns the exit code."""

    description = "apptainer"
    run_flags: tuple[str, ...] = ()  # flags every exec/run needs here

    def call(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        paths: Iterable[Path] = (),
        out: TextIO = sys.stdout,
        log: Path | None = None,
        memory_limit: str | None = None,
    ) -> int:
        raise NotImplementedError

    def labels(self, sif: Path) -> dict[str, str]:
        raise NotImplementedError

    _build_flags: frozenset[str] | None = None

    def build_flags(self) -> frozenset[str]:
        """Which of BUILD_FLAGS this Apptainer's `build` has (read once from `build --help`)."""
        if self._build_flags is None:
            buf = io.StringIO()
            self.call(["build", "--help"], out=buf)
            self._build_flags = frozenset(flag for flag in BUILD_FLAGS if f"{flag} " in buf.getvalue())
        return self._build_flags


# build flags torchbuild uses only where they exist (--mksquashfs-args: Apptainer 1.4+)
BUILD_FLAGS = ("--mksquashfs-args",)


class HostApptainer(Apptainer):
    def __init__(self, exe: str) -> None:
        self.exe = exe
        self.description = f"{Path(exe).name} on this host ({exe})"

    def call(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        paths: Iterable[Path] = (),
        out: TextIO = sys.stdout,
        log: Path | None = None,
        memory_limit: str | None = None,
    ) -> int:
        if memory_limit:
            raise SifError(
                "--memory needs the apptainer-builder container",
                hint="on a node, the batch allocation limits memory",
            )
        return _stream([self.exe, *args], env or {}, out, log)

    def labels(self, sif: Path) -> dict[str, str]:
        """`inspect --labels` through spython's client where its `singularity` name exists."""
        if shutil.which("singularity"):
            from spython.main import Client

            data = Client.inspect(image=str(sif), json=True, quiet=True)
            labels = (((data or {}).get("data") or {}).get("attributes") or {}).get("labels")
            if isinstance(labels, dict):
                return {str(k): str(v) for k, v in labels.items()}
        proc = run_captured([self.exe, "inspect", "--json", "--labels", "--", str(sif)], timeout=QUERY_TIMEOUT)
        if proc.returncode != 0:
            raise SifError(f"cannot inspect {sif}: {proc.stderr.strip()[-300:]}")
        return {str(k): str(v) for k, v in json.loads(proc.stdout)["data"]["attributes"]["labels"].items()}


class DockerApptainer(Apptainer):
    run_flags = ("--userns",)  # setuid mode cannot work in a container

    def __init__(self, engine: Engine, tag: str, home: Path) -> None:
        self.engine, self.tag, self.home = engine, tag, home
        self.description = f"the apptainer-builder container ({tag})"

    def call(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        paths: Iterable[Path] = (),
        out: TextIO = sys.stdout,
        log: Path | None = None,
        memory_limit: str | None = None,
        command: Sequence[str] = ("apptainer",),
    ) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        tee = Tee(log, out) if log else None
        try:
            return self._run(command, args, env, paths, cast(TextIO, tee) if tee else out, memory_limit)
        finally:
            if tee:
                tee.close()

    def _run(
        self,
        command: Sequence[str],
        args: Sequence[str],
        env: Mapping[str, str] | None,
        paths: Iterable[Path],
        out: TextIO,
        memory_limit: str | None,
    ) -> int:
        mounts = {str(p): str(p) for p in {Path(p).resolve() for p in [*paths, self.home]}}
        return self.engine.run(
            self.tag,
            [*command, *args],
            mounts=mounts,
            user="0:0",  # the entrypoint drops to TORCHBUILD_UID:TORCHBUILD_GID at once
            environment={
                **(env or {}),
                "HOME": str(self.home),
                "TORCHBUILD_UID": str(os.getuid()),
                "TORCHBUILD_GID": str(os.getgid()),
            },
            workdir=str(self.home),
            out=out,
            memory_limit=memory_limit,
            cap_add=BUILDER_CAPS,
            devices=BUILDER_DEVICES,
            security_opt=BUILDER_SECURITY,
        )

    def labels(self, sif: Path) -> dict[str, str]:
        buf = io.StringIO()
        rc = self.call([str(sif)], paths=[sif.parent], out=buf, command=("torchbuild", "inside.sif-labels"))
        for line in buf.getvalue().splitlines():
            if line.startswith(LABELS_PREFIX):
                return dict(json.loads(line[len(LABELS_PREFIX) :]))
        raise SifError(f"cannot inspect {sif} (exit {rc}): {buf.getvalue().strip()[-300:]}")


LABELS_PREFIX = "labels: "


def host_apptainer() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


class BuilderImage(Protocol):
    def __call__(self, spec: BuildSpec, engine: Engine, *, rebuild: bool = False, out: TextIO = sys.stdout) -> str: ...


# sif.host.ensure_builder: the apptainer-builder image's tag, built on first use from a build
# context the image feature lays out; torchbuild.tasks hands it over
BUILDER_IMAGE: Slot[BuilderImage] = Slot("the apptainer-builder image (sif.host.ensure_builder)")


def locate(
    spec: BuildSpec, mode: str = "auto", engine: Callable[[], Engine] = Engine.connect, out: TextIO = sys.stdout
) -> Apptainer:
    """auto: the host's apptainer if there is one, else the builder container; host or docker: only that."""
    if mode not in ("auto", "host", "docker"):
        raise SifError(f"unknown apptainer mode {mode!r}", hint="use --apptainer auto, host or docker")
    exe = host_apptainer() if mode != "docker" else None
    if exe:
        return HostApptainer(exe)
    if mode == "host":
        raise ToolMissing(
            "neither apptainer nor singularity is on PATH",
            hint="`module load apptainer`, or use --apptainer docker on a host with a Docker engine",
        )
    eng = engine()
    return DockerApptainer(eng, BUILDER_IMAGE.get()(spec, eng, out=out), cache_dir(spec) / "apptainer" / "home")
