"""ATen's code generation reused by the next fresh tree (builder/codegen.py), with a fake torchgen
that writes what the real one declares: <prefix>generated_T.cmake lists and the files they name."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchbuild.builder import codegen
from torchbuild.runtime import skbuild

FAKE_GEN = """
import argparse, os, pathlib
ap = argparse.ArgumentParser()
ap.add_argument("--source-path"); ap.add_argument("--install_dir"); ap.add_argument("--generate")
ap.add_argument("--aoti-install-dir", default="torch/csrc/inductor/aoti_torch/generated")
ap.add_argument("--output-dependencies"); ap.add_argument("--dry-run", action="store_true")
ap.add_argument("--per-operator-headers", action="store_true")
a = ap.parse_args()
with open(os.environ["FAKE_GEN_LOG"], "a") as f:
    f.write(a.generate + (" dry" if a.dry_run else "") + "\\n")
src = pathlib.Path(a.source_path)
n = len((src / "native" / "native_functions.yaml").read_text().split())
out = pathlib.Path(a.install_dir)
names = [f"{a.generate}_{i}.h" for i in range(n)] + (["ops/x.h"] if a.per_operator_headers else [])
dep = pathlib.Path(a.output_dependencies)
dep.parent.mkdir(parents=True, exist_ok=True)
for prefix, group in (("", names[:1]), ("core_", names[1:])):
    listed = "".join(f'\\n    "{out / g}"' for g in group)
    (dep.parent / (prefix + dep.name)).write_text(f"set({prefix}generated_{a.generate}{listed})\\n")
if not a.dry_run:
    for g in names:
        (out / g).parent.mkdir(parents=True, exist_ok=True)
        (out / g).write_text(f"// {g} from {n} ops, template {(src / 'templates' / 'T.h').read_text()}")
aoti = pathlib.Path(a.aoti_install_dir)  # as torchgen 2.6: the C shims, in the source tree, unlisted
aoti.mkdir(parents=True, exist_ok=True)
if a.generate == "sources" and not a.dry_run:
    shim = aoti / "c_shim_cpu.cpp"
    text = f"// shim of {n} ops after {(aoti / 'c_shim_cpu.h').read_text()}"
    if not shim.exists() or shim.read_text() != text:  # torchgen writes a file only when it changed
        shim.write_text(text)
