"""Which torchvision, torchaudio and torchtext release lines go with which torch (no imports from
the rest of torchbuild: config checks profiles against it).

A companion library's C++ extension is compiled against one torch's headers and ABI: a pair
outside this table either does not compile or fails at import with undefined symbols
(pytorch/pytorch#21477, pytorch/vision#2632). The lines are the ones the PyTorch release
process ships together; torchtext stopped at 0.18 (torch 2.3).
"""

from __future__ import annotations

import re

NAMES = ("torchvision", "torchaudio", "torchtext")

# torch major.minor -> the release line of each companion that goes with it
TABLE: dict[str, dict[str, str]] = {
    "2.3": {"torchvision": "0.18", "torchaudio": "2.3", "torchtext": "0.18"},
    "2.4": {"torchvision": "0.19", "torchaudio": "2.4"},
    "2.5": {"torchvision": "0.20", "torchaudio": "2.5"},
    "2.6": {"torchvision": "0.21", "torchaudio": "2.6"},
    "2.7": {"torchvision": "0.22", "torchaudio": "2.7"},
    "2.8": {"torchvision": "0.23", "torchaudio": "2.8"},
    "2.9": {"torchvision": "0.24", "torchaudio": "2.9"},
}
# torch's development branches: the companions' main goes with them (no version check)
DEVELOPMENT_REFS = ("main", "master", "viable/strict", "nightly")

REPOS = {
    "torchvision": "https://github.com/pytorch/vision.git",
    "torchaudio": "https://github.com/pytorch/audio.git",
    "torchtext": "https://github.com/pytorch/text.git",
}
TABLE_NAME = "torchbuild.inputs.companion_table.TABLE (docs: For PyTorch developers)"

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def minor(version: str) -> str:
    """'2.6' of '2.6.0', '2.6.0a0+git1234', '0.21.0+gh200'; '' when it is not a release number."""
    m = _RELEASE.match(version.strip())
    return f"{m[1]}.{m[2]}" if m else ""


def patch(version: str) -> int:
    m = _RELEASE.match(version.strip())
    return int(m[3]) if m and m[3] else 0


def is_development(torch_ref: str) -> bool:
    return torch_ref in DEVELOPMENT_REFS


def line_for(name: str, torch_version: str) -> str | None:
    """The release line of `name` that goes with torch_version, None when the table has none."""
    return TABLE.get(minor(torch_version), {}).get(name)


def default_ref(name: str, torch_version: str, torch_ref: str = "") -> str:
    """The git ref a companion is built from: main for torch's development branches, else the
    tag of its line with torch's patch number (torch 2.5.1 -> v0.20.1, the release process's
    convention); '' when the table has no pair."""
    if is_development(torch_ref):
        return "main"
    line = line_for(name, torch_version)
    return f"v{line}.{patch(torch_version)}" if line else ""


def pairing_problem(name: str, torch_version: str, torch_ref: str = "") -> str:
    """Why `name` cannot be built with this torch ('' when it can)."""
    if name not in NAMES:
        return f"{name!r} is not a companion library (one of {', '.join(NAMES)})"
    if is_development(torch_ref):
        return ""
    row = TABLE.get(minor(torch_version))
    if row is None:
        known = ", ".join(TABLE)
        return f"torch {torch_version} is not in the companion table (torch {known} and main)"
    if name not in row:
        last = max((t for t, r in TABLE.items() if name in r), key=lambda t: tuple(map(int, t.split("."))))
        return f"{name} has no release for torch {minor(torch_version)}: its last line goes with torch {last}"
    return ""


def version_problem(name: str, found: str, torch_version: str, torch_ref: str = "") -> str:
    """Why a tree of `name` at version `found` (its version.txt) cannot go with this torch."""
    if is_development(torch_ref):
        return ""
    want = line_for(name, torch_version)
    if want is None:
        return pairing_problem(name, torch_version, torch_ref)
    if minor(found) != want:
        return f"{name} {found} does not go with torch {torch_version}: {TABLE_NAME} pairs torch {minor(torch_version)} with {name} {want}"
    return ""
