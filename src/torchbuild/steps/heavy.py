"""The heavy units' ninja pool: their compiles run at most `depth` at once, the rest use every job.

CMake can put a target's compiles in a pool (JOB_POOL_COMPILE) but not one source's; ninja
takes a pool per build statement. So after configure the generated build.ninja is rewritten
(atomically): a `pool torchbuild_heavy` block with the planned depth at the top, and
`pool = torchbuild_heavy` in each C/C++ compile statement whose source matches a heavy glob.
The rewrite is idempotent (an earlier one is taken out first) and is done again before each
compile attempt, with the depth bounded by that attempt's jobs (fewer after an out-of-memory
kill). A regeneration by CMake in the middle of a build writes a build.ninja without the pool;
the next attempt puts it back.

Why a pool and not a compiler launcher holding a lock per heavy job: a launcher waiting for
its turn holds one of ninja's job slots idle, so with heavy units next to each other in ninja's
order most cores wait; a pool is ninja's own scheduling, which runs light compiles meanwhile.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from torchbuild.core.atomic import atomic_write_text
from torchbuild.inputs.jobs import HeavyPlan

POOL = "torchbuild_heavy"
_HEADER = f"# torchbuild: memory-heavy units' pool (steps/heavy.py)\npool {POOL}\n  depth = "
_HEADER_RE = re.compile(rf"# torchbuild: memory-heavy units' pool \(steps/heavy.py\)\npool {POOL}\n  depth = \d+\n\n")
_POOL_LINE = f"  pool = {POOL}\n"
# `build OUT.o: C_COMPILER__target_config SOURCE ...` (CXX_COMPILER__, C_COMPILER__ rules)
_COMPILE = re.compile(r"^build (?:[^:$]|\$.)+: C(?:XX)?_COMPILER__\S* ((?:[^ $|]|\$.)+)")


def _unescape(path: str) -> str:
    return re.sub(r"\$(.)", r"\1", path)


def unit_of(ninja_path: str, build_dir: Path, source_root: Path) -> str:
    """A compile's source as heavy_units globs name it: relative to the tree where it is in it."""
    path = Path(_unescape(ninja_path))
    if not path.is_absolute():
        path = build_dir / path
    try:
        return path.relative_to(source_root).as_posix()
    except ValueError:
        return path.as_posix()


def is_heavy(unit: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(unit, p) for p in patterns)


def pooled_text(
    text: str, patterns: tuple[str, ...], depth: int, build_dir: Path, source_root: Path
) -> tuple[str, int]:
    """build.ninja's text with the heavy compiles in the pool (depth 0: no pool), and how many."""
    text = _HEADER_RE.sub("", text).replace(_POOL_LINE, "")
    if depth < 1 or not patterns:
        return text, 0
    out: list[str] = []
    pooled = 0
    for line in text.splitlines(keepends=True):
        out.append(line)
        m = _COMPILE.match(line)
        if (
            m
            and not line.rstrip("\n").endswith("$")
            and is_heavy(unit_of(m.group(1), build_dir, source_root), patterns)
        ):
            out.append(_POOL_LINE)
            pooled += 1
    if not pooled:
        return text, 0
    return f"{_HEADER}{depth}\n\n" + "".join(out), pooled


def apply_pool(build_dir: Path, source_root: Path, heavy: HeavyPlan | None, jobs: int) -> str:
    """Put the heavy compiles of build_dir/build.ninja in a pool of min(depth, jobs); a line for
    the log ("" where there is no build.ninja or no heavy plan)."""
    ninja = build_dir / "build.ninja"
    if heavy is None or not heavy.depth or not ninja.is_file():
        return ""
    depth = max(1, min(heavy.depth, jobs))
    text = ninja.read_text()
    new, pooled = pooled_text(text, heavy.patterns, depth, build_dir, source_root.resolve())
    if new != text:
        atomic_write_text(ninja, new, what="rewriting build.ninja for the heavy units' pool")
    if not pooled:
        return f"torchbuild: heavy pool: no compile in {ninja} matches {', '.join(heavy.patterns)}"
    return f"torchbuild: heavy pool: {pooled} compiles at most {depth} at once, the others up to {jobs} jobs"
