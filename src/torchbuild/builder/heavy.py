"""The heavy units' ninja pool: their compiles run at most `depth` at once, the rest use every job.

CMake can put a target's compiles in a pool (JOB_POOL_COMPILE) but not one source's; ninja
takes a pool per build statement. So after configure the generated build.ninja is rewritten
(atomically): a `pool torchbuild_heavy` block with the planned depth at the top, and
`pool = torchbuild_heavy` in each C/C++ compile statement whose source matches a heavy glob.
The rewrite is idempotent (an earlier one is taken out first) and is done again before each
compile attempt, with the depth bounded by that attempt's jobs (fewer after an out-of-memory
kill). A regeneration by CMake in the middle of a build writes a build.ninja without the pool;
the next attempt puts it back. A heavy compile's own `pool =` (CMake's JOB_POOL_COMPILE) would
override ours: it is kept as a comment. In a spread over nodes (CCACHE_PREFIX=distcc, launch/
spread.py) the heavy compiles stay on this node, whose memory the pool's depth is planned for:
their `LAUNCHER = ccache` becomes `env -u CCACHE_PREFIX ccache`. Where nothing matches the heavy
units (a glob that misses, a Make tree), the build gets the plan every job gets without a pool:
jobs from the heaviest unit's peak (HeavyPlan.fallback), said in one line.

Why a pool and not a compiler launcher holding a lock per heavy job: a launcher waiting for
its turn holds one of ninja's job slots idle, so with heavy units next to each other in ninja's
order most cores wait; a pool is ninja's own scheduling, which runs light compiles meanwhile.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from torchbuild.core.atomic import atomic_write_text
from torchbuild.runtime.jobs import HeavyPlan

POOL = "torchbuild_heavy"
_HEADER = f"# torchbuild: memory-heavy units' pool (builder/heavy.py)\npool {POOL}\n  depth = "
_HEADER_RE = re.compile(rf"# torchbuild: memory-heavy units' pool \(builder/heavy.py\)\npool {POOL}\n  depth = \d+\n\n")
_POOL_LINE = f"  pool = {POOL}\n"
# CMake's own pool binding in a heavy compile, kept as a comment (a later binding would win)
_KEPT_POOL = "  # torchbuild kept CMake's: pool = "
# a heavy compile's ccache launcher in a spread: no CCACHE_PREFIX (distcc), so it compiles here
_LOCAL_LAUNCHER = "  LAUNCHER = env -u CCACHE_PREFIX "
# `build OUT.o: C_COMPILER__target_config SOURCE ...` (CXX_COMPILER__, C_COMPILER__ rules)
_COMPILE = re.compile(r"^build (?:[^:$]|\$.)+: C(?:XX)?_COMPILER__\S* ((?:[^ $|\n]|\$.)+)")


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


def _restored(text: str) -> str:
    """text without an earlier rewrite: our header and pool lines out, CMake's pool lines and
    launchers back as CMake wrote them."""
    text = _HEADER_RE.sub("", text).replace(_POOL_LINE, "")
    return text.replace(_KEPT_POOL, "  pool = ").replace(_LOCAL_LAUNCHER, "  LAUNCHER = ")


def _statement_line(line: str, local: bool) -> str:
    """A line of a heavy compile's block: CMake's own pool (JOB_POOL_COMPILE) kept as a comment,
    as a later binding would override ours; with local, ccache's launcher without CCACHE_PREFIX."""
    if line.startswith("  pool = "):
        return _KEPT_POOL + line[len("  pool = ") :]
    if local and line.startswith("  LAUNCHER = "):
        return _LOCAL_LAUNCHER + line[len("  LAUNCHER = ") :]
    return line


def pooled_text(
    text: str, patterns: tuple[str, ...], depth: int, build_dir: Path, source_root: Path, *, local: bool = False
) -> tuple[str, int]:
    """build.ninja's text with the heavy compiles in the pool (depth 0: no pool), and how many.
    local: their compiles run here (a spread's CCACHE_PREFIX=distcc taken out of their launcher)."""
    text = _restored(text)
    if depth < 1 or not patterns:
        return text, 0
    out: list[str] = []
    pooled = 0
    in_heavy = False
    for line in text.splitlines(keepends=True):
        if in_heavy and line.startswith("  "):
            out.append(_statement_line(line, local))
            continue
        out.append(line)
        m = _COMPILE.match(line)
        in_heavy = bool(
            m
            and not line.rstrip("\n").endswith("$")
            and is_heavy(unit_of(m.group(1), build_dir, source_root), patterns)
        )
        if in_heavy:
            out.append(_POOL_LINE)
            pooled += 1
    if not pooled:
        return text, 0
    return f"{_HEADER}{depth}\n\n" + "".join(out), pooled


