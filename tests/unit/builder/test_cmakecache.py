"""CMake probe results saved after a configure and seeded into the next fresh tree (cmakecache.py),
and build.with_checks, which does that around the step that configures."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchbuild.builder import cmakecache
from torchbuild.builder.cmakecache import (
    CheckCache,
    Entry,
    ProbeCounter,
    for_build,
    key_of,
    probe_entries,
    setup_entries,
)
from torchbuild.builder.step import (
    CONFIGURE_DONE,
    ConfigureWatch,
    build_dir,
    configure_finished,
    prepare_configure,
    with_checks,
)
from torchbuild.core.atomic import umask
from torchbuild.core.errors import BuildFailed

# Shapes of entries a real PyTorch 2.6 configure leaves (trimmed from its CMakeCache.txt)
CACHE = """# This is the CMakeCache file.
# For build in directory: /src/build
########################
# EXTERNAL cache entries
########################

//Choose the type of build, options are: None Debug Release RelWithDebInfo MinSizeRel ...
CMAKE_BUILD_TYPE:STRING=Release

//Use NCCL
USE_NCCL:BOOL=0

//Compiler flag(s) for OpenMP
OpenMP_C_FLAGS:STRING=-fopenmp

//Path to a library.
OpenMP_gomp_LIBRARY:FILEPATH=/usr/lib/gcc/x86_64-linux-gnu/14/libgomp.so

//C AVX support
C_AVX_FOUND:BOOL=TRUE

########################
# INTERNAL cache entries
########################