"""


AOTI = "torch/csrc/inductor/aoti_torch/generated"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "src"
    (src / "torchgen").mkdir(parents=True)
    (src / "torchgen" / "__init__.py").write_text("")
    (src / "torchgen" / "gen.py").write_text(FAKE_GEN)
    aten = src / "aten" / "src" / "ATen"
    (aten / "native").mkdir(parents=True)
    (aten / "templates").mkdir()
    (aten / "native" / "native_functions.yaml").write_text("add sub mul\n")
    (aten / "native" / "tags.yaml").write_text("core\n")
    (aten / "templates" / "T.h").write_text("v1")
    (src / AOTI).mkdir(parents=True)
    (src / AOTI / "c_shim_cpu.h").write_text("checked in")
    monkeypatch.setenv("FAKE_GEN_LOG", str(tmp_path / "gen.log"))
    return src


def gen_args(src: Path, kind: str = "headers", *extra: str) -> list[str]:
    install = src / "build" / "aten" / "src" / "ATen"
    return [
        "-m",
        "torchgen.gen",
        "--source-path",
        str(src / "aten" / "src" / "ATen"),
        "--install_dir",
        str(install),
        "--generate",
        kind,
        "--output-dependencies",
        str(install / f"generated_{kind}.cmake"),
        *extra,
    ]


def runs(src: Path) -> list[str]:
    log = src.parent / "gen.log"
    return log.read_text().splitlines() if log.exists() else []


def outputs(src: Path) -> dict[str, str]:
    b = src / "build"
    return {p.relative_to(b).as_posix(): p.read_text() for p in sorted(b.rglob("*")) if p.is_file()}


def fresh(src: Path) -> None:
    shutil.rmtree(src / "build")


def test_a_fresh_tree_gets_the_same_outputs_without_running_the_generator(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "codegen"
    for extra in (["--dry-run"], []):
        assert codegen.run(cache, sys.executable, gen_args(tree, "headers", *extra), tree) == 0
    first = outputs(tree)
    assert runs(tree) == ["headers dry", "headers"]
    assert "aten/src/ATen/headers_2.h" in first and "aten/src/ATen/core_generated_headers.cmake" in first

    fresh(tree)
    for extra in (["--dry-run"], []):
        assert codegen.run(cache, sys.executable, gen_args(tree, "headers", *extra), tree) == 0
    assert runs(tree) == ["headers dry", "headers"]  # nothing ran again
    assert outputs(tree) == first


def test_the_dry_run_restores_only_the_lists(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree, "sources", "--dry-run"), tree)
    fresh(tree)
    codegen.run(cache, sys.executable, gen_args(tree, "sources", "--dry-run"), tree)
    assert sorted(outputs(tree)) == [
        "aten/src/ATen/core_generated_sources.cmake",
        "aten/src/ATen/generated_sources.cmake",
    ]
    assert runs(tree) == ["sources dry"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda s: (s / "aten/src/ATen/native/native_functions.yaml").write_text("add sub mul div\n"),
            id="native_functions",
        ),
        pytest.param(lambda s: (s / "aten/src/ATen/native/tags.yaml").write_text("core pointwise\n"), id="tags"),
        pytest.param(lambda s: (s / "aten/src/ATen/templates/T.h").write_text("v2"), id="template"),
        pytest.param(lambda s: (s / "torchgen/model.py").write_text("# new\n"), id="torchgen source"),
    ],
)
def test_a_changed_input_regenerates(tree: Path, tmp_path: Path, change) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    before = outputs(tree)
    fresh(tree)
    change(tree)
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    assert runs(tree) == ["headers", "headers"]
    if "div" in (tree / "aten/src/ATen/native/native_functions.yaml").read_text():
        assert outputs(tree) != before  # the new op's header is there
    fresh(tree)
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    assert runs(tree) == ["headers", "headers"]  # the changed inputs' outputs are saved in turn


def test_a_switch_is_part_of_the_key(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    fresh(tree)
    codegen.run(cache, sys.executable, gen_args(tree, "headers", "--per-operator-headers"), tree)
    assert runs(tree) == ["headers", "headers"]
    assert "aten/src/ATen/ops/x.h" in outputs(tree)


def test_unchanged_outputs_keep_their_times(tree: Path, tmp_path: Path) -> None:
    """As torchgen does: an output whose content is the same is not rewritten (no recompiles)."""
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    header = tree / "build/aten/src/ATen/headers_0.h"
    os.utime(header, (1, 1))
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    assert header.stat().st_mtime == 1
    assert runs(tree) == ["headers"]


def test_a_failed_run_saves_nothing(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (tree / "aten/src/ATen/templates/T.h").unlink()
    assert codegen.run(cache, sys.executable, gen_args(tree), tree) != 0
    assert not cache.exists() or not list(cache.iterdir())  # no entry, not even half of one


def test_a_half_entry_is_not_restored(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    (entry,) = cache.iterdir()
    (entry / "files" / "0").unlink()
    fresh(tree)
    assert codegen.run(cache, sys.executable, gen_args(tree), tree) == 0
    assert runs(tree) == ["headers", "headers"]


def test_other_commands_pass_through(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = codegen.run(cache, sys.executable, ["-c", "import sys; sys.exit(3)"], tmp_path)
    assert code == 3 and not cache.exists()


def test_the_wrapper_is_the_interpreter_cmake_runs(tree: Path, tmp_path: Path) -> None:
    """The script CMake gets as its Python: torchgen through the cache, anything else as it is."""
    cache = tmp_path / "cache" / "codegen"
    wrapper = tmp_path / "python"
    wrapper.write_text(codegen.wrapper_script(cache, sys.executable))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    other = subprocess.run([str(wrapper), "-c", "print('hi')"], capture_output=True, text=True, env=env, check=False)
    assert other.stdout == "hi\n"
    for _ in range(2):
        fresh(tree) if (tree / "build").exists() else None
        proc = subprocess.run(
            [str(wrapper), *gen_args(tree)], cwd=tree, capture_output=True, text=True, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr
    assert "code generation reused" in proc.stdout
    assert runs(tree) == ["headers"]


CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(fake C)
find_package(Python COMPONENTS Interpreter REQUIRED)
set(GEN ${Python_EXECUTABLE} -m torchgen.gen --source-path ${CMAKE_SOURCE_DIR}/aten/src/ATen
    --install_dir ${CMAKE_BINARY_DIR}/aten/src/ATen --generate headers
    --output-dependencies ${CMAKE_BINARY_DIR}/aten/src/ATen/generated_headers.cmake)
execute_process(COMMAND ${GEN} --dry-run WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dry run failed")
endif()
include(${CMAKE_BINARY_DIR}/aten/src/ATen/generated_headers.cmake)
include(${CMAKE_BINARY_DIR}/aten/src/ATen/core_generated_headers.cmake)
add_custom_command(OUTPUT ${generated_headers} ${core_generated_headers} COMMAND ${GEN}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} DEPENDS ${CMAKE_SOURCE_DIR}/aten/src/ATen/native/native_functions.yaml)
add_custom_target(gen ALL DEPENDS ${generated_headers} ${core_generated_headers})
"""