def apply_pool(build_dir: Path, source_root: Path, heavy: HeavyPlan | None, jobs: int) -> tuple[str, int]:
    """Put the heavy compiles of build_dir/build.ninja in a pool of min(depth, jobs); a line for
    the log ("" where there is no build.ninja or no heavy plan) and the jobs this attempt may run:
    jobs, or where no compile matched the heavy units (a glob that misses, a Make generator's
    tree), the plan every job gets from the heaviest unit's peak (heavy.fallback), as without a pool."""
    ninja = build_dir / "build.ninja"
    if heavy is None or not heavy.depth:
        return "", jobs
    fallback = max(1, min(jobs, heavy.fallback or jobs))
    if not ninja.is_file():
        return f"torchbuild: heavy pool: no {ninja}: {fallback} jobs, each planned at the heavy units' peak", fallback
    depth = max(1, min(heavy.depth, jobs))
    text = ninja.read_text()
    new, pooled = pooled_text(text, heavy.patterns, depth, build_dir, source_root.resolve(), local=heavy.local)
    if new != text:
        atomic_write_text(ninja, new, what="rewriting build.ninja for the heavy units' pool")
    if not pooled:
        return (
            f"torchbuild: heavy pool: no compile in {ninja} matches {', '.join(heavy.patterns)}: "
            f"{fallback} jobs, each planned at the heavy units' peak"
        ), fallback
    here = ""
    if heavy.local:  # an older CMake (3.25) names ccache in the rule; 3.31 binds LAUNCHER per compile
        here = ", on this node" if _LOCAL_LAUNCHER in new else ", maybe on other nodes (this CMake has no LAUNCHER)"
    return (
        f"torchbuild: heavy pool: {pooled} compiles at most {depth} at once{here}, the others up to {jobs} jobs",
        jobs,
    )


# --------------------------------------------------------------------------- scikit-build-core trees
# scikit-build-core configures again on every `pip wheel` and `pip install -e` (there is no
# configure-only command), and CMake then writes build.ninja anew: a rewrite of it would not
# last until ninja runs. So for such a tree the pool is CMake's own (JOB_POOLS, JOB_POOL_COMPILE),
# given by a file CMake includes at the top-level project() (CMAKE_PROJECT_TOP_LEVEL_INCLUDES,
# CMake 3.24): at the end of the top-level directory it puts every target whose compiled sources
# all match heavy_units in the pool, as upstream's fix for the lost flash-attention throttle does
# for its one target (pytorch/pytorch#190663, PR #192305: FLASH_ATTENTION_MAX_JOBS → a Ninja pool on
# the flash_attention OBJECT library). CMake binds pools per target, not per source: a target that
# mixes heavy and light units is left out (pooling it would hold its light units to the depth)
# and named in the record the hook writes, which apply_cmake_pool reads.

HOOK = "torchbuild-heavy.cmake"  # in the build directory, rewritten before each attempt
HOOK_DEFINE = "CMAKE_PROJECT_TOP_LEVEL_INCLUDES"
POOL_RECORD = "torchbuild-heavy-pool.txt"  # what the last configure pooled: "pooled|mixed TARGET"
_COMPILED = r"\.(c|cc|cpp|cxx|C|cu)$"


def glob_regex(pattern: str) -> str:
    """fnmatch's glob (* also crosses /) as a CMake regular expression of the whole path."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        close = pattern.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif close > 0:
            body = pattern[i + 1 : close]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = close
        elif c in ".+()|{}$[]":
            out.append(f"[{c}]" if c not in "[]" else "\\" + c)
        elif c in "^\\":
            out.append("\\" + c)
        else:
            out.append(c)
        i += 1
    return "^(" + "".join(out) + ")$"


def cmake_hook(patterns: tuple[str, ...], depth: int, local: bool) -> str:
    """The CMake file that makes the heavy units' pool of a scikit-build-core tree."""
    regex = "|".join(glob_regex(p) for p in patterns)
    return _HOOK.format(
        POOL=POOL, depth=depth, _COMPILED=_COMPILED, regex=regex, launch=_launchers(local), POOL_RECORD=POOL_RECORD
    )


def _launchers(local: bool) -> str:
    """With local (the pooled compiles run here), the hook's lines that take a spread's CCACHE_PREFIX out of a pooled
    target's compiler launchers; "" otherwise."""
    return (
        "\n".join(
            f"      if(CMAKE_{lang}_COMPILER_LAUNCHER)\n"
            f"        set_property(TARGET ${{t}} PROPERTY {lang}_COMPILER_LAUNCHER env -u CCACHE_PREFIX"
            f" ${{CMAKE_{lang}_COMPILER_LAUNCHER}})\n      endif()"
            for lang in ("C", "CXX", "CUDA")
        )
        if local
        else ""
    )