//ADVANCED property for variable: CMAKE_AR
CMAKE_AR-ADVANCED:INTERNAL=1
//This is the directory where this CMakeCache.txt was created
CMAKE_CACHEFILE_DIR:INTERNAL=/src/build
//Path to CMake executable.
CMAKE_COMMAND:INTERNAL=/usr/bin/cmake
//Test CMAKE_HAVE_LIBC_PTHREAD
CMAKE_HAVE_LIBC_PTHREAD:INTERNAL=1
//Test C_HAS_AVX_2
C_HAS_AVX_2:INTERNAL=1
//Test HAS_WERROR_MISSING_PROTOTYPES
HAS_WERROR_MISSING_PROTOTYPES:INTERNAL=
//Have function mmap
HAVE_MMAP:INTERNAL=1
//Have include sys/types.h
HAVE_SYS_TYPES_H:INTERNAL=1
//Have library rt
NEED_LIBRT:INTERNAL=1
//Have symbol backtrace
_Backtrace_SYM_FOUND:INTERNAL=1
//Result of TRY_COMPILE
OpenMP_COMPILE_RESULT_C_fopenmp:INTERNAL=TRUE
//C compiler's OpenMP specification date
OpenMP_C_SPEC_DATE:INTERNAL=201511
//linker supports push/pop state
_CMAKE_LINKER_PUSHPOP_STATE_SUPPORTED:INTERNAL=TRUE
//Details about finding OpenMP_C
FIND_PACKAGE_MESSAGE_DETAILS_OpenMP_C:INTERNAL=[-fopenmp][/usr/lib/gcc/x86_64-linux-gnu/14/libgomp.so][v4.5()]
//Test EXCEPTIONS_WORK
EXCEPTIONS_WORK:INTERNAL=1
//Result of try_run()
EXCEPTIONS_WORK_EXITCODE:INTERNAL=0
//Result of TRY_COMPILE
EXCEPTIONS_WORK_COMPILED:INTERNAL=TRUE
//Test SOMETHING_ELSE
NOT_ITS_NAME:INTERNAL=1
//Have include weird
HAVE_WEIRD:INTERNAL=/usr/include;/opt
//Python executable during the last CMake run
PYBIND11_PYTHON_EXECUTABLE_LAST:INTERNAL=/opt/venv/bin/python
"""

PROBES = [
    "CMAKE_HAVE_LIBC_PTHREAD",
    "C_HAS_AVX_2",
    "HAS_WERROR_MISSING_PROTOTYPES",
    "HAVE_MMAP",
    "HAVE_SYS_TYPES_H",
    "NEED_LIBRT",
    "OpenMP_COMPILE_RESULT_C_fopenmp",
    "_Backtrace_SYM_FOUND",
    "_CMAKE_LINKER_PUSHPOP_STATE_SUPPORTED",
]


def test_only_probe_results_are_kept():
    kept = probe_entries(CACHE)
    assert [e.name for e in kept] == PROBES
    by_name = {e.name: e for e in kept}
    assert by_name["HAS_WERROR_MISSING_PROTOTYPES"].value == ""  # a failed probe is a result too
    assert by_name["HAVE_MMAP"] == Entry("HAVE_MMAP", "1", "Have function mmap")


@pytest.mark.parametrize(
    "name",
    [
        "CMAKE_BUILD_TYPE",  # decided by the environment (seeded apart, for setup.py only)
        "USE_NCCL",  # an option
        "OpenMP_C_FLAGS",  # a find module's answer, user-settable
        "OpenMP_gomp_LIBRARY",  # a path
        "C_AVX_FOUND",  # derived from C_HAS_AVX_* by PyTorch's own code, which runs anyway
        "CMAKE_CACHEFILE_DIR",  # the tree's own facts
        "CMAKE_COMMAND",
        "CMAKE_AR-ADVANCED",
        "OpenMP_C_SPEC_DATE",  # FindOpenMP sets OpenMP_C_VERSION only when it probes the date
        "FIND_PACKAGE_MESSAGE_DETAILS_OpenMP_C",
        "EXCEPTIONS_WORK",  # check_cxx_source_runs: the machine's answer, not the image's
        "EXCEPTIONS_WORK_EXITCODE",
        "EXCEPTIONS_WORK_COMPILED",
        "NOT_ITS_NAME",  # "Test X" names another entry: not a probe's
        "HAVE_WEIRD",  # a list of paths is no probe result
        "PYBIND11_PYTHON_EXECUTABLE_LAST",
    ],
)
def test_never_kept(name):
    assert name not in {e.name for e in probe_entries(CACHE)}


def test_setup_reads_the_build_type():
    (entry,) = setup_entries(CACHE)
    assert (entry.name, entry.type, entry.value) == ("CMAKE_BUILD_TYPE", "STRING", "Release")


def test_key_changes_with_the_image_the_compilers_and_every_input():
    toolchain = {"cc": "gcc (Debian 14.2.0-19) 14.2.0", "cmake": "cmake version 3.31.6"}
    inputs = {"CC": "gcc", "CXX": "g++", "USE_CUDA": "0"}
    base = key_of("sha256:aaa", toolchain, inputs)
    assert base == key_of("sha256:aaa", dict(toolchain), dict(inputs))
    assert base != key_of("sha256:bbb", toolchain, inputs)
    assert base != key_of("sha256:aaa", {**toolchain, "cc": "gcc (Debian 13.3.0-1) 13.3.0"}, inputs)
    assert base != key_of("sha256:aaa", toolchain, {**inputs, "CC": "clang"})
    assert base != key_of("sha256:aaa", toolchain, {**inputs, "CFLAGS": "-O3"})


def test_nothing_is_reused_natively_or_without_an_image_id(tmp_path):
    assert for_build(tmp_path, None, {}, {}) is None
    assert for_build(tmp_path, {"tag": "x", "id": None}, {}, {}) is None
    checks = for_build(tmp_path, {"tag": "x", "id": "sha256:aaa"}, {}, {})
    assert checks is not None and checks.path.parent == tmp_path / "cmake-checks"


def configured_tree(tmp_path: Path, cache: str = CACHE, setup_py: bool = True) -> tuple[Path, Path]:
    """A source tree (a space in its path) with two CMake files, configured."""
    src = tmp_path / "my src"
    (src / "cmake").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(x)\n")
    (src / "cmake" / "Checks.cmake").write_text("check_function_exists(mmap HAVE_MMAP)\n")
    if setup_py:
        (src / "setup.py").write_text("")
    prefix = tmp_path / "prefix"  # a package's config file outside the tree (a mounted prefix)
    prefix.mkdir(exist_ok=True)
    (prefix / "pkgConfig.cmake").write_text("set(pkg_FOUND 1)\n")
    return src, write_configured(src, cache)


def write_configured(src: Path, cache: str = CACHE) -> Path:
    """The build tree as a finished configure leaves it: its cache and build.ninja, whose rule to
    re-run CMake lists the files CMake read."""
    b = src / "build"
    b.mkdir(exist_ok=True)
    (b / "CMakeCache.txt").write_text(cache)
    (b / "CMakeFiles" / "3.31.6").mkdir(parents=True, exist_ok=True)
    (b / "CMakeFiles" / "3.31.6" / "CMakeSystem.cmake").write_text("set(CMAKE_SYSTEM Linux)\n")
    esc = str(src).replace(" ", "$ ")
    (b / "build.ninja").write_text(
        "rule RERUN_CMAKE\n  command = cmake\n"
        f"build build.ninja: RERUN_CMAKE | {esc}/CMakeLists.txt {esc}/cmake/Checks.cmake "
        f"{src.parent}/prefix/pkgConfig.cmake CMakeCache.txt {esc}/build/CMakeFiles/3.31.6/CMakeSystem.cmake "
        "aten/src/ATen/generated_headers.cmake\n  pool = console\n"
    )
    return b


def clear(b: Path) -> None:
    """The build tree as --clean (or a stale configure's clearing) leaves it for the next one."""
    (b / "CMakeCache.txt").unlink()
    (b / "build.ninja").unlink()


def checks_in(tmp_path: Path) -> CheckCache:
    checks = for_build(tmp_path / "cache", {"id": "sha256:aaa"}, {"cc": "gcc 14"}, {"CC": "gcc"})
    assert checks is not None
    return checks


def test_saved_then_seeded_into_a_fresh_tree(tmp_path):
    src, b = configured_tree(tmp_path)
    checks = checks_in(tmp_path)
    assert checks.save(b, src, {"cc": "gcc 14"}) == (len(PROBES), True)
    assert checks.save(b, src, {"cc": "gcc 14"}) == (len(PROBES), False)  # unchanged: not rewritten
    data = json.loads(checks.path.read_text())
    # the tree's own CMake files by path relative to it, others by their own; not the build tree's
    assert sorted(data["scripts"]) == sorted(
        ["CMakeLists.txt", "cmake/Checks.cmake", str(tmp_path / "prefix" / "pkgConfig.cmake")]
    )
    assert not [p for p in checks.path.parent.iterdir() if p.name.startswith(".partial-")]
    assert stat.S_IMODE(checks.path.stat().st_mode) == 0o666 & ~umask()

    assert checks.seed(b, src) == (0, cmakecache.OWN_CACHE)  # a configured tree keeps its own
    (b / "CMakeCache.txt").unlink()
    # setup.py would skip CMake for a cache beside a build.ninja, and ninja regenerate from the seed
    assert checks.seed(b, src) == (0, "the tree has a build.ninja without a CMake cache")
    (b / "build.ninja").unlink()
    assert checks.seed(b, src) == (len(PROBES), "")
    seeded = cmakecache.parse_cache((b / "CMakeCache.txt").read_text())
    assert sorted(n for n, t, _, _ in seeded if t == "INTERNAL") == PROBES
    assert ("CMAKE_BUILD_TYPE", "STRING", "Release") in [(n, t, v) for n, t, v, _ in seeded]
    assert probe_entries((b / "CMakeCache.txt").read_text()) == probe_entries(CACHE)


def test_a_scikit_build_core_tree_gets_the_probes_only(tmp_path):
    """PyTorch main's backend reads nothing from the cache before CMake runs: no build type seeded."""
    src, b = configured_tree(tmp_path, setup_py=False)
    (src / "pyproject.toml").write_text('[build-system]\nbuild-backend = "scikit_build_core.build"\n')
    checks = checks_in(tmp_path)
    checks.save(b, src, {})
    clear(b)
    assert checks.seed(b, src) == (len(PROBES), "")
    assert "CMAKE_BUILD_TYPE" not in (b / "CMakeCache.txt").read_text()


def test_setup_py_tree_is_not_seeded_without_the_build_type(tmp_path):
    """PyTorch's setup.py reads CMAKE_BUILD_TYPE from any existing cache (KeyError without it)."""
    src, b = configured_tree(tmp_path, cache=CACHE.replace("CMAKE_BUILD_TYPE:STRING=Release\n", ""))
    checks = checks_in(tmp_path)
    checks.save(b, src, {})
    clear(b)
    seeded, why = checks.seed(b, src)
    assert seeded == 0 and "CMAKE_BUILD_TYPE" in why and not (b / "CMakeCache.txt").exists()


def test_a_changed_file_outside_the_tree_is_not_seeded(tmp_path):
    src, b = configured_tree(tmp_path)
    checks = checks_in(tmp_path)
    checks.save(b, src, {})
    clear(b)
    (tmp_path / "prefix" / "pkgConfig.cmake").write_text("set(pkg_FOUND 0)\n")
    seeded, why = checks.seed(b, src)
    assert seeded == 0 and "pkgConfig.cmake" in why


def test_nothing_is_saved_without_build_ninja(tmp_path):
    """Another generator (Unix Makefiles) lists the files CMake read elsewhere: nothing saved."""
    src, b = configured_tree(tmp_path)
    (b / "build.ninja").unlink()
    checks = checks_in(tmp_path)
    assert checks.save(b, src, {}) == (0, False) and not checks.path.exists()


def test_changed_cmake_files_are_not_seeded(tmp_path):
    src, b = configured_tree(tmp_path)
    checks = checks_in(tmp_path)
    checks.save(b, src, {})
    clear(b)
    (src / "cmake" / "Checks.cmake").write_text("check_function_exists(mmap HAVE_MMAP)\ncheck_include_file(a.h A)\n")
    seeded, why = checks.seed(b, src)
    assert seeded == 0 and "cmake/Checks.cmake" in why and not (b / "CMakeCache.txt").exists()
    (src / "cmake" / "Checks.cmake").unlink()
    assert checks.seed(b, src)[0] == 0


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"format": 999}),
        None,  # a valid file whose key is another's
        "ENTRY",  # an entry that would write cache syntax
    ],
)
def test_a_bad_saved_file_is_dropped_not_seeded(tmp_path, content):
    src, b = configured_tree(tmp_path)
    checks = checks_in(tmp_path)
    checks.save(b, src, {})
    data = json.loads(checks.path.read_text())
    if content is None:
        content = json.dumps({**data, "key": "0" * 24})
    elif content == "ENTRY":
        data["entries"][0]["value"] = "1\nCMAKE_CXX_FLAGS:STRING=-O0"
        content = json.dumps(data)
    checks.path.write_text(content)
    clear(b)
    assert checks.seed(b, src)[0] == 0
    assert not checks.path.exists() and not (b / "CMakeCache.txt").exists()