@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("ninja")), reason="needs cmake and ninja")
@pytest.mark.parametrize("kind", ["setup.py", "scikit-build-core"])
def test_a_cmake_configure_and_build_run_the_generator_once(tree: Path, tmp_path: Path, kind: str) -> None:
    """As Codegen.cmake runs torchgen (a dry run in the configure, the real run in ninja), with
    the hook's CMAKE_PROJECT_INCLUDE: a second fresh tree runs neither. A scikit-build-core tree
    (PyTorch main) forwards CMAKE_* variables only after project(): the build's configure passes
    the hook as a define (runtime/skbuild.py), as the backend's cmake.define does."""
    (tree / "cmake").mkdir()
    (tree / "cmake" / "Codegen.cmake").write_text("")
    if kind == "setup.py":
        (tree / "setup.py").write_text("")
    else:
        (tree / "pyproject.toml").write_text('[build-system]\nbuild-backend = "scikit_build_core.build"\n')
    (tree / "CMakeLists.txt").write_text(CMAKELISTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    hook = codegen.hook(tmp_path / "cache", sys.executable, tree)
    if kind == "setup.py":  # as setup.py passes CMAKE_* variables on
        configure = ["cmake", "-S", ".", "-B", "build", "-G", "Ninja", *(f"-D{k}={v}" for k, v in hook.items())]
    else:
        configure = skbuild.configure_cmd(str(tree), env, skbuild.project_defines(hook, {}), sys.executable)
    for _ in range(2):
        shutil.rmtree(tree / "build", ignore_errors=True)
        for cmd in (configure, ["ninja", "-C", "build"]):
            proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tree / "build/aten/src/ATen/headers_2.h").read_text().startswith("// headers_2.h from 3 ops")
    assert runs(tree) == ["headers dry", "headers"]
    assert "code generation reused" in proc.stdout  # ninja's output: the real run restored


def test_no_hook_for_a_tree_without_codegen(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("")
    assert codegen.hook(tmp_path / "cache", sys.executable, tmp_path) == {}


def shim(src: Path) -> Path:
    return src / AOTI / "c_shim_cpu.cpp"


@pytest.mark.parametrize("earlier", [False, True], ids=["new tree", "shim left by an earlier build"])
def test_the_c_shim_written_into_the_source_tree_comes_back(tree: Path, tmp_path: Path, earlier: bool) -> None:
    """torchgen's sources run writes c_shim_cpu.cpp into the source tree, unlisted: a fresh
    checkout restoring the run gets it too, also when the saving tree held it already (torchgen
    then left it untouched)."""
    cache = tmp_path / "cache"
    if earlier:
        assert subprocess.run([sys.executable, *gen_args(tree, "sources")], cwd=tree, check=False).returncode == 0
        fresh(tree)
    for extra in (["--dry-run"], []):
        codegen.run(cache, sys.executable, gen_args(tree, "sources", *extra), tree)
    made = shim(tree).read_text()
    assert made == "// shim of 3 ops after checked in"

    fresh(tree)
    shim(tree).unlink()  # a fresh checkout: the release tarball has no c_shim_*.cpp
    for extra in (["--dry-run"], []):
        assert codegen.run(cache, sys.executable, gen_args(tree, "sources", *extra), tree) == 0
    assert runs(tree)[-2:] == ["sources dry", "sources"]  # the generator did not run again
    assert shim(tree).read_text() == made


def test_a_changed_checked_in_shim_header_regenerates(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree, "sources"), tree)
    (tree / AOTI / "c_shim_cpu.h").write_text("changed upstream")
    fresh(tree)
    codegen.run(cache, sys.executable, gen_args(tree, "sources"), tree)
    assert runs(tree) == ["sources", "sources"]
    assert shim(tree).read_text().endswith("changed upstream")