# cmake_hook's file (str.format: {{ }} are CMake's braces): every target under the source tree whose compiled
# sources all match the heavy patterns goes into the pool; pooled and mixed targets are recorded
_HOOK = """# torchbuild: memory-heavy units' pool (builder/heavy.py), for a scikit-build-core tree
set_property(GLOBAL APPEND PROPERTY JOB_POOLS {POOL}={depth})
function(_torchbuild_heavy_dir dir)
  get_property(targets DIRECTORY "${{dir}}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(srcs ${{t}} SOURCES)
    get_target_property(sdir ${{t}} SOURCE_DIR)
    set(heavy 0)
    set(light 0)
    foreach(s IN LISTS srcs)
      if(s MATCHES "^\\\\$<" OR NOT s MATCHES [=[{_COMPILED}]=])
        continue()
      endif()
      if(NOT IS_ABSOLUTE "${{s}}")
        set(s "${{sdir}}/${{s}}")
      endif()
      file(RELATIVE_PATH rel "${{CMAKE_SOURCE_DIR}}" "${{s}}")
      if(rel MATCHES "^[.][.]/")
        set(rel "${{s}}")
      endif()
      if(rel MATCHES [=[{regex}]=])
        math(EXPR heavy "${{heavy}} + 1")
      else()
        math(EXPR light "${{light}} + 1")
      endif()
    endforeach()
    if(heavy GREATER 0 AND light EQUAL 0)
      set_property(TARGET ${{t}} PROPERTY JOB_POOL_COMPILE {POOL})
{launch}
      file(APPEND "${{CMAKE_BINARY_DIR}}/{POOL_RECORD}" "pooled ${{t}} ${{heavy}}\\n")
    elseif(heavy GREATER 0)
      file(APPEND "${{CMAKE_BINARY_DIR}}/{POOL_RECORD}" "mixed ${{t}} ${{heavy}} ${{light}}\\n")
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${{dir}}" PROPERTY SUBDIRECTORIES)
  foreach(d IN LISTS subdirs)
    _torchbuild_heavy_dir("${{d}}")
  endforeach()
endfunction()
function(_torchbuild_heavy_pool)
  file(WRITE "${{CMAKE_BINARY_DIR}}/{POOL_RECORD}" "")
  _torchbuild_heavy_dir("${{CMAKE_SOURCE_DIR}}")
endfunction()
cmake_language(DEFER DIRECTORY "${{CMAKE_SOURCE_DIR}}" CALL _torchbuild_heavy_pool)
"""


def write_cmake_hook(build_dir: Path, heavy: HeavyPlan | None, jobs: int) -> dict[str, str]:
    """The hook for a pool of min(depth, jobs) in build_dir, and the define that includes it ({}
    without a heavy plan). The file is written only when it changes (CMake reconfigures on it)."""
    if heavy is None or not heavy.depth or not heavy.patterns:
        return {}
    hook = build_dir / HOOK
    text = cmake_hook(heavy.patterns, max(1, min(heavy.depth, jobs)), heavy.local)
    build_dir.mkdir(parents=True, exist_ok=True)
    if not hook.is_file() or hook.read_text() != text:
        atomic_write_text(hook, text, what="writing the heavy units' CMake pool")
    return {HOOK_DEFINE: str(hook)}


def pool_record(build_dir: Path) -> tuple[dict[str, int], list[str]] | None:
    """What the last configure pooled ({target: heavy units}) and the targets it left out as
    mixed; None where no configure with the hook ran."""
    try:
        lines = (build_dir / POOL_RECORD).read_text().splitlines()
    except OSError:
        return None
    pooled = {f[1]: int(f[2]) for f in (ln.split() for ln in lines) if f[:1] == ["pooled"] and len(f) == 3}
    mixed = [f[1] for f in (ln.split() for ln in lines) if f[:1] == ["mixed"] and len(f) > 1]
    return pooled, mixed


def apply_cmake_pool(build_dir: Path, heavy: HeavyPlan | None, jobs: int) -> tuple[str, int]:
    """apply_pool's counterpart for a scikit-build-core tree: the hook rewritten for this attempt's
    depth, a line for the log from what the last configure pooled, and the jobs the attempt runs
    (the heavy units' plan, as without a pool, where no target is pooled)."""
    if not write_cmake_hook(build_dir, heavy, jobs):
        return "", jobs
    assert heavy is not None
    fallback = max(1, min(jobs, heavy.fallback or jobs))
    record = pool_record(build_dir)
    if record is None:
        return (
            f"torchbuild: heavy pool: not configured yet: {fallback} jobs, each planned at the heavy units' peak",
            fallback,
        )
    pooled, mixed = record
    left = f"; left out, mixing heavy and light units: {', '.join(mixed)}" if mixed else ""
    if not pooled:
        return (
            f"torchbuild: heavy pool: no CMake target has only units matching {', '.join(heavy.patterns)}{left}: "
            f"{fallback} jobs, each planned at the heavy units' peak"
        ), fallback
    depth = max(1, min(heavy.depth, jobs))
    targets = ", ".join(f"{t} ({n})" for t, n in sorted(pooled.items()))
    return (
        f"torchbuild: heavy pool: CMake job pool {POOL} of depth {depth} for {targets}{left}, the others up to {jobs} jobs",
        jobs,
    )
