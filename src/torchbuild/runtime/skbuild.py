"""How a scikit-build-core tree (PyTorch main since pytorch/pytorch#189758; runtime/tree.py says
which trees are) is configured and built, beside setup.py's way.

Configure (a preflight, and before a wheel build with a heavy pool): CMake straight, the way the
backend runs it, not through the backend's config settings. scikit-build-core has no configure-
only mode (PyTorch main's cmake/EnvVarForwarding.cmake lists CMAKE_ONLY as "no equivalent"), and
`build.targets` would still install and pack a wheel; PR #180247 keeps PyTorch's CMakeLists
working under "a standalone cmake invocation" (SKBUILD_* values fall back). So: `cmake -S . -B
build -G Ninja` with the interpreter as Python_EXECUTABLE, [tool.scikit-build]'s cmake.build-type,
cmake.define and cmake.args, and torchbuild's own defines. USE_*/BUILD_*/CMAKE_* variables reach
CMake through the tree's forwarding module, as under the backend.

Build: `pip wheel --no-build-isolation` (and `pip install -e` for develop) with `build-dir=build`,
so the tree's build/ persists between builds whatever pyproject.toml says (ninja and the
configure stamp find it there, as with setup.py), and torchbuild's defines as `cmake.define.*`
config settings. torchbuild's defines are those CMake must see before the forwarding module runs
(it runs after project()): the code generation's CMAKE_PROJECT_INCLUDE (builder/codegen.py) and the
heavy pool's CMAKE_PROJECT_TOP_LEVEL_INCLUDES (builder/heavy.py). Jobs: CMAKE_BUILD_PARALLEL_LEVEL,
which the environment carries with MAX_JOBS (runtime/environment.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from torchbuild.runtime.tree import skbuild_settings

BUILD_DIR = "build"  # torchbuild's build tree in every kind of tree (builder/step.py: build_dir)
# what CMake must be given at project() time, before the tree's env forwarding runs
PROJECT_TIME = ("CMAKE_PROJECT_INCLUDE", "CMAKE_PROJECT_TOP_LEVEL_INCLUDES")


def project_defines(env_vars: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """torchbuild's defines for a scikit-build-core tree: the project-time variables of the
    build's environment, then extra (the heavy pool's hook)."""
    return {**{k: env_vars[k] for k in PROJECT_TIME if env_vars.get(k)}, **extra}


def configure_cmd(
    source: str, env: Mapping[str, str], defines: Mapping[str, str], python: str = sys.executable
) -> list[str]:
    """The standalone CMake configure of a scikit-build-core tree, as the backend would run it."""
    settings = skbuild_settings(source, env)
    args = [
        "cmake",
        "-S",
        source,
        "-B",
        str(Path(source) / BUILD_DIR),
        "-G",
        "Ninja",
        f"-DCMAKE_BUILD_TYPE={settings.build_type}",
        f"-DPython_EXECUTABLE={python}",
        *(f"-D{k}={v}" for k, v in settings.defines),
        *(f"-D{k}={v}" for k, v in sorted(defines.items())),
        *settings.args,
    ]
    return args


def config_settings(defines: Mapping[str, str]) -> list[str]:
    """pip's --config-settings for the backend: the persistent build/ and torchbuild's defines."""
    return [
        f"--config-settings=build-dir={BUILD_DIR}",
        *(f"--config-settings=cmake.define.{k}={v}" for k, v in sorted(defines.items())),
    ]
