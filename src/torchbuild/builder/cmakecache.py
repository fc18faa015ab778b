"""CMake's probe results, reused by the next configure of a fresh build tree in the same image.

Most of a warm PyTorch configure is CMake probing the toolchain: check_cxx_compiler_flag,
check_c_source_compiles, check_function_exists, check_include_file, ... each one a
try_compile. CMake caches every result in CMakeCache.txt (INTERNAL entries) and skips a probe
whose entry is already defined: that is how a reconfigure of the same tree stays fast. A fresh
tree (`--clean`, a new checkout, CI) has none of them and runs every probe again.

After a configure finishes, the probe results are saved under the cache root
(<cache_root>/cmake-checks/<key>.json); the next configure of a fresh tree with the same key
starts from a CMakeCache.txt holding just those entries, and CMake adds everything else as it
would from nothing. The key is the toolchain image (its id), the tool versions and every
configure input (the environment torchbuild sets, which carries the compilers and the
profile's switches); the saved file also records the files CMake read (the tree's
CMakeLists.txt and .cmake files, CMake's modules, packages' config files: build.ninja lists
them) with their digests, and a configure that would read other contents is not seeded.
Natively nothing is reused: a host's libraries change (apt, module load) with nothing to key
them by, and `--clean` must stay the way out of a stale result.

Only probe results are kept, recognised by the help string CMake's Check* modules and
try_compile give their entries ("Test X", "Have include ...", "Have function ...", ...), with a
value that is a plain word: never a path, never an option or anything the profile decides, never
the result of a probe that runs its program (check_*_source_runs: it depends on the machine's
CPU, not on the image), and not the OpenMP specification date (FindOpenMP derives
OpenMP_<lang>_VERSION from it only when it probes, so a seeded date would change the result).

One entry more is seeded into a tree with a setup.py: CMAKE_BUILD_TYPE as the last configure
ended with it. PyTorch's setup.py reads it from an existing CMakeCache.txt when it starts
(tools/setup_helpers/env.py), before it runs CMake with -DCMAKE_BUILD_TYPE from the same
environment; the key holds that environment, so the value is the one it passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.safeio import sha256_file
from torchbuild.runtime.tree import SETUP_PY, kind_of

FORMAT = 1  # of the saved file; bumped whenever what is kept changes
DIRNAME = "cmake-checks"
CACHE_FILE = "CMakeCache.txt"
OWN_CACHE = "the tree has its own CMake cache"  # seed()'s reason: a configured tree (CMake reuses it)

# Help strings of the INTERNAL entries CMake's probes write (Modules/Check*.cmake,
# CheckSourceCompiles, try_compile, TestBigEndian, CheckTypeSize, the linker's push/pop probe).
# "Test <VAR>" (check_<lang>_source_compiles, check_<lang>_compiler_flag, FindThreads) must name
# the entry itself.
PROBE_DOCS = (
    "Have include ",
    "Have includes ",
    "Have function ",
    "Have symbol ",
    "Have library ",
    "Have variable ",
    "Have correct prototype for ",
    "Result of TRY_COMPILE",
    "Result of TEST_BIG_ENDIAN",
    "CHECK_TYPE_SIZE: ",
    "linker supports push/pop state",
)
RUN_DOC = "Result of try_run()"  # check_<lang>_source_runs: <VAR>_EXITCODE beside <VAR>
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.+-]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9_.+-]*\Z")  # 1, TRUE, 8, empty: no path, no list, no quoting
_TYPE = re.compile(r"(?:INTERNAL|STRING)\Z")
_ENTRY = re.compile(r"(?P<name>[^#/\s:][^:]*):(?P<type>[A-Z]+)=(?P<value>.*)\Z")
# the line CMake prints when a probe finishes ("-- Performing Test HAS_X - Success",
# "-- Looking for pthread.h - found"); a seeded probe prints nothing
PROBE_LINE = re.compile(r"-- (?:Performing Test|Looking for) \S.* - ")


# what setup.py reads from an existing CMakeCache.txt before it runs CMake
SETUP_READS = ("CMAKE_BUILD_TYPE",)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    value: str
    doc: str
    type: str = "INTERNAL"

    def cache_lines(self) -> str:
        return f"//{self.doc}\n{self.name}:{self.type}={self.value}\n"

    def valid(self) -> bool:
        return bool(_NAME.match(self.name) and _VALUE.match(self.value) and _TYPE.match(self.type)) and (
            "\n" not in self.doc
        )


def parse_cache(text: str) -> list[tuple[str, str, str, str]]:
    """CMakeCache.txt's entries as (name, type, value, help string)."""
    entries, doc = [], []
    for line in text.splitlines():
        if line.startswith("//"):
            doc.append(line[2:])
            continue
        m = _ENTRY.match(line)
        if m:
            entries.append((m["name"], m["type"], m["value"], " ".join(doc)))
        doc = []
    return entries


