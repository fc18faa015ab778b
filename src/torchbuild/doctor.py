"""`invoke doctor`: what this host can do, and a verdict per task."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

from .arch import Arch, binfmt_ready
from .engine import Engine, engine_address
from .errors import EngineUnavailable
from .jobs import GiB, HostResources


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    task: str
    ok: bool
    why: str


def _version_of(cmd: list[str]) -> str | None:
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if proc.returncode == 0 and text else None


def _gpus() -> str | None:
    listing = None
    if shutil.which("nvidia-smi"):
        try:
            proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
            if proc.returncode == 0 and proc.stdout.strip():
                listing = "; ".join(proc.stdout.strip().splitlines())
        except (OSError, subprocess.TimeoutExpired):
            pass
    if listing is None and Path("/dev/nvidia0").exists():
        listing = "/dev/nvidia0 present (no nvidia-smi)"
    return listing


def run_checks(cache_dir: Path) -> tuple[list[Check], list[Verdict]]:
    checks: list[Check] = []
    host = Arch.host()
    foreign = Arch.AARCH64 if host is Arch.X86_64 else Arch.X86_64

    engine_ok = False
    buildkit = None
    try:
        engine = Engine.connect(timeout=10)
        v = engine.version()
        engine_ok = True
        checks.append(
            Check("docker engine", True, f"{v.get('Version')} (API {v.get('ApiVersion')}) at {engine_address()}")
        )
        buildkit = _version_of(["docker", "buildx", "version"])
    except EngineUnavailable as exc:
        checks.append(Check("docker engine", False, f"{exc.message}; {exc.hint}"))
    checks.append(
        Check("buildkit (docker buildx)", buildkit is not None, buildkit or "not found (classic builder only)")
    )

    apptainer = _version_of(["apptainer", "--version"]) or _version_of(["singularity", "--version"])
    checks.append(
        Check(
            "apptainer/singularity",
            apptainer is not None,
            apptainer or "not found (sif and --engine apptainer use the apptainer-builder container)",
        )
    )
    fuse = Path("/dev/fuse").exists()

    emu = binfmt_ready(foreign)
    checks.append(
        Check(
            f"{foreign} emulation",
            emu,
            f"qemu binfmt {foreign.qemu_binfmt} enabled"
            if emu
            else "missing: apt-get install qemu-user-static binfmt-support && update-binfmts --enable",
        )
    )
    debootstrap = shutil.which("debootstrap")
    checks.append(
        Check("debootstrap", debootstrap is not None, debootstrap or "not found: apt-get install debootstrap")
    )
    is_root = os.geteuid() == 0
    checks.append(Check("root", is_root, "yes" if is_root else "no (base-image needs root)"))

    res = HostResources.detect()
    checks.append(Check("cores", True, str(res.cores)))
    checks.append(
        Check("memory", res.memory_bytes >= 8 * GiB, f"{res.memory_bytes / GiB:.1f} GiB ({res.memory_source})")
    )
    probe = cache_dir if cache_dir.exists() else next(p for p in [cache_dir, *cache_dir.parents] if p.exists())
    free = shutil.disk_usage(probe).free
    checks.append(Check("free disk", free >= 40 * GiB, f"{free / GiB:.0f} GiB at {probe} (a CUDA build needs ~40 GiB)"))
    gpu = _gpus()
    checks.append(Check("gpu", gpu is not None, gpu or "none visible (builds work; GPU verification is skipped)"))
    compilers = _version_of(["g++", "--version"]) or _version_of(["clang++", "--version"])
    checks.append(Check("host compiler", compilers is not None, compilers or "none (only needed for native builds)"))

    native_missing = [t for t in ("cmake", "ninja", "ccache") if shutil.which(t) is None]
    if compilers is None:
        native_missing.insert(0, "g++ or clang++")
    verdicts = [
        Verdict("config", True, "always available"),
        Verdict(f"image --arch {host}", engine_ok, "engine reachable" if engine_ok else "needs a Docker engine"),
        Verdict(
            f"image --arch {foreign}",
            engine_ok and emu,
            "engine + qemu binfmt" if engine_ok and emu else "needs a Docker engine and qemu-user binfmt",
        ),
        Verdict(
            "base-image",
            engine_ok and debootstrap is not None and is_root,
            "engine, debootstrap, root"
            if engine_ok and debootstrap and is_root
            else "needs engine, debootstrap and root",
        ),
        Verdict(
            "build --in-container",
            engine_ok,
            "engine reachable (the profile's image must be built)" if engine_ok else "needs a Docker engine",
        ),
        Verdict(
            "sif, build --engine apptainer",
            apptainer is not None or (engine_ok and fuse),
            f"this host's {apptainer}"
            if apptainer
            else "the apptainer-builder container (engine + /dev/fuse)"
            if engine_ok and fuse
            else "needs apptainer, or a Docker engine and /dev/fuse",
        ),
        Verdict(
            "build (native)",
            not native_missing,
            "compiler, cmake, ninja, ccache on PATH" if not native_missing else f"missing: {', '.join(native_missing)}",
        ),
    ]
    return checks, verdicts


def render(checks: list[Check], verdicts: list[Verdict]) -> str:
    width = max(len(c.name) for c in checks)
    lines = ["host:"]
    lines += [f"  {'ok ' if c.ok else '-- '} {c.name:<{width}}  {c.detail}" for c in checks]
    lines.append("tasks:")
    tw = max(len(v.task) for v in verdicts)
    lines += [f"  {'ready' if v.ok else 'NOT READY':<9} {v.task:<{tw}}  {v.why}" for v in verdicts]
    return "\n".join(lines)
