"""The flatbuffers header PyTorch ships pre-generated, made again for the flatbuffers the build uses.

torch/csrc/jit/serialization/mobile_bytecode_generated.h is flatc's output, checked in, and it
static_asserts the exact flatbuffers version it was generated with (23.3.3 in PyTorch 2.6). With
the vendored third_party/flatbuffers that holds; a build against a system flatbuffers (a
de-vendored source such as Debian's, USE_SYSTEM_LIBS) stops at that assertion in
flatbuffer_loader.cpp, about an hour into a two-core build. Debian's rules regenerate the header
with the system flatc before configuring, as PyTorch's tools/gen_flatbuffers.sh does with the
vendored one; this step does the same, before configure, and refuses at once (no hour lost) when
no flatc of the headers' version is on PATH.

No library reads a C header's version macros or drives flatc; the three #defines are read with
a regular expression, bounded like every file read.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchbuild.core.errors import ToolMissing
from torchbuild.core.process import run_captured
from torchbuild.core.safeio import read_text

SCHEMA = Path("torch/csrc/jit/serialization/mobile_bytecode.fbs")
GENERATED = SCHEMA.with_name("mobile_bytecode_generated.h")
VENDORED = Path("third_party/flatbuffers/include/flatbuffers/base.h")
HEADER_LIMIT = 1 << 20  # base.h is about 20 kB; the generated header about 150 kB
_DEFINE = re.compile(r"#define\s+FLATBUFFERS_VERSION_(MAJOR|MINOR|REVISION)\s+(\d+)")
_ASSERT = re.compile(
    r"FLATBUFFERS_VERSION_MAJOR\s*==\s*(\d+)\s*&&\s*FLATBUFFERS_VERSION_MINOR\s*==\s*(\d+)\s*&&\s*"
    r"FLATBUFFERS_VERSION_REVISION\s*==\s*(\d+)"
)
_FLATC = re.compile(r"flatc version (\d+)\.(\d+)\.(\d+)")
Version = tuple[int, int, int]


def include_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where the build's compiler finds flatbuffers/base.h: CPATH, CMAKE_PREFIX_PATH's and
    CONDA_PREFIX's include directories, then /usr/local/include and /usr/include."""
    dirs = [Path(p) for p in env.get("CPATH", "").split(os.pathsep) if p]
    prefixes = [p for p in env.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes += [env["CONDA_PREFIX"]] if env.get("CONDA_PREFIX") else []
    dirs += [Path(p) / "include" for p in prefixes]
    return [*dirs, Path("/usr/local/include"), Path("/usr/include")]


def header_version(base_h: Path) -> Version | None:
    """The FLATBUFFERS_VERSION_{MAJOR,MINOR,REVISION} a flatbuffers/base.h defines."""
    found = dict(_DEFINE.findall(read_text(base_h, HEADER_LIMIT, "flatbuffers/base.h")))
    if set(found) != {"MAJOR", "MINOR", "REVISION"}:
        return None
    return int(found["MAJOR"]), int(found["MINOR"]), int(found["REVISION"])


def pinned_version(generated: Path) -> Version | None:
    """The version the generated header's static_assert pins (None: it pins none)."""
    m = _ASSERT.search(read_text(generated, HEADER_LIMIT, "the generated flatbuffers header"))
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def flatc_version(flatc: str, env: Mapping[str, str]) -> Version | None:
    done = run_captured([flatc, "--version"], env=env, timeout=60)
    m = _FLATC.search(done.stdout or "")
    return (int(m[1]), int(m[2]), int(m[3])) if done.returncode == 0 and m else None


def _v(v: Version) -> str:
    return ".".join(map(str, v))


def system_header(source: Path, env: Mapping[str, str], dirs: Sequence[Path] | None = None) -> Path | None:
    """The flatbuffers/base.h this build compiles against, None when the tree vendors its own
    (the checked-in header matches that one) or none is found (configure then says so)."""
    if (source / VENDORED).is_file():
        return None
    for d in dirs if dirs is not None else include_dirs(env):
        if (d / "flatbuffers" / "base.h").is_file():
            return d / "flatbuffers" / "base.h"
    return None


def regenerate(source: str, env: Mapping[str, str], dirs: Sequence[Path] | None = None) -> str | None:
    """Make the generated header again with flatc when its pinned version is not the one of the
    headers the build uses; a line saying what was done, or None when nothing was needed.
    ToolMissing when no flatc of the headers' version is on env's PATH."""
    tree = Path(source)
    if not (tree / SCHEMA).is_file() or not (tree / GENERATED).is_file():
        return None
    base_h = system_header(tree, env, dirs)
    pinned = pinned_version(tree / GENERATED)
    have = header_version(base_h) if base_h else None
    if pinned is None or have is None or pinned == have:
        return None
    flatc = shutil.which("flatc", path=env.get("PATH"))
    need = f"{GENERATED} pins flatbuffers {_v(pinned)}; the build's {base_h} is {_v(have)}"
    hint = f"add flatc {_v(have)} (Debian and Ubuntu: flatbuffers-compiler) to apt_packages, or build with the vendored flatbuffers"
    if flatc is None:
        raise ToolMissing(f"{need}, and no flatc is on PATH to generate it again", hint=hint)
    got = flatc_version(flatc, env)
    if got != have:
        raise ToolMissing(f"{need}, and {flatc} is {_v(got) if got else 'of unknown version'}", hint=hint)
    # the schema's fixed name, run where it lies (as debian/rules does): flatc reads arguments
    # after `--` as binary files, so no path from the user goes into this argv
    cmd = [flatc, "--cpp", "--gen-mutable", "--scoped-enums", SCHEMA.name]
    done = run_captured(cmd, env=env, cwd=str(tree / SCHEMA.parent), timeout=300)
    if done.returncode != 0 or pinned_version(tree / GENERATED) != have:
        detail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise ToolMissing(f"{flatc} did not generate {GENERATED} for {_v(have)}: {detail[0]}", hint=hint)
    return f"torchbuild: {GENERATED} generated again by flatc {_v(have)} (it pinned {_v(pinned)})"