def probe_entries(text: str) -> list[Entry]:
    """The probe results in a CMakeCache.txt's text (see the module's docstring), by name."""
    entries = [(n, v, d) for n, t, v, d in parse_cache(text) if t == "INTERNAL"]
    runs = {n[: -len("_EXITCODE")] for n, _, d in entries if d == RUN_DOC and n.endswith("_EXITCODE")}
    kept = {}
    for name, value, doc in entries:
        if name in runs or (name.endswith("_COMPILED") and name[: -len("_COMPILED")] in runs):
            continue
        if not (doc == f"Test {name}" or doc.startswith(PROBE_DOCS)):
            continue
        if _NAME.match(name) and _VALUE.match(value):
            kept[name] = Entry(name, value, doc)
    return [kept[n] for n in sorted(kept)]


def setup_entries(text: str) -> list[Entry]:
    """The entries setup.py reads before CMake runs (SETUP_READS), as the configure left them."""
    found = [Entry(n, v, d, t) for n, t, v, d in parse_cache(text) if n in SETUP_READS and t == "STRING"]
    return [e for e in found if e.valid()]


def _ninja_paths(text: str) -> list[str]:
    """The paths of one build.ninja line (after its `|`), unescaping $ , $: and $$."""
    paths, cur, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "$" and i + 1 < len(text):
            cur.append(text[i + 1])
            i += 2
            continue
        if c == " ":
            if cur:
                paths.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        paths.append("".join(cur))
    return paths


