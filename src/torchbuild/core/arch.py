"""CPU architectures: the one place that maps our names to Docker's and Debian's."""

from __future__ import annotations

import enum
import platform
from pathlib import Path

from torchbuild.core.errors import ProfileError


class Arch(str, enum.Enum):
    X86_64 = "x86_64"
    AARCH64 = "aarch64"

    @property
    def docker_platform(self) -> str:
        return {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[self.value]

    @property
    def docker_arch(self) -> str:
        """The ``Architecture`` field of ``docker image inspect``."""
        return {"x86_64": "amd64", "aarch64": "arm64"}[self.value]

    @property
    def debian_arch(self) -> str:
        return {"x86_64": "amd64", "aarch64": "arm64"}[self.value]

    @property
    def qemu_binfmt(self) -> str:
        """Name of the binfmt_misc entry qemu-user registers for this arch."""
        return f"qemu-{self.value}"

    @classmethod
    def host(cls) -> Arch:
        """This machine's arch; a named error on one torchbuild does not build for (Bede's
        ppc64le login nodes): only the tasks that build or run torch here need it."""
        found = cls.host_or_none()
        if found is None:
            raise ProfileError(
                f"this host is {host_machine()}: torchbuild builds and runs torch on x86_64 and aarch64 only",
                hint="build in a job on a node of the target arch (`invoke submit`), or pass --arch x86_64 or --arch aarch64",
            )
        return found

    @classmethod
    def host_or_none(cls) -> Arch | None:
        """This machine's arch, or None where it is none of ours (config, submit, wheelhouse and
        doctor still work there, for a target named by the profile or --arch)."""
        try:
            return cls.parse(host_machine())
        except ProfileError:
            return None

    @classmethod
    def parse(cls, name: str) -> Arch:
        """Accept our names and the common aliases (amd64, arm64, linux/arm64)."""
        key = name.strip().lower().removeprefix("linux/")
        aliases = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
        if key not in aliases:
            raise ProfileError(
                f"unknown arch {name!r}; valid: {', '.join(a.value for a in cls)}",
                hint="use --arch x86_64 or --arch aarch64 (aliases amd64, arm64 are accepted)",
            )
        return cls(aliases[key])

    def __str__(self) -> str:
        return self.value


def host_machine() -> str:
    """The machine name of this host as uname gives it (x86_64, aarch64, ppc64le, ...)."""
    return platform.machine() or "an unknown machine"


def binfmt_ready(arch: Arch, binfmt_dir: Path = Path("/proc/sys/fs/binfmt_misc")) -> bool:
    """True when foreign binaries of arch run here (native, or a qemu-user binfmt entry enabled)."""
    if arch is Arch.host_or_none():
        return True
    entry = binfmt_dir / arch.qemu_binfmt
    try:
        return entry.read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        return False