def test_ninja_paths_are_unescaped():
    assert cmakecache._ninja_paths("/a$ b/CMakeLists.txt C$:/x.cmake $$HOME/y") == [
        "/a b/CMakeLists.txt",
        "C:/x.cmake",
        "$HOME/y",
    ]


def test_probe_counter_counts_finished_probes_and_passes_lines_on():
    seen: list[str] = []
    counter = ProbeCounter(seen.append)
    lines = [
        "-- Performing Test HAS_WNO_UNUSED_PARAMETER",
        "-- Performing Test HAS_WNO_UNUSED_PARAMETER - Success",
        "   -- Looking for pthread.h - found",  # pip -v indents the build's output
        "-- Looking for cheev_",
        "-- Looking for cheev_ - not found",
        "-- Build files have been written to: /src/build",
    ]
    for line in lines:
        counter(line)
    assert counter.count == 3 and seen == lines


# ---------------------------------------------------------------- build.with_checks


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        self.lines.append(text)


def fake_run(tmp_path: Path, src: Path, image: dict | None = None) -> SimpleNamespace:
    req = SimpleNamespace(source=str(src), cache_root=str(tmp_path / "cache"), provenance={"image": image})
    return SimpleNamespace(req=req, tee=Lines(), versions={"cc": "gcc 14"})