def cmake_read(build: Path) -> list[str]:
    """The files the last configure read, as build.ninja's rule to re-run CMake lists them; []
    without a build.ninja (another generator: nothing is saved)."""
    try:
        with open(build / "build.ninja", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("build build.ninja") and "RERUN_CMAKE" in line:
                    _, _, deps = line.rstrip("\n").partition(" | ")
                    return _ninja_paths(deps)
    except OSError:
        pass
    return []


def source_scripts(build: Path, source: Path) -> dict[str, str]:
    """{path: sha256} of the files the last configure read (CMakeLists.txt, .cmake modules,
    templates, files read with file(READ)): relative to the source tree for its own, absolute for
    the rest (CMake's modules, packages' config files, a prefix mounted beside the image). The
    build tree's own files are left out: the configure writes them."""
    root, out = source.resolve(), build.resolve()
    found = {}
    for p in cmake_read(build):
        path = Path(p)
        if not path.is_absolute():
            continue  # the build tree's own files (CMakeCache.txt, generated lists)
        real = path.resolve()
        if real == out or out in real.parents:
            continue
        name = real.relative_to(root).as_posix() if root in real.parents else str(path)
        try:
            found[name] = sha256_file(path)
        except OSError:
            continue
    return dict(sorted(found.items()))


def key_of(image_id: str, toolchain: Mapping[str, str], inputs: Mapping[str, str]) -> str:
    """The saved file's name: every input a probe's result can depend on that differs between
    configures of one image (the compilers and the environment CMake runs with)."""
    blob = json.dumps(
        {"format": FORMAT, "image": image_id, "toolchain": dict(toolchain), "inputs": dict(inputs)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclasses.dataclass(frozen=True)
class Saved:
    entries: tuple[Entry, ...]  # probe results
    setup: tuple[Entry, ...]  # SETUP_READS
    scripts: Mapping[str, str]

    def cache_text(self, origin: Path, setup_py: bool) -> str:
        """The CMakeCache.txt a fresh tree starts from (setup_py: with what setup.py reads)."""
        entries = (self.setup if setup_py else ()) + self.entries
        return (
            "# This is the CMakeCache file.\n"
            f"# torchbuild seeded it with {len(self.entries)} probe results of an earlier configure\n"
            f"# in this image with the same compilers and configure inputs ({origin}).\n"
            "# CMake adds everything else.\n\n" + "\n".join(e.cache_lines() for e in entries)
        )


@dataclasses.dataclass(frozen=True)
class CheckCache:
    """The probe results saved for one key, as <root>/<key>.json."""

    root: Path
    key: str
    image_id: str

    @property
    def path(self) -> Path:
        return self.root / f"{self.key}.json"

    def load(self) -> Saved | None:
        """The saved results; None when there are none, or the file is not one this version
        wrote (then it is removed: the next configure that finishes saves a good one), or cannot
        be read."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except OSError:
            return None  # none, or unreadable: left as it is
        except ValueError:
            self.drop()
            return None
        try:
            if data["format"] != FORMAT or data["key"] != self.key:
                raise ValueError
            entries = tuple(Entry(str(e["name"]), str(e["value"]), str(e["doc"])) for e in data["entries"])
            setup = tuple(Entry(str(e["name"]), str(e["value"]), str(e["doc"]), str(e["type"])) for e in data["setup"])
            scripts = {str(k): str(v) for k, v in data["scripts"].items()}
            if not all(e.valid() for e in entries + setup) or any(e.name not in SETUP_READS for e in setup):
                raise ValueError
        except (KeyError, TypeError, ValueError, AttributeError):
            self.drop()
            return None
        return Saved(entries, setup, scripts)

    def seed(self, build: Path, source: Path) -> tuple[int, str]:
        """Write build/CMakeCache.txt with the saved results when the tree has no CMake cache:
        (entries written, why none were)."""
        if (build / CACHE_FILE).exists():
            return 0, OWN_CACHE
        if (build / "build.ninja").exists():
            # setup.py would take a cache beside build.ninja for a finished configure and skip
            # CMake; ninja would then regenerate from the seed alone, without setup.py's options
            return 0, "the tree has a build.ninja without a CMake cache"
        saved = self.load()
        if saved is None or not saved.entries:
            return 0, "none saved for this image and these configure inputs yet"
        changed = sorted(name for name, digest in saved.scripts.items() if not _same(source / name, digest))
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            return (
                0,
                f"files the configure read differ from those they were saved with ({', '.join(changed[:3])}{more})",
            )
        setup_py = kind_of(source) == SETUP_PY  # a scikit-build-core tree's backend reads no cache first
        if setup_py and {e.name for e in saved.setup} != set(SETUP_READS):
            return 0, f"setup.py reads {', '.join(SETUP_READS)} from the cache, and the configure left none"
        build.mkdir(parents=True, exist_ok=True)
        atomic_write_text(build / CACHE_FILE, saved.cache_text(self.path, setup_py))
        return len(saved.entries), ""

    def save(self, build: Path, source: Path, toolchain: Mapping[str, str]) -> tuple[int, bool]:
        """Save the probe results of the tree's finished configure, atomically: (how many,
        whether the file was written: not when it holds them already, or there are none)."""
        try:
            text = (build / CACHE_FILE).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return 0, False
        entries, setup = probe_entries(text), setup_entries(text)
        scripts = source_scripts(build, source)
        if not entries or not scripts:
            return 0, False
        old = self.load()
        if old is not None and (list(old.entries), list(old.setup), dict(old.scripts)) == (entries, setup, scripts):
            return len(entries), False
        data: dict[str, Any] = {
            "format": FORMAT,
            "key": self.key,
            "image": self.image_id,
            "toolchain": dict(toolchain),
            "scripts": scripts,
            "entries": [{"name": e.name, "value": e.value, "doc": e.doc} for e in entries],
            "setup": [dataclasses.asdict(e) for e in setup],
        }
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(data, indent=1) + "\n")
        return len(entries), True

    def drop(self) -> None:
        self.path.unlink(missing_ok=True)


def _same(path: Path, digest: str) -> bool:
    try:
        return sha256_file(path) == digest
    except OSError:
        return False


def for_build(
    cache_root: str | Path, image: Mapping[str, Any] | None, toolchain: Mapping[str, str], inputs: Mapping[str, str]
) -> CheckCache | None:
    """The saved results for a build in `image` (the manifest's image record), or None where
    nothing is reused: natively, or an image without an id."""
    image_id = str((image or {}).get("id") or "")
    if not image_id:
        return None
    return CheckCache(Path(cache_root) / DIRNAME, key_of(image_id, toolchain, inputs), image_id)


class ProbeCounter:
    """A watch on the configure's output that counts the probes CMake ran, passing each line on."""

    def __init__(self, inner: Callable[[str], None] | None = None) -> None:
        self.inner, self.count = inner, 0

    def __call__(self, line: str) -> None:
        if self.inner is not None:
            self.inner(line)
        if PROBE_LINE.search(line):
            self.count += 1
