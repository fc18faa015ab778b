"""The toolchain image's installed list: where the image keeps it, its canonical form and the
sha256 a build's manifest records of it (runtime/manifest.py `installed_packages`).

The image writes it with `python -m torchbuild.image.lock installed` (image/lock.py makes the
lines: every dpkg package and each venv's pip packages), one line a package: `dpkg
name=version` and `pip <venv> name==version`. That command also runs in the image before
torchbuild's dependencies are checked to be there (a locked image installs torchbuild with
`--no-deps`), so this module uses the standard library only: it is not manifest.py, which
imports cattrs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

INSTALLED_LIST = "/opt/torchbuild/installed.txt"


def canonical_list(lines: Iterable[str]) -> list[str]:
    """The installed list's canonical form: stripped, non-empty, unique, sorted (bytewise)."""
    return sorted({line.strip() for line in lines if line.strip()})


def installed_digest(lines: Iterable[str]) -> str:
    """sha256 of the canonical list, one line each ending in a newline."""
    return hashlib.sha256("".join(f"{line}\n" for line in canonical_list(lines)).encode()).hexdigest()