class FakeConfigure:
    """Stands for setup.py --cmake-only: writes what a configure writes, prints its probes, and
    fails while the tree holds a seeded cache when told to."""

    def __init__(self, src: Path, fail_seeded: bool = False) -> None:
        self.src, self.fail_seeded, self.calls, self.found, self.state = src, fail_seeded, 0, [], []

    def __call__(self, watch) -> float:
        self.calls += 1
        b = self.src / "build"
        cache = b / "CMakeCache.txt"
        self.found.append(cache.read_text() if cache.exists() else None)
        self.state.append(sorted(p.name for p in b.iterdir()))
        if self.fail_seeded and cache.exists():
            raise BuildFailed("configure failed (exit 1)")
        if not cache.exists():
            for name in PROBES:
                watch(f"-- Performing Test {name}")
                watch(f"-- Performing Test {name} - Success")
        write_configured(self.src)
        watch(f"{CONFIGURE_DONE}{b}")
        return 1.0


def fresh(tree: Path, inputs: dict) -> None:
    """The tree as the next run finds it after its CMake state was cleared, once run_build has
    prepared the configure (the stamp pending)."""
    clear(build_dir(str(tree)))
    prepare_configure(str(tree), inputs, Lines())


@pytest.fixture
def tree(tmp_path):
    src, b = configured_tree(tmp_path)
    clear(b)
    return src


