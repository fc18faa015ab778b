"""The shape of src/torchbuild, for issue 43's before/after: source lines and modules per package,
the functions over 40 lines and the longest one (a function counts from its first decorator to
its last line, as tests/unit/repo/test_layout.py counts it for the 60-line rule), and how many packages
each row of docs/architecture.md's "Where each behaviour lives" names (the goal: one), and how
many features (the packages other than the shared layers SHARED, which hold what two or more
features use: a row naming one feature and the runtime it runs on is one feature's behaviour).

  python benchmarks/code_shape.py [SRC]     # SRC defaults to this checkout's src/torchbuild
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

LONG = 40
# the layers under (and the command line over) the features: docs/architecture.md "The layers"
SHARED = {"runtime", "profile", "core", "tasks"}


def functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield prefix + node.name, (node.end_lineno or node.lineno) - first + 1
            yield from functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def main() -> None:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "src" / "torchbuild")
    if not (src / "__init__.py").is_file():
        sys.exit(f"code_shape: {src} is not a package's folder; give src/torchbuild of a checkout")
    lines: dict[str, int] = defaultdict(int)
    modules: dict[str, int] = defaultdict(int)
    lengths: list[tuple[int, str]] = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        package = rel.parts[0] if len(rel.parts) > 1 else "(top)"
        text = path.read_text()
        lines[package] += len(text.splitlines())
        modules[package] += 1
        lengths += [(n, f"{rel.as_posix()}:{name}") for name, n in functions(ast.parse(text))]
    print(f"{'package':<12} {'modules':>7} {'lines':>7}")
    for package in sorted(lines, key=lambda p: -lines[p]):
        print(f"{package:<12} {modules[package]:>7} {lines[package]:>7}")
    print(f"{'all':<12} {sum(modules.values()):>7} {sum(lines.values()):>7}")
    long = sorted((x for x in lengths if x[0] > LONG), reverse=True)
    print(
        f"functions: {len(lengths)}; over {LONG} lines: {len(long)}; longest: {long[0][1] if long else '-'} ({max(lengths)[0]} lines)"
    )

    rows()


def rows(doc: Path = Path(__file__).parents[1] / "docs" / "architecture.md") -> None:
    """Each behaviour-map row's packages: the first folder of every `pkg/module.py` its module cell names."""
    text = doc.read_text()
    table = text[text.index("## Where each behaviour lives") :].split("\n## ", 1)[0]
    counts: dict[int, int] = defaultdict(int)
    features: dict[int, int] = defaultdict(int)
    spread = []
    for line in table.splitlines()[4:]:
        cells = line.split(" | ")
        if len(cells) < 2:
            continue
        packages = set(re.findall(r"`([a-z_]+)/[a-z_/]*\.py", cells[-1]))
        counts[len(packages)] += 1
        features[len(packages - SHARED)] += 1
        if len(packages) > 2 or len(packages - SHARED) > 1:
            spread.append(f"  {cells[0].lstrip('| ')[:70]}: {', '.join(sorted(packages))}")
    total = sum(counts.values())
    print(f"behaviour-map rows: {total}; naming {_by(counts, 'package')}")
    print(f"features a row names (packages but {', '.join(sorted(SHARED))}): {_by(features, 'feature')}")
    print("\n".join(spread))


def _by(counts: dict[int, int], what: str) -> str:
    return ", ".join(f"{n} {what}{'s' if n != 1 else ''}: {counts[n]}" for n in sorted(counts))


if __name__ == "__main__":
    main()
