"""A tree's kind (runtime/tree.py) and how a scikit-build-core tree is configured and built
(runtime/skbuild.py): the one place that decides, and what the build runs from it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import TREE_KINDS, fixture_tree, run_invoke, set_args

from torchbuild.core.errors import SourceError
from torchbuild.runtime import skbuild
from torchbuild.runtime.tree import SETUP_PY, SKBUILD, kind_of, skbuild_settings

SKBUILD_TOML = '[build-system]\nrequires = ["scikit-build-core>=1.0"]\nbuild-backend = "scikit_build_core.build"\n'


@pytest.mark.parametrize("kind", TREE_KINDS)
def test_the_fixture_s_two_shapes_are_told_apart(tmp_path, kind):
    assert kind_of(fixture_tree(tmp_path / "t", kind)) == kind


def test_a_pyproject_naming_scikit_build_core_decides_over_a_leftover_setup_py(tmp_path):
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(SKBUILD_TOML)
    assert kind_of(tmp_path) == SKBUILD  # it is what pip runs
    (tmp_path / "pyproject.toml").write_text('[build-system]\nbuild-backend = "setuptools.build_meta"\n')
    assert kind_of(tmp_path) == SETUP_PY


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('[build-system]\nbuild-backend = "hatchling.build"\n', "build-backend 'hatchling.build' without a setup.py"),
        ("[project]\nname = 'x'\n", "build-backend '(none)' without a setup.py"),
        ("[build-system\n", "not TOML"),
        (None, "has neither setup.py nor pyproject.toml"),
    ],
)
def test_a_tree_torchbuild_cannot_build_is_named(tmp_path, toml, said):
    if toml is not None:
        (tmp_path / "pyproject.toml").write_text(toml)
    with pytest.raises(SourceError) as err:
        kind_of(tmp_path)
    assert said in err.value.message and err.value.hint


def test_an_unknown_backend_stops_the_build_before_anything_runs(tmp_path):
    """`invoke build` on such a tree: exit 8, one line on what to do, no traceback, no build/."""
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[build-system]\nbuild-backend = "flit_core.buildapi"\n')
    res = run_invoke(
        "build", "--source", str(tree), "--out", str(tmp_path / "out"),
        *set_args([f"cache_dir={tmp_path / 'cache'}", "patches=none", "build_venv=false"]),
    )  # fmt: skip
    assert res.returncode == 8, res.stdout[-2000:] + res.stderr
    assert "SourceError" in res.stderr and "build-backend 'flit_core.buildapi' without a setup.py" in res.stderr
    assert "hint: point --source at the top of a PyTorch checkout" in res.stderr
    assert "Traceback" not in res.stderr and not (tree / "build").exists()


def test_the_standalone_configure_takes_the_backend_s_settings(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        SKBUILD_TOML + '[tool.scikit-build]\ncmake.build-type = "RelWithDebInfo"\ncmake.args = ["-Wno-dev"]\n'
        '[tool.scikit-build.cmake.define]\nBUILD_TEST = false\nARCHS = ["80", "90"]\n'
        'FROM_ENV = { env = "MY_VAR", default = "d" }\nUNSET = { env = "NOT_SET" }\n'
    )
    assert skbuild_settings(tmp_path, {"MY_VAR": "v"}).defines == (
        ("ARCHS", "80;90"), ("BUILD_TEST", "FALSE"), ("FROM_ENV", "v"),
    )  # fmt: skip
    cmd = skbuild.configure_cmd(str(tmp_path), {}, {"CMAKE_PROJECT_INCLUDE": "/c/hook.cmake"}, "/py/bin/python3")
    assert cmd == [
        "cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"), "-G", "Ninja",
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DPython_EXECUTABLE=/py/bin/python3",
        "-DARCHS=80;90", "-DBUILD_TEST=FALSE", "-DFROM_ENV=d", "-DCMAKE_PROJECT_INCLUDE=/c/hook.cmake", "-Wno-dev",
    ]  # fmt: skip


def test_the_backend_gets_the_persistent_build_dir_and_the_project_time_defines():
    env_vars = {"CMAKE_PROJECT_INCLUDE": "/cache/codegen/bin/x.cmake", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache"}
    defines = skbuild.project_defines(env_vars, {"CMAKE_PROJECT_TOP_LEVEL_INCLUDES": "/t/build/torchbuild-heavy.cmake"})
    assert skbuild.config_settings(defines) == [
        "--config-settings=build-dir=build",
        "--config-settings=cmake.define.CMAKE_PROJECT_INCLUDE=/cache/codegen/bin/x.cmake",
        "--config-settings=cmake.define.CMAKE_PROJECT_TOP_LEVEL_INCLUDES=/t/build/torchbuild-heavy.cmake",
    ]  # the launcher reaches CMake through the tree's own forwarding, as setup.py's -D did


def test_the_wheel_tools_check_names_scikit_build_core_for_such_a_tree(tmp_path):
    from torchbuild.core.errors import ToolMissing
    from torchbuild.runtime.compile_job import check_wheel_tools

    (tmp_path / "pyproject.toml").write_text(SKBUILD_TOML)
    check_wheel_tools(str(tmp_path), sys.executable)  # this interpreter has it (the test extras)
    bare = tmp_path / "venv"
    import venv

    venv.create(bare, with_pip=False)
    with pytest.raises(ToolMissing) as err:
        check_wheel_tools(str(tmp_path), str(bare / "bin" / "python"))
    assert "lacks scikit-build-core, which a scikit-build-core build needs" in err.value.message


def test_develop_installs_a_scikit_build_core_tree_with_pip(tmp_path):
    from torchbuild.devloop.step import mode_for

    (tmp_path / "version.txt").write_text("2.6.0\n")  # a setup.py tree this old would `setup.py develop`
    (tmp_path / "pyproject.toml").write_text(SKBUILD_TOML)
    assert mode_for(Path(tmp_path)) == "pip"