def test_with_checks_saves_then_seeds(tmp_path, tree):
    inputs = {"CC": "gcc"}
    run = fake_run(tmp_path, tree, {"id": "sha256:aaa"})
    step = FakeConfigure(tree)
    assert with_checks(run, ConfigureWatch(str(tree), inputs), step) == 1.0
    assert step.found == [None] and configure_finished(str(tree))
    assert any(
        f"none seeded (none saved for this image and these configure inputs yet), {len(PROBES)} probes ran" in line
        for line in run.tee.lines
    )
    assert any(f"saved {len(PROBES)} for the next fresh tree" in line for line in run.tee.lines)

    fresh(tree, inputs)
    run = fake_run(tmp_path, tree, {"id": "sha256:aaa"})
    step = FakeConfigure(tree)
    with_checks(run, ConfigureWatch(str(tree), inputs), step)
    assert step.calls == 1 and "HAVE_MMAP:INTERNAL=1" in step.found[0]
    assert f"torchbuild: CMake checks: {len(PROBES)} seeded, 0 probes ran" in run.tee.lines


def test_another_image_is_not_seeded(tmp_path, tree):
    inputs = {"CC": "gcc"}
    with_checks(fake_run(tmp_path, tree, {"id": "sha256:aaa"}), ConfigureWatch(str(tree), inputs), FakeConfigure(tree))
    fresh(tree, inputs)
    step = FakeConfigure(tree)
    with_checks(fake_run(tmp_path, tree, {"id": "sha256:bbb"}), ConfigureWatch(str(tree), inputs), step)
    assert step.found == [None]


def test_a_seeded_configure_that_fails_runs_once_more_from_a_clean_tree(tmp_path, tree):
    inputs = {"CC": "gcc"}
    with_checks(fake_run(tmp_path, tree, {"id": "sha256:aaa"}), ConfigureWatch(str(tree), inputs), FakeConfigure(tree))
    fresh(tree, inputs)  # CMakeFiles of the first configure is still there
    run = fake_run(tmp_path, tree, {"id": "sha256:aaa"})
    step = FakeConfigure(tree, fail_seeded=True)
    with_checks(run, ConfigureWatch(str(tree), inputs), step)
    # the second attempt found no CMake state at all, and saved the results again
    assert step.calls == 2 and step.found[0] is not None and step.found[1] is None
    assert step.state[1] == ["torchbuild-configure.json"]  # no CMakeFiles, no build.ninja, no cache
    assert any("configure failed with seeded CMake checks" in line for line in run.tee.lines)
    assert (
        f"torchbuild: CMake checks: none seeded (the seeded configure failed), {len(PROBES)} probes ran"
        in run.tee.lines
    )
    assert configure_finished(str(tree))
    assert len(list((tmp_path / "cache" / "cmake-checks").glob("*.json"))) == 1


def test_a_failure_without_a_seed_is_not_retried(tmp_path, tree):
    run = fake_run(tmp_path, tree, {"id": "sha256:aaa"})
    calls = []

    def fails(watch):
        calls.append(1)
        raise BuildFailed("configure failed (exit 1)")

    with pytest.raises(BuildFailed):
        with_checks(run, ConfigureWatch(str(tree), {}), fails)
    assert calls == [1] and not (tmp_path / "cache" / "cmake-checks").exists()


def test_natively_the_step_runs_alone(tmp_path, tree):
    run = fake_run(tmp_path, tree, None)
    step = FakeConfigure(tree)
    with_checks(run, ConfigureWatch(str(tree), {}), step)
    assert step.found == [None] and not (tmp_path / "cache").exists()
    assert any("not reused outside a toolchain image" in line for line in run.tee.lines)
