"""glibc and libstdc++ symbol versions: the site's floor against what a toolchain or wheel needs.

A shared object records the newest symbol version it takes from glibc (`GLIBC_2.38`), from
libstdc++ (`GLIBCXX_3.4.32`) and from its C++ ABI (`CXXABI_1.3.15`); the dynamic loader refuses it
on a system whose libraries are older. The profile's glibc_floor and libstdcxx_floor name the
oldest the wheel must run on. This module compares such versions and names the bases whose C
library meets a floor; it reads no file (runtime/elffloor.py reads the ELF files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

_VERSION = re.compile(r"[0-9]{1,4}(\.[0-9]{1,4}){1,3}")

# Base images whose C library and default GCC's libstdc++ are known (their distributions' own
# packages): the toolchain check names the ones that meet a floor. GLIBCXX_ of each GCC's
# libstdc++: 8 -> 3.4.25, 10 -> 3.4.28, 11 -> 3.4.29, 12 -> 3.4.30, 13 -> 3.4.32, 14 -> 3.4.33.
KNOWN_BASES: tuple[tuple[str, str, str], ...] = (
    ("quay.io/pypa/manylinux_2_28_x86_64 (AlmaLinux 8, the manylinux_2_28 builder)", "2.28", "3.4.25"),
    ("rockylinux:8", "2.28", "3.4.25"),
    ("debian:bullseye (or `invoke base-image --suite bullseye`)", "2.31", "3.4.28"),
    ("ubuntu:20.04", "2.31", "3.4.28"),
    ("rockylinux:9", "2.34", "3.4.29"),
    ("ubuntu:22.04", "2.35", "3.4.30"),
    ("debian:bookworm", "2.36", "3.4.30"),
    ("ubuntu:24.04", "2.39", "3.4.33"),
    ("debian:trixie", "2.41", "3.4.34"),
)

# a base_image value (or its tail) -> the glibc of a base in KNOWN_BASES, and the version of the
# GCC its `gcc` package installs ("" where the default compiler is not the distribution's: the
# manylinux builders' gcc-toolset); nvidia/cuda images are named by their Ubuntu or Rocky release
_BASES = (
    (re.compile(r"(^|[/:-])(ubuntu)?20\.04($|[^0-9])"), "2.31", "9.4"),
    (re.compile(r"(^|[/:-])(ubuntu)?22\.04($|[^0-9])"), "2.35", "11.4"),
    (re.compile(r"(^|[/:-])(ubuntu)?24\.04($|[^0-9])"), "2.39", "13.2"),
    (re.compile(r"bullseye"), "2.31", "10.2"),
    (re.compile(r"bookworm"), "2.36", "12.2"),
    (re.compile(r"trixie"), "2.41", "14.2"),
    (re.compile(r"manylinux_?2_28|manylinux2_28"), "2.28", ""),
    (re.compile(r"rockylinux:?8|almalinux:8"), "2.28", "8.5"),
    (re.compile(r"rockylinux:?9|almalinux:9"), "2.34", "11.4"),
)


def parse(text: str) -> tuple[int, ...]:
    """ "2.31" -> (2, 31); ValueError for anything else (the profile's pattern says the same)."""
    if not _VERSION.fullmatch(text):
        raise ValueError(f"{text!r} is not a version like 2.31")
    return tuple(int(p) for p in text.split("."))


def newest(versions: Iterable[str], prefix: str) -> str:
    """The newest of the symbol versions with prefix (GLIBC_, GLIBCXX_, CXXABI_) among versions,
    without the prefix; "" when none has it. GLIBC_PRIVATE and other non-numbered names are skipped."""
    found = [v[len(prefix) :] for v in versions if v.startswith(prefix)]
    numbered = [v for v in found if _VERSION.fullmatch(v)]
    return max(numbered, key=parse, default="")


def above(version: str, floor: str) -> bool:
    """Whether version (possibly "", none needed) is newer than floor (possibly "", no floor)."""
    return bool(version and floor) and parse(version) > parse(floor)


def host_glibc() -> str:
    """The glibc this process runs on ("2.36"), "" where it is not glibc (musl)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return ""
    name, _, version = text.partition(" ")
    return version if name == "glibc" and _VERSION.fullmatch(version) else ""


def base_glibc(base_image: str) -> str:
    """The glibc of a base image torchbuild knows by name (ubuntu:24.04 -> 2.39), "" otherwise."""
    return next((g for pattern, g, _ in _BASES if pattern.search(base_image)), "")


def base_gcc(base_image: str) -> str:
    """The GCC of a base image's own `gcc` package where torchbuild knows the base by name
    (ubuntu:20.04 -> 9.4), "" otherwise."""
    return next((gcc for pattern, _, gcc in _BASES if pattern.search(base_image)), "")


def bases_meeting(glibc_floor: str, libstdcxx_floor: str = "") -> list[str]:
    """The known bases whose glibc (and default libstdc++) are at most the floors, newest first:
    what the toolchain check proposes instead of a base that is too new."""
    fits = [(name, g) for name, g, cxx in KNOWN_BASES if not above(g, glibc_floor) and not above(cxx, libstdcxx_floor)]
    return [f"{name} (glibc {g})" for name, g in sorted(fits, key=lambda f: parse(f[1]), reverse=True)]


# Base images whose package manager is dnf (RPM): Rocky/Alma/RHEL/CentOS Stream/Fedora, Red Hat's
# UBI, the pypa manylinux_2_28+ builders (AlmaLinux 8 and later) and images named after one of
# them (nvidia/cuda:12.6.2-devel-rockylinux8). manylinux2014 (CentOS 7, yum) is not among them.
_RPM_BASES = re.compile(
    r"(^|[/:_-])(rockylinux|almalinux|manylinux_?2_[0-9]+|ubi[0-9]*|rhel[0-9]*|centos|fedora)([0-9.]*)($|[^a-z0-9])"
)


def base_family(base_image: str) -> str:
    """The package family of a base image by its name: "rpm" (dnf) for the RPM distributions
    above, "deb" (apt) otherwise; torchbuild's recipe for a base is chosen by it."""
    return "rpm" if _RPM_BASES.search(base_image.lower()) else "deb"


def base_advice(glibc_floor: str, libstdcxx_floor: str = "") -> str:
    """What to set instead of a base that is too new: the two newest known bases meeting the floors."""
    fits = bases_meeting(glibc_floor, libstdcxx_floor)
    return f"set base_image to {' or '.join(fits[:2])}" if fits else "use a base as old as the site's OS"