@pytest.mark.parametrize("fault", ["cache is a file", "disk full"])
def test_a_cache_that_cannot_be_written_does_not_fail_the_run(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    cache = tmp_path / "cache"
    if fault == "cache is a file":
        cache.write_text("")
        cache = cache / "codegen"
    else:

        def full(*args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(codegen.shutil, "copyfile", full)
    assert codegen.run(cache, sys.executable, gen_args(tree), tree) == 0
    assert (tree / "build/aten/src/ATen/headers_2.h").is_file()  # the generator's outputs stand
    lines = [line for line in capsys.readouterr().out.splitlines() if "torchbuild" in line]
    assert len(lines) == 1 and "not saved" in lines[0] and "could not be written" in lines[0], lines


def planted(cache: Path, path: Path) -> None:
    """The one entry under cache, its first output redirected to path."""
    (entry,) = (p for p in cache.iterdir() if p.name != "bin")
    doc = json.loads((entry / "outputs.json").read_text())
    doc["outputs"][0] = str(path)
    (entry / "outputs.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["absolute path elsewhere", "dotdot", "symlink in the build tree"])
def test_an_entry_naming_a_path_outside_the_run_is_not_restored(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    victim_dir = tmp_path / "elsewhere"
    victim_dir.mkdir()
    install = tree / "build/aten/src/ATen"
    target = {
        "absolute path elsewhere": victim_dir / "victim",
        "dotdot": install / ".." / ".." / ".." / ".." / ".." / "elsewhere" / "victim",
        "symlink in the build tree": install / "escape" / "victim",
    }[how]
    planted(cache, target)
    fresh(tree)
    if how == "symlink in the build tree":
        install.mkdir(parents=True)
        (install / "escape").symlink_to(victim_dir)
    capsys.readouterr()
    assert codegen.run(cache, sys.executable, gen_args(tree), tree) == 0
    assert not (victim_dir / "victim").exists()
    assert runs(tree) == ["headers", "headers"]  # the generator ran instead
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "not reused" in line]
    assert "outside" in line and "victim" in line


def test_the_cache_keeps_the_most_recently_used_entries(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(codegen, "KEEP", 2)
    cache = tmp_path / "cache"
    template = tree / "aten/src/ATen/templates/T.h"
    for version in ("v1", "v2", "v1", "v3"):  # v1's entry is used again, so v2's is the oldest
        template.write_text(version)
        fresh(tree) if (tree / "build").exists() else None
        codegen.run(cache, sys.executable, gen_args(tree), tree)
        time.sleep(0.02)
    assert runs(tree) == ["headers"] * 3
    assert len([p for p in cache.iterdir()]) == 2
    for version, reused in (("v1", True), ("v3", True), ("v2", False)):
        template.write_text(version)
        fresh(tree)
        before = len(runs(tree))
        codegen.run(cache, sys.executable, gen_args(tree), tree)
        assert (len(runs(tree)) == before) is reused, version


def test_a_killed_save_is_removed_once_stale(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    half, recent = cache / ".abc.x1", cache / ".def.x2"
    half.mkdir()
    recent.mkdir()
    os.utime(half, (1, 1))
    assert codegen.prune(cache) == []
    assert not half.exists() and recent.exists() and (cache / "bin").exists()


def test_a_damaged_entry_naming_an_unresolvable_path_runs_the_generator(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    planted(cache, tree / "build" / "bad\x00name")  # a NUL byte: Path.resolve raises ValueError
    fresh(tree)
    capsys.readouterr()
    assert codegen.run(cache, sys.executable, gen_args(tree), tree) == 0
    assert runs(tree) == ["headers", "headers"]
    assert any("not reused" in line for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("spelling", ["-s", "--source-path=", "default"])
def test_the_source_path_in_any_spelling_is_in_the_key(tree: Path, spelling: str) -> None:
    """torchgen.gen reads native_functions.yaml under -s/--source-path (aten/src/ATen by
    default, from the working directory): a change there is another key however it is named."""
    args = gen_args(tree)
    i = args.index("--source-path")
    if spelling == "default":
        del args[i : i + 2]  # the tree (the working directory) has aten/src/ATen
    else:
        args[i : i + 2] = ["-s", args[i + 1]] if spelling == "-s" else [f"--source-path={args[i + 1]}"]
    before = codegen.key_of(sys.executable, args, tree)
    (tree / "aten/src/ATen/native/native_functions.yaml").write_text("add sub mul div\n")
    assert codegen.key_of(sys.executable, args, tree) != before


def test_only_a_real_sources_run_counts_the_aoti_dir(tree: Path) -> None:
    """ninja runs the headers and sources generators at once: a headers run must not save the
    C shim the sources run is writing beside it."""
    aoti = tree / AOTI
    before = codegen.snapshot(aoti)
    (aoti / "c_shim_cpu.cpp").write_text("being written by the sources run")
    assert codegen.unlisted_outputs(gen_args(tree, "headers"), tree, before) == []
    assert codegen.unlisted_outputs(gen_args(tree, "sources", "--dry-run"), tree, before) == []
    assert codegen.unlisted_outputs(gen_args(tree, "sources"), tree, before) == [aoti / "c_shim_cpu.cpp"]


def test_a_restore_into_a_fresh_tree_leaves_plain_files_and_no_temporary_ones(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    codegen.run(cache, sys.executable, gen_args(tree), tree)
    first = outputs(tree)
    fresh(tree)
    old = os.umask(0o027)
    try:
        assert codegen.run(cache, sys.executable, gen_args(tree), tree) == 0
    finally:
        os.umask(old)
    assert outputs(tree) == first  # every file whole, no `.name.*` temporary left beside them
    modes = {p.stat().st_mode & 0o777 for p in (tree / "build").rglob("*") if p.is_file()}
    assert modes == {0o640}
