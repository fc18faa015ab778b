"""Apptainer: convert a built toolchain image into a SIF, and run builds from SIFs.

The SIF is made from the Docker image that `invoke image` built (a docker-archive written by
`docker save`), never by re-running the recipe. A small definition file adds what Docker
images do not carry: the runscript (the `torchbuild` CLI), `%environment` (the profile's
runtime environment), `%labels` (the image id it came from) and `%help` (the binds).

Apptainer is reached one of two ways, chosen by `locate()`:

* HostApptainer: `apptainer` (or `singularity`) on PATH, as on an HPC node.
* DockerApptainer: the apptainer-builder container on a Docker host without Apptainer
  (containers/apptainer-builder.Dockerfile). It gets the few privileges unprivileged Apptainer
  needs (SYS_ADMIN, /dev/fuse, unconfined seccomp/AppArmor/system paths; never --privileged),
  runs as the caller, and sees every host path it needs at the same path, so one command line
  means the same thing both ways.

spython drives `inspect` on the host. Builds and runs do not go through spython's build() and
run(): build() defaults to sudo, their streaming reads stderr only at the end (Apptainer
reports progress on stderr, and a full stderr pipe stalls it), environ= replaces the whole
environment, and the child cannot be stopped on Ctrl-C. `_stream` runs the same command lines
with both streams merged, the environment extended rather than replaced, and the child
terminated on interrupt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, cast

from . import __version__
from .arch import Arch
from .build import Tee
from .config import DEFAULT_PROFILE, BuildSpec, cache_dir, profile_text
from .engine import Engine
from .environment import build_env, comms_runtime_env, prepend_path_lines, runtime_env
from .errors import BuildInterrupted, InsufficientSpace, SifError, ToolMissing
from .image import LABEL_PREFIX, inputs_hash, make_context, require_image
from .process import interrupts_unwind, run_streamed

DEFAULT_SIF = "torch-build.sif"
BUILDER_REPO = "torchbuild/apptainer-builder"
BUILDER_DOCKERFILE = "apptainer-builder.Dockerfile"
BUILDER_ENTRYPOINT = "apptainer-entrypoint.sh"
TORCHBUILD_EXE = "/opt/venv/bin/torchbuild"
BAKED_PROFILES = "/opt/torchbuild/profiles"
SIF_LABEL = f"{LABEL_PREFIX}.sif"
# What unprivileged Apptainer needs inside a Docker container (shared/TESTBED.md); no --privileged.
BUILDER_CAPS = ["SYS_ADMIN"]
BUILDER_DEVICES = ["/dev/fuse:/dev/fuse:rwm"]
BUILDER_SECURITY = ["seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"]
# docker save writes the layers (about the image size), Apptainer extracts them again into
# APPTAINER_TMPDIR (about the image size) and squashes them (measured: SIF = 0.40 x image).
CACHE_FACTOR, OUT_FACTOR = 2.6, 0.6


def sif_filename(spec: BuildSpec) -> str:
    return f"torch-build-{spec.profile}-{spec.arch.value}.sif"


def default_sif(spec: BuildSpec, directory: Path = Path()) -> Path:
    return directory / sif_filename(spec)


def baked_profile_path(spec: BuildSpec) -> str:
    return f"{BAKED_PROFILES}/{spec.profile}.yaml"


def sif_build_env(spec: BuildSpec) -> dict[str, str]:
    """%environment, first part: the environment the profile's build sees, with the cache at
    /cache. MAX_JOBS is left out: it is planned on the node that runs the build."""
    env = build_env(spec, cache_root="/cache", jobs=1, backend="apptainer")
    env.pop("MAX_JOBS")
    return {"TORCHBUILD_PROFILE": baked_profile_path(spec), **env}


# where a SIF carries the NCCL and plugin `invoke comms` built
SIF_COMMS = "/opt/torchbuild/comms"


def environment_section(spec: BuildSpec, comms: Mapping[str, Any] | None = None) -> str:
    """The %environment body: the build's environment, then apart from it the profile's
    runtime_env (what jobs running torch need), then the host_mpi directories first on
    LD_LIBRARY_PATH wherever they are bound in (`apptainer exec --bind DIR ...`); with comms
    (the comms manifest), the carried NCCL's lib/ first and the plugin NCCL should load."""
    lines = ["# the build's environment (invoke build, `torchbuild build`)"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sif_build_env(spec).items()]
    if comms:
        lines.append(f"# the NCCL and aws-ofi-nccl plugin of `invoke comms`, carried in {SIF_COMMS}")
        for k, v in comms_runtime_env(SIF_COMMS, comms).items():
            if k == "LD_LIBRARY_PATH":
                lines += prepend_path_lines(k, [v])
            else:
                lines.append(f"export {k}={shlex.quote(v)}")
    runtime = runtime_env(spec)
    if runtime:
        lines.append("# runtime_env: what jobs that run torch need")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in runtime.items()]
    if spec.host_mpi:
        lines.append("# host_mpi: the host's MPI library first, where it is bound in")
        lines += prepend_path_lines("LD_LIBRARY_PATH", spec.host_mpi, only_if_present=True)
    return "\n".join(f"    {line}" for line in lines)


