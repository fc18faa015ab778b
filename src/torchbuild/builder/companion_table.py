"""Which torchvision, torchaudio and torchtext release lines go with which torch (data; of the
rest of torchbuild it reads only profile.torch_lines' `minor`): builder/companions.py checks
profiles against it and builds by it.

A companion library's C++ extension is compiled against one torch's headers and ABI: a pair
outside this table either does not compile or fails at import with undefined symbols
(pytorch/pytorch#21477, pytorch/vision#2632). The lines are the ones the PyTorch release
process ships together; torchtext stopped at 0.18 (torch 2.3) and torchaudio at 2.11 (torch 2.11:
"There is no new release of torchaudio for now", pytorch/pytorch.github.io#2074, 2026-05; the
compatibility table on pytorch.org shows none for 2.12 and 2.13).

Sources: pytorch.org/get-started/compatibility (through torch 2.13) and pytorch/vision's own
version bumps for 0.29 and 0.30 ("Update version.txt for 0.30.0", pytorch/vision#9607). The rule
behind torchvision's column, 0.(N+15) for torch 2.N, has held from torch 2.0 (0.15) to 2.15 (0.30);
it names the likely ref for a torch newer than the table, which is then the user's to confirm
(`companion_refs`), never a silent guess.
"""

from __future__ import annotations

import re

from torchbuild.profile.torch_lines import minor

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
    "2.10": {"torchvision": "0.25", "torchaudio": "2.10"},
    "2.11": {"torchvision": "0.26", "torchaudio": "2.11"},
    "2.12": {"torchvision": "0.27"},
    "2.13": {"torchvision": "0.28"},
    "2.14": {"torchvision": "0.29"},
    "2.15": {"torchvision": "0.30"},
}
# torch's development branches: the companions' main goes with them (no version check)
DEVELOPMENT_REFS = ("main", "master", "viable/strict", "nightly")

REPOS = {
    "torchvision": "https://github.com/pytorch/vision.git",
    "torchaudio": "https://github.com/pytorch/audio.git",
    "torchtext": "https://github.com/pytorch/text.git",
}
TABLE_NAME = "torchbuild.builder.companion_table.TABLE (docs: For PyTorch developers)"

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


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


def _key(line: str) -> tuple[int, ...]:
    return tuple(int(p) for p in line.split("."))


def newer_than_table(torch_version: str) -> bool:
    line = minor(torch_version)
    return bool(line) and _key(line) > max(map(_key, TABLE))


def likely_ref(name: str, torch_version: str) -> str:
    """The tag the release process's rule gives for a torch the table does not know yet (torchvision
    0.(N+15).P for torch 2.N.P); '' for a library without such a rule."""
    line = minor(torch_version)
    if name != "torchvision" or not line.startswith("2."):
        return ""
    return f"v0.{int(line.split('.')[1]) + 15}.{patch(torch_version)}"


def pairing_problem(name: str, torch_version: str, torch_ref: str = "", ref: str = "") -> str:
    """Why `name` cannot be built with this torch ('' when it can). ref: the companion_refs entry
    the profile gives; it is what pairs a torch newer than the table."""
    if name not in NAMES:
        return f"{name!r} is not a companion library (one of {', '.join(NAMES)})"
    if is_development(torch_ref):
        return ""
    row = TABLE.get(minor(torch_version))
    if row is None and newer_than_table(torch_version):
        if ref:
            return ""
        guess = likely_ref(name, torch_version)
        return (
            f"torch {torch_version} is newer than the companion table (torch {', '.join(TABLE)} and main), so "
            f"which {name} goes with it is not known here"
            + (f"; the release rule gives {guess}: confirm it in {name}'s release notes and name it" if guess else "")
            + f" with companion_refs (--set companion_refs.{name}={guess or '<tag>'})"
        )
    if row is None:
        known = ", ".join(TABLE)
        return f"torch {torch_version} is not in the companion table (torch {known} and main)"
    if name not in row:
        last = max((t for t, r in TABLE.items() if name in r), key=_key)
        return f"{name} has no release for torch {minor(torch_version)}: its last line goes with torch {last}"
    return ""


def version_problem(name: str, found: str, torch_version: str, torch_ref: str = "") -> str:
    """Why a tree of `name` at version `found` (its version.txt) cannot go with this torch."""
    if is_development(torch_ref):
        return ""
    want = line_for(name, torch_version)
    if want is None and newer_than_table(torch_version):
        return ""  # paired by the profile's companion_refs (config refuses it otherwise)
    if want is None:
        return pairing_problem(name, torch_version, torch_ref)
    if minor(found) != want:
        return f"{name} {found} does not go with torch {torch_version}: {TABLE_NAME} pairs torch {minor(torch_version)} with {name} {want}"
    return ""
