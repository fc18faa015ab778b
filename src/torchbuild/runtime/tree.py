"""What kind of tree a source is: the one place that decides how it is configured and built.

- "setup.py": PyTorch up to the scikit-build-core switch (and every companion): `python setup.py
  build --cmake-only` configures, `pip wheel` runs setup.py, MAX_JOBS sets ninja's jobs.
- "scikit-build-core": PyTorch main after pytorch/pytorch#189758 (mid-2026, PRs #180247/#180248):
  pyproject.toml's `build-backend = "scikit_build_core.build"` and no setup.py. There is no
  configure-only command any more (cmake/EnvVarForwarding.cmake's header: CMAKE_ONLY "no
  equivalent"), MAX_JOBS is an alias of CMAKE_BUILD_PARALLEL_LEVEL through [tool.scikit-build.env],
  and USE_*/BUILD_*/CMAKE_* variables reach CMake through the tree's own forwarding module.

A pyproject.toml names the backend pip will run, so its build-backend decides when it names
scikit-build-core (a leftover setup.py is then not what pip runs); a setup.py decides otherwise.
Anything else is a SourceError saying what torchbuild builds. Steps and the launching side ask
`kind_of`; none looks for setup.py itself.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchbuild.core.errors import SourceError
from torchbuild.core.safeio import KiB, read_text

SETUP_PY = "setup.py"
SKBUILD = "scikit-build-core"
SKBUILD_BACKEND = "scikit_build_core.build"
PYPROJECT_LIMIT = 256 * KiB  # PyTorch main's is ~12 KiB (about 130 lines of wheel.exclude)
_HINT = "point --source at the top of a PyTorch checkout (a setup.py, or pyproject.toml with scikit-build-core)"


def _toml(text: str, where: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # tomli, the same parser before it joined the standard library (a dependency there)
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SourceError(f"{where}: not TOML ({exc})", hint="fix the file, or fetch the tree again") from None


def pyproject(source: str | Path) -> dict[str, Any]:
    """The tree's pyproject.toml as a table ({} where it has none)."""
    path = Path(source) / "pyproject.toml"
    if not path.is_file():
        return {}
    return _toml(read_text(path, PYPROJECT_LIMIT, "the tree's pyproject.toml", SourceError), path)


def is_skbuild(source: str | Path) -> bool:
    """Whether pip builds the tree at source with scikit-build-core (its pyproject.toml says so)."""
    return bool(pyproject(source).get("build-system", {}).get("build-backend", "") == SKBUILD_BACKEND)


def kind_of(source: str | Path) -> str:
    """SETUP_PY or SKBUILD for the tree at source; SourceError for a tree torchbuild cannot build."""
    root = Path(source)
    if is_skbuild(root):
        return SKBUILD
    table = pyproject(root)
    backend = table.get("build-system", {}).get("build-backend", "")
    if (root / "setup.py").is_file():
        return SETUP_PY
    if table:
        raise SourceError(
            f"{root / 'pyproject.toml'}: build-backend {backend or '(none)'!r} without a setup.py: torchbuild "
            f"builds trees with a setup.py or with build-backend {SKBUILD_BACKEND!r}",
            hint=_HINT,
        )
    raise SourceError(f"{root} has neither setup.py nor pyproject.toml", hint=_HINT)


@dataclasses.dataclass(frozen=True)
class SkbuildSettings:
    """What a standalone CMake configure takes from [tool.scikit-build] to match the backend's:
    the build type and the defines (cmake.define: strings, booleans, lists, {env, default} tables)."""

    build_type: str = "Release"  # scikit-build-core's default for cmake.build-type
    defines: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()


def _define_value(value: Any, env: Mapping[str, str]) -> str | None:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, dict):  # {env = "NAME", default = "..."}: unset and no default → not passed
        got = env.get(str(value.get("env", "")), value.get("default"))
        return None if got is None else _define_value(got, env)
    return str(value)


def skbuild_settings(source: str | Path, env: Mapping[str, str]) -> SkbuildSettings:
    """[tool.scikit-build]'s cmake.build-type, cmake.define and cmake.args of the tree."""
    cmake = pyproject(source).get("tool", {}).get("scikit-build", {}).get("cmake", {})
    if not isinstance(cmake, dict):
        raise SourceError(f"{Path(source) / 'pyproject.toml'}: [tool.scikit-build].cmake is not a table", hint=_HINT)
    defines = []
    for key, value in sorted((cmake.get("define") or {}).items()):
        resolved = _define_value(value, env)
        if resolved is not None:
            defines.append((str(key), resolved))
    return SkbuildSettings(
        build_type=str(cmake.get("build-type") or "Release"),
        defines=tuple(defines),
        args=tuple(str(a) for a in cmake.get("args") or ()),
    )
