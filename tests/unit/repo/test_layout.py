"""The project rule that a function is at most 60 lines, for every function under src/torchbuild.

A function's lines count from its first decorator to its last line. A task function (in
tasks/, decorated with @task or @launch_task, which make TorchbuildTasks) counts from its
`def`: its decorator is mostly the options' help text."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import torchbuild

MAX_LINES = 60
SRC = Path(torchbuild.__file__).parent
TASK_DECORATORS = {"task", "launch_task"}

# Functions that must stay longer, each named as "area/module.py:qualified name", with a
# comment saying why (none today). An entry whose function is no longer too long fails the
# test below, so the list cannot rot.
ALLOWED: set[str] = set()


def _is_task(node: ast.FunctionDef | ast.AsyncFunctionDef, module: str) -> bool:
    def name(decorator: ast.expr) -> str:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute):
            return target.attr
        return target.id if isinstance(target, ast.Name) else ""

    return (module.startswith("tasks/") or module.endswith("task.py")) and any(
        name(d) in TASK_DECORATORS for d in node.decorator_list
    )


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method (nested ones too) with its qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _module_lengths(text: str, module: str) -> dict[str, tuple[int, int]]:
    """qualified name -> (its first line, its length) for every function of one module."""
    found: dict[str, tuple[int, int]] = {}
    for qualname, node in _functions(ast.parse(text, module)):
        first = node.lineno if _is_task(node, module) else min([node.lineno, *(d.lineno for d in node.decorator_list)])
        found[qualname] = (first, (node.end_lineno or node.lineno) - first + 1)
    return found


def _lengths() -> dict[str, tuple[int, int]]:
    """ "area/module.py:qualified name" -> (its first line, its length) for every function."""
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for qualname, where in _module_lengths(path.read_text(encoding="utf-8"), module).items():
            found[f"{module}:{qualname}"] = where
    return found


def test_no_function_is_longer_than_60_lines() -> None:
    too_long = [
        f"src/torchbuild/{where.split(':')[0]}:{first} {where.split(':')[1]} is {n} lines"
        for where, (first, n) in _lengths().items()
        if n > MAX_LINES and where not in ALLOWED
    ]
    assert not too_long, (
        f"functions longer than {MAX_LINES} lines; split each into functions that each do one thing:\n"
        + "\n".join(too_long)
    )


def test_the_allow_list_names_only_functions_still_too_long() -> None:
    lengths = _lengths()
    stale = sorted(where for where in ALLOWED if lengths.get(where, (0, 0))[1] <= MAX_LINES)
    assert not stale, f"remove from ALLOWED in {__file__} (gone, or now at most {MAX_LINES} lines): {stale}"


SAMPLE = """
@task(
    help={"a": "the help text"},
)
@handles_errors
def t(c):
    pass


class C:
    @functools.cache
    def f(self):
        def inner():
            pass
"""


def test_a_task_counts_from_its_def_and_anything_else_from_its_first_decorator() -> None:
    assert _module_lengths(SAMPLE, "tasks/x.py") == {
        "t": (6, 2),
        "C.f": (11, 4),
        "C.f.<locals>.inner": (13, 2),
    }
    assert _module_lengths(SAMPLE, "steps/x.py")["t"] == (2, 6)  # outside tasks/ it is no task