def runtime_hash(spec: BuildSpec, comms: Mapping[str, Any] | None = None) -> str:
    """What of the runtime keys the SIF bakes in (its %environment and the comms it carries),
    as a label: a SIF whose label differs is converted again even when the image is the same."""
    data: dict[str, Any] = {"runtime_env": dict(spec.runtime_env), "host_mpi": list(spec.host_mpi)}
    if comms:
        data["comms"] = comms.get("key", "")
    blob = json.dumps(data, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def help_text(spec: BuildSpec) -> str:
    return f"""torchbuild toolchain SIF: profile {spec.profile} (PyTorch {spec.torch_version}, {spec.arch.value},
Python {spec.python_version}{", CUDA " + spec.cuda_version if spec.cuda else ""}). The runscript is the torchbuild CLI.

Binds (--bind HOST:CONTAINER,...):
  /src    the PyTorch source tree, read-write (patches are applied there, build/ is written there)
  /cache  ccache, pip cache and logs; keep it between runs so rebuilds hit ccache
  /out    optional: wheel, manifest and logs (default: ./out in the current directory)

Examples:
  apptainer run --bind $PWD/pytorch:/src,$HOME/.cache/torchbuild:/cache torch-build.sif build --preflight
  apptainer run --bind $PWD/pytorch:/src,$HOME/.cache/torchbuild:/cache,$PWD/out:/out torch-build.sif build
  apptainer run --nv --bind ... torch-build.sif build    # GPU node: --nv brings in the NVIDIA driver
  apptainer run torch-build.sif build --help             # every build option
  apptainer run torch-build.sif config                   # the baked profile and its environment
"""


def definition(
    spec: BuildSpec,
    *,
    archive: Path,
    profile_file: Path,
    image_id: str,
    comms: tuple[Path, Mapping[str, Any]] | None = None,
) -> str:
    """The definition file: bootstrap from the docker-archive, add metadata only (no %post);
    comms: (the host prefix, its manifest) of `invoke comms`, copied to SIF_COMMS."""
    for p in (archive, profile_file, *([comms[0]] if comms else [])):
        if any(c.isspace() for c in str(p)):
            raise SifError(
                f"{p}: Apptainer definition files cannot name paths with whitespace",
                hint="set cache_dir to a path without spaces (--set cache_dir=...)",
            )
    manifest = comms[1] if comms else None
    env = environment_section(spec, manifest)
    labels = {
        f"{SIF_LABEL}.image": spec.image_tag,
        f"{SIF_LABEL}.image-id": image_id,
        f"{SIF_LABEL}.profile-hash": spec.hash,
        f"{SIF_LABEL}.torchbuild-version": __version__,
        f"{SIF_LABEL}.runtime-hash": runtime_hash(spec, manifest),
    }
    files = f"    {profile_file} {baked_profile_path(spec)}"
    if comms:
        files += f"\n    {comms[0]} {SIF_COMMS}"
    label_lines = "\n".join(f"    {k} {v}" for k, v in labels.items())
    help_lines = "\n".join(f"    {line}" if line else "" for line in help_text(spec).splitlines())
    return f"""Bootstrap: docker-archive
From: {archive}

%files
{files}

%environment
{env}

%labels
{label_lines}

%runscript
    exec {TORCHBUILD_EXE} "$@"

%help
{help_lines}
"""


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
        proc = subprocess.run(
            [self.exe, "inspect", "--json", "--labels", str(sif)], capture_output=True, text=True, check=False
        )
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


def builder_tag(arch: Arch | None = None) -> str:
    return f"{BUILDER_REPO}:{__version__}-{(arch or Arch.host()).value}"


def ensure_builder(spec: BuildSpec, engine: Engine, *, rebuild: bool = False, out: TextIO = sys.stdout) -> str:
    """The apptainer-builder image for this host's arch, built on first use (then a label check)."""
    tag = builder_tag()
    arch = Arch.host()
    if engine.image_attrs(spec.sif_builder_base) is None:
        engine.pull(spec.sif_builder_base, arch.docker_platform, out=out)
    base_id = (engine.image_attrs(spec.sif_builder_base) or {}).get("Id", "")
    args = {"BASE_IMAGE": spec.sif_builder_base}
    with tempfile.TemporaryDirectory(prefix="torchbuild-builder-") as tmp:
        ctx = Path(tmp)
        make_context(spec, ctx, dockerfile=BUILDER_DOCKERFILE, extra=[BUILDER_ENTRYPOINT])
        digest = inputs_hash(arch, ctx, args, base_id)
        current = ((engine.image_attrs(tag) or {}).get("Config") or {}).get("Labels") or {}
        if not rebuild and current.get(f"{LABEL_PREFIX}.inputs-hash") == digest:
            return tag
        log = cache_dir(spec) / "logs" / f"apptainer-builder-{time.strftime('%Y%m%d-%H%M%S')}.log"
        print(f"building {tag} from {spec.sif_builder_base}", file=out, flush=True)
        engine.build(
            ctx,
            tag=tag,
            buildargs=args,
            labels={
                "org.opencontainers.image.title": "torchbuild apptainer-builder",
                f"{LABEL_PREFIX}.version": __version__,
                f"{LABEL_PREFIX}.inputs-hash": digest,
            },
            platform=arch.docker_platform,
            nocache=rebuild,
            log=log,
            out=out,
        )
    return tag


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
    return DockerApptainer(eng, ensure_builder(spec, eng, out=out), cache_dir(spec) / "apptainer" / "home")


# --------------------------------------------------------------------------- conversion


def space_needed(image_size: int, cache: Path, out_dir: Path) -> dict[Path, int]:
    """Bytes needed per file system (keyed by an existing path on it) for one conversion."""
    need: dict[int, tuple[Path, int]] = {}
    for path, n in ((cache, int(image_size * CACHE_FACTOR)), (out_dir, int(image_size * OUT_FACTOR))):
        probe = _existing(path)
        dev = probe.stat().st_dev
        prev = need.get(dev, (probe, 0))
        need[dev] = (prev[0], prev[1] + n)
    return dict(need.values())


def check_space(needs: Mapping[Path, int], free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free) -> None:
    for path, n in needs.items():
        have = free(path)
        if have < n:
            raise InsufficientSpace(
                f"converting needs {n / 2**30:.1f} GiB free on the file system of {path}, "
                f"which has {have / 2**30:.1f} GiB; nothing was written"
            )


def _existing(path: Path) -> Path:
    for p in [path, *path.parents]:
        if p.exists():
            return p
    return Path("/")


@dataclasses.dataclass(frozen=True)
class SifResult:
    path: Path
    cached: bool
    seconds: float
    size: int
    image_size: int
    save_seconds: float = 0.0
    build_seconds: float = 0.0
    log: Path | None = None
    link: Path | None = None  # torch-build.sif, for the default profile


def build_sif(
    spec: BuildSpec,
    engine: Engine,
    apptainer: Apptainer,
    out_dir: Path,
    *,
    rebuild: bool = False,
    comms: tuple[Path, Mapping[str, Any]] | None = None,
    out: TextIO = sys.stdout,
) -> SifResult:
    """Convert spec's toolchain image into out_dir/torch-build-<profile>-<arch>.sif (carrying
    the prefix `invoke comms` built, when given).

    Nothing changes when the SIF already comes from the current image (a label check). The SIF
    is written under a temporary name and renamed into place, so a failed or interrupted
    conversion leaves the previous SIF (or none), never a partial one.
    """
    start = time.monotonic()
    attrs = require_image(spec, engine)
    image_id, image_size = str(attrs["Id"]), int(attrs.get("Size") or 0)  # type: ignore[call-overload]
    out_dir = out_dir.resolve()
    final = out_dir / sif_filename(spec)
    if final.exists() and not rebuild:
        labels = apptainer.labels(final)
        if (
            labels.get(f"{SIF_LABEL}.image-id") == image_id
            and labels.get(f"{LABEL_PREFIX}.version") == __version__
            and labels.get(f"{SIF_LABEL}.runtime-hash") == runtime_hash(spec, comms[1] if comms else None)
        ):
            link = _link_default(spec, final)
            return SifResult(final, True, time.monotonic() - start, final.stat().st_size, image_size, link=link)
    root = (cache_dir(spec) / "apptainer").resolve()
    check_space(space_needed(image_size, root, out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    work = root / "work" / run_id
    partial = out_dir / f".{final.name}.partial-{run_id}"
    log = cache_dir(spec) / "logs" / f"sif-{spec.profile}-{spec.arch.value}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {}
    for var in ("CACHEDIR", "TMPDIR"):
        d = root / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        env[f"APPTAINER_{var}"] = env[f"SINGULARITY_{var}"] = str(d)
    try:
        with interrupts_unwind():
            work.mkdir(parents=True)
            t0 = time.monotonic()
            print(f"saving {spec.image_tag} ({image_size / 2**30:.2f} GiB) to {work}", file=out, flush=True)
            archive = work / "image.tar"
            engine.save(spec.image_tag, archive)
            save_seconds = time.monotonic() - t0
            profile_file = work / f"{spec.profile}.yaml"
            profile_file.write_text(profile_text(spec))
            deffile = work / "torch-build.def"
            deffile.write_text(
                definition(spec, archive=archive, profile_file=profile_file, image_id=image_id, comms=comms)
            )
            print(f"converting with {apptainer.description}", file=out, flush=True)
            t1 = time.monotonic()
            rc = apptainer.call(
                ["build", "--force", str(partial), str(deffile)],
                env=env,
                paths=[root, out_dir, *([comms[0]] if comms else [])],
                out=out,
                log=log,
            )
            build_seconds = time.monotonic() - t1
            if rc != 0 or not partial.is_file():
                raise SifError(f"apptainer build exited with {rc} (log: {log})")
            os.replace(partial, final)
    except KeyboardInterrupt:
        raise BuildInterrupted(f"conversion interrupted; no {final.name} was written") from None
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    link = _link_default(spec, final)
    return SifResult(
        final, False, time.monotonic() - start, final.stat().st_size, image_size, save_seconds, build_seconds, log, link
    )


def _link_default(spec: BuildSpec, final: Path) -> Path | None:
    """torch-build.sif names the default profile's SIF for this host (a hard link, replaced
    atomically); returns it, or None for other profiles and arches."""
    if spec.profile != DEFAULT_PROFILE or spec.arch != Arch.host():
        return None
    link = final.parent / DEFAULT_SIF
    if link.exists() and os.path.samefile(link, final):
        return link  # (rename(2) over another link to the same file does nothing and keeps the source)
    tmp = final.parent / f".{DEFAULT_SIF}.partial-{uuid.uuid4().hex[:8]}"
    try:
        os.link(final, tmp)
    except OSError:
        shutil.copy2(final, tmp)
    os.replace(tmp, link)
    return link
