"""Local Debian base images made with debootstrap, for sites (and CI) without registry access."""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TextIO

from torchbuild.core.arch import Arch
from torchbuild.core.errors import BaseImageError, ToolMissing
from torchbuild.core.process import run_captured
from torchbuild.image.host import check_platform, require_emulation
from torchbuild.runtime.engine import LABEL_PREFIX, Engine

BASE_REPO = "torchbuild/base"
DEFAULT_COMPONENTS = ("main", "contrib", "non-free")
_APT_CONF = "/etc/apt/apt.conf.d/99torchbuild"

_SCRATCH_DOCKERFILE = """FROM scratch
ADD rootfs.tar /
CMD ["/bin/bash"]
"""


def base_tag(suite: str, arch: Arch) -> str:
    return f"{BASE_REPO}:{suite}-{arch.value}"


def _preflight(arch: Arch) -> str:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ToolMissing("debootstrap is not installed", hint="apt-get install debootstrap (as root)")
    if os.geteuid() != 0:
        raise BaseImageError("debootstrap must run as root", hint="rerun with sudo, or use a registry base image")
    require_emulation(arch)
    return debootstrap


def _skip_devices(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Device nodes under /dev are the engine's business, not the image's."""
    return None if info.ischr() or info.isblk() else info


def _debootstrap(
    debootstrap: str, suite: str, arch: Arch, rootfs: Path, mirror: str | None, components: tuple[str, ...], out: TextIO
) -> None:
    """debootstrap --variant=minbase suite into rootfs; its output goes to debootstrap.log beside
    rootfs and its last lines to out; BaseImageError when it fails."""
    cmd = [
        debootstrap,
        "--variant=minbase",
        f"--arch={arch.debian_arch}",
        f"--components={','.join(components)}",
        suite,
        str(rootfs),
    ]
    if mirror:
        cmd.append(mirror)
    print(f"$ {' '.join(cmd)}", file=out, flush=True)
    proc = run_captured(cmd, merged=True)
    (rootfs.parent / "debootstrap.log").write_text(proc.stdout)
    for line in proc.stdout.splitlines()[-5:]:
        print(f"  {line}", file=out)
    if proc.returncode != 0:
        last = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
        raise BaseImageError(f"debootstrap {suite} ({arch.debian_arch}) failed: {last[0]}")


def _prepare_rootfs(rootfs: Path, ignore_valid_until: bool) -> None:
    """apt settings for the image, and an empty apt cache (the toolchain recipe runs apt-get update)."""
    if ignore_valid_until:  # snapshot mirrors serve Release files past their Valid-Until
        conf = rootfs / _APT_CONF.lstrip("/")
        conf.write_text('Acquire::Check-Valid-Until "false";\n')
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)


def _scratch_context(rootfs: Path) -> Path:
    """Turn rootfs into rootfs.tar beside it, with a FROM scratch Dockerfile: a build context
    whose platform BuildKit and the classic builder record correctly (docker import does not)."""
    ctx = rootfs.parent
    with tarfile.open(ctx / "rootfs.tar", "w") as tar:
        tar.add(rootfs, arcname=".", filter=_skip_devices)
    shutil.rmtree(rootfs)
    (ctx / "Dockerfile").write_text(_SCRATCH_DOCKERFILE)
    (ctx / ".dockerignore").write_text("rootfs\ndebootstrap.log\n")
    return ctx


def make_base_image(
    engine: Engine,
    *,
    suite: str,
    arch: Arch,
    work_dir: Path,
    mirror: str | None = None,
    components: tuple[str, ...] = DEFAULT_COMPONENTS,
    ignore_valid_until: bool = False,
    rebuild: bool = False,
    out: TextIO = sys.stdout,
) -> tuple[str, bool]:
    """debootstrap suite for arch and import it as torchbuild/base:<suite>-<arch>.

    Returns (tag, made): made is False when the image already existed. The root filesystem
    lives in a temporary directory under work_dir and is removed whatever happens.
    """
    tag = base_tag(suite, arch)
    if not rebuild and engine.image_attrs(tag) is not None:
        return tag, False
    debootstrap = _preflight(arch)
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"rootfs-{suite}-{arch}-", dir=work_dir) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(debootstrap, suite, arch, rootfs, mirror, components, out)
        _prepare_rootfs(rootfs, ignore_valid_until)
        _import_rootfs(engine, rootfs, tag, suite, arch, mirror, work_dir, out)
    check_platform(engine, tag, arch)
    print(f"{tag} ready in {time.monotonic() - start:.0f} s", file=out)
    return tag, True


def _import_rootfs(
    engine: Engine, rootfs: Path, tag: str, suite: str, arch: Arch, mirror: str | None, work_dir: Path, out: TextIO
) -> None:
    """Import the root filesystem as tag: a scratch image labelled with its suite, arch and mirror."""
    ctx = _scratch_context(rootfs)
    print(f"importing as {tag} ({arch.docker_platform})", file=out, flush=True)
    engine.build(
        ctx,
        tag=tag,
        labels={
            f"{LABEL_PREFIX}.base-suite": suite,
            f"{LABEL_PREFIX}.arch": arch.value,
            f"{LABEL_PREFIX}.base-mirror": mirror or "debootstrap default",
        },
        platform=arch.docker_platform,
        log=work_dir / f"base-{suite}-{arch}.log",
        out=out,
    )
