#!/usr/bin/env python3
"""Move torchbuild to one package per feature over core / profile / runtime (issue 43 item 1).

    python move.py REPO            # git mv, rewrite references, new __init__.py, import-linter contracts

Everything is derived from MOVES (old module -> new module, role) and FEATURES below, never from
line numbers, so it runs again on a later commit. What it does, in order:

 1. `git mv` each module in MOVES (a module missing in REPO is reported and skipped; a module in
    an old package that MOVES does not name stops the run: add it to the table first);
 2. writes an `__init__.py` with a docstring for every new package, removes the emptied ones;
 3. rewrites every reference in tracked text files (src, tests, tasks.py, noxfile.py, benchmarks,
    docs, .ci, containers, configs, pyproject.toml), CHANGELOG.md and recorded benchmark results
    excepted (they are history):
      - Python `from torchbuild.PKG import MODULE [as ALIAS]` forms through the AST (a moved
        module imported by name from its package becomes `from NEWPKG import NEWNAME as OLDNAME`);
      - dotted names `torchbuild.old.module[.attr]` anywhere (imports, monkeypatch targets,
        `python -m ...`, mypy overrides), longest first;
      - paths `src/torchbuild/old/module.py` and the short `old/module.py` docs use;
 4. replaces pyproject's [tool.importlinter] with the contracts generated from the tables;
 5. `ruff check --select I --fix` and `ruff format` on the touched Python files, when ruff is on
    PATH (the rewritten imports change their sort order).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

OLD_PACKAGES = ("inputs", "delivery", "launch", "launch.backends", "steps", "tasks")

# feature -> (one-line purpose, its public module: the only one other features may import)
FEATURES: dict[str, tuple[str, str]] = {
    "source": (
        "PyTorch's source: git / dir / tarball / .dsc fetch, the patch series",
        "fetch",
    ),
    "image": (
        "the toolchain image: build, lock, push; local Debian base images",
        "host",
    ),
    "sif": ("the Apptainer SIF: from the image or from the recipe", "recipe"),
    "configview": (
        "`invoke config`: the resolved profile shown, and when not to build",
        "need_build",
    ),
    "builder": (
        "torch's build: the launch path, the build step, its helpers, companions, manifest show/diff",
        "host",
    ),
    "comms": ("NCCL and the aws-ofi-nccl plugin: host checks, the comms step", "host"),
    "verify": (
        "verify a wheel or an install: the step, the probe, upstream tests, the ranks' checks and their job",
        "host",
    ),
    "install": ("install environments, modulefiles, mpi-check, wheelhouses", "host"),
    "batch": (
        "Slurm and PBS jobs: build jobs, rounds, spread, run jobs",
        "host",
    ),
    "devloop": ("`invoke develop`: editable trees", "host"),
    "bench": ("`invoke bench`: torchbench against the built torch", "step"),
    "hostcheck": ("`invoke host-check`: the benchmark host's tuning", "host"),
    "doctor": ("`invoke doctor`: what this host can do", "host"),
}

# old module (under torchbuild.) -> (new module, role). role: task (invoke task), host (the
# launching side), step (what runs where the backend runs it, and pure helpers); "" for the
# ground layers (runtime, profile) where there is no feature.
MOVES: dict[str, tuple[str, str]] = {
    # profile: the options model and the tables it validates against (below runtime)
    "inputs.config": ("profile.config", ""),
    "inputs.keys": ("profile.keys", ""),  # every key declared once: defaults.yaml, schema, flags derive from it
    "inputs.comms_table": ("profile.comms_table", ""),
    "inputs.companion_table": ("profile.companion_table", ""),
    "inputs.nccl_arch": ("profile.nccl_arch", ""),
    "inputs.torch_lines": ("profile.torch_lines", ""),
    "inputs.remote_cache": ("profile.remote_cache", ""),
    "inputs.cuda_archs": (
        "profile.cuda_archs",
        "",
    ),  # config checks cuda_arch_list against it
    "inputs.official_wheels": (
        "profile.official_wheels",
        "",
    ),  # config reads the CUDA ceiling from it
    # runtime: backends, engines, the step registry, the compile job, shared records and tools
    "launch.backends": ("runtime.backends", ""),
    "launch.backends.base": ("runtime.backends.base", ""),
    "launch.backends.native": ("runtime.backends.native", ""),
    "launch.backends.docker": ("runtime.backends.docker", ""),
    "launch.backends.apptainer": ("runtime.backends.apptainer", ""),
    "inputs.engine": ("runtime.engine", ""),
    "inputs.environment": ("runtime.environment", ""),
    "inputs.jobs": ("runtime.jobs", ""),
    "steps": ("runtime.steps", ""),
    "steps.oom": ("runtime.oom", ""),
    "steps.compile_job": ("runtime.compile_job", ""),
    "inputs.tree": ("runtime.tree", ""),  # the tree's kind: compile_job, build, develop
    "steps.skbuild": (
        "runtime.skbuild",
        "",
    ),  # a scikit-build-core tree: build and develop
    "tasks.common": ("runtime.tasks", ""),
    "tasks.flags": ("runtime.flags", ""),  # a task's flags from the key models (tasks.common and verify's)
    "delivery.manifest": ("runtime.manifest", ""),
    "delivery.pipenv": ("runtime.pipenv", ""),
    "delivery.elffloor": ("runtime.elffloor", ""),
    "delivery.libraries": ("runtime.libraries", ""),
    "steps.report": ("runtime.report", ""),  # ninja's log: builder and devloop (split H)
    # source
    "inputs.source": ("source.fetch", "host"),
    "inputs.patches": ("source.patches", "host"),
    # image
    "tasks.image": ("image.task", "task"),
    "inputs.image": ("image.host", "host"),
    "inputs.baseimage": ("image.baseimage", "host"),
    "inputs.lock": ("image.lock", "host"),
    # sif
    "tasks.sif": ("sif.task", "task"),
    "inputs.sif": ("sif.host", "host"),
    "inputs.recipe": ("sif.recipe", "host"),
    # configview
    "tasks.config": ("configview.task", "task"),
    "inputs.render": ("configview.render", "host"),
    "inputs.need_build": ("configview.need_build", "host"),
    # build
    "tasks.build": ("builder.task", "task"),
    "tasks.manifest": ("builder.manifest_task", "task"),
    "launch.runner": ("builder.host", "host"),
    "steps.resume": ("builder.resume", "host"),
    "steps.build": ("builder.step", "step"),
    "steps.buildenv": ("builder.buildenv", "step"),
    "steps.cmakecache": ("builder.cmakecache", "step"),
    "steps.codegen": ("builder.codegen", "step"),
    "steps.flatbuf": ("builder.flatbuf", "step"),
    "steps.heavy": ("builder.heavy", "step"),
    "steps.bound": ("builder.bound", "step"),
    "steps.runs": ("builder.runs", "step"),
    "steps.unitpeak": ("builder.unitpeak", "step"),
    "steps.repro": ("builder.repro", "step"),
    "steps.companions": ("builder.companions", "step"),
    # comms
    "tasks.comms": ("comms.task", "task"),
    "launch.comms": ("comms.host", "host"),
    "steps.comms": ("comms.step", "step"),
    # verify
    "tasks.verify": ("verify.task", "task"),
    "delivery.verify": ("verify.step", "step"),
    "delivery.probe": ("verify.probe", "step"),
    "delivery.upstream_tests": ("verify.upstream_tests", "step"),
    "delivery.multinode": ("verify.multinode", "step"),
    "delivery.rankcheck": ("verify.rankcheck", "step"),
    # install
    "tasks.install": ("install.task", "task"),
    "tasks.wheelhouse": ("install.wheelhouse_task", "task"),
    "launch.install": ("install.host", "host"),
    "delivery.install": ("install.step", "step"),
    "delivery.wheelhouse": ("install.wheelhouse", "step"),
    "delivery.modulefiles": ("install.modulefiles", "step"),
    "delivery.mpiinfo": ("install.mpiinfo", "step"),
    "delivery.ncclprobe": ("install.ncclprobe", "step"),
    # batch
    "tasks.submit": ("batch.task", "task"),
    "launch.scheduler": ("batch.host", "host"),
    "launch.spread": ("batch.spread", "host"),
    "launch.rounds": ("batch.rounds", "host"),
    "launch.jobplaces": ("batch.jobplaces", "host"),
    "launch.verify_nodes": ("verify.nodes", "host"),  # split E: the multi-node check is verify's
    # devloop
    "tasks.develop": ("devloop.task", "task"),
    "launch.develop": ("devloop.host", "host"),
    "steps.develop": ("devloop.step", "step"),
    # bench
    "tasks.bench": ("bench.task", "task"),
    "steps.bench": ("bench.step", "step"),
    # hostcheck, doctor
    "tasks.hostcheck": ("hostcheck.task", "task"),
    "launch.hostcheck": ("hostcheck.host", "host"),
    "tasks.doctor": ("doctor.task", "task"),
    "launch.doctor": ("doctor.host", "host"),
}
# tasks/__init__.py (the Collection) and tasks/inside.py stay: the application layer over all.
STAYS = {"tasks", "tasks.inside"}

PACKAGE_DOCS = {
    "profile": "The options model: profiles loaded, merged and validated into a BuildSpec, and the "
    "tables they are checked against. Imports only core.",
    "runtime": "What every feature stands on: the backends (native, Docker, Apptainer), the engines, "
    "the step registry, the one compile job, the manifest and the shared wheel tools. Imports "
    "profile and core, never a feature.",
    "runtime.backends": "Where a step runs: natively, in the toolchain image (Docker) or in the SIF.",
}

# Imports the whole-module move cannot mend: each wants a split named in PLAN.md. Listed in the
# contracts' ignore_imports (unmatched ones only warn, so mending one does not break lint).
EXCEPTIONS_FILE = Path(__file__).with_name("exceptions.txt")

# Text that names the old layout in a way no table can derive: (file, old, new); missing -> warning.
EXTRA_EDITS = [
    (
        "tests/unit/test_layout.py",
        'return module.startswith("tasks/") and',
        'return (module.startswith("tasks/") or module.endswith("task.py")) and',
    ),
]

TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".toml",
    ".yml",
    ".yaml",
    ".cfg",
    ".ini",
    ".txt",
    ".sh",
    ".json",
    ".Dockerfile",
    ".def",
}
SKIP = ("CHANGELOG.md", "benchmarks/results/", "tests/fixtures/")


def module_path(src: Path, dotted: str) -> Path:
    base = src / "torchbuild" / Path(*dotted.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def new_file(src: Path, old: str, new: str) -> Path:
    if old in ("steps", "launch.backends") or old.endswith("__init__"):
        pass
    base = src / "torchbuild" / Path(*new.split("."))
    return base / "__init__.py" if old == "launch.backends" else base.with_suffix(".py")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True)


def check_table(src: Path) -> None:
    known = set(MOVES) | STAYS
    stray = []
    for pkg in OLD_PACKAGES:
        d = src / "torchbuild" / Path(*pkg.split("."))
        for f in sorted(d.glob("*.py")) if d.is_dir() else []:
            name = pkg if f.name == "__init__.py" else f"{pkg}.{f.stem}"
            if name not in known and f.name != "__init__.py":
                stray.append(name)
    if stray:
        sys.exit(f"move.py: modules not in MOVES: {', '.join(stray)} (add each to the table)")


def move_files(repo: Path, src: Path) -> dict[str, str]:
    done: dict[str, str] = {}
    for old, (new, _) in MOVES.items():
        f = module_path(src, old)
        if not f.exists():
            print(f"skip {old}: not in this checkout")
            continue
        target = new_file(src, old, new)
        target.parent.mkdir(parents=True, exist_ok=True)
        git(repo, "mv", str(f.relative_to(repo)), str(target.relative_to(repo)))
        done[old] = new
    return done


def write_inits(repo: Path, src: Path) -> None:
    packages = {n.rsplit(".", 1)[0] for n, _ in MOVES.values() if "." in n} | {"runtime.backends"}
    for pkg in sorted(packages):
        init = src / "torchbuild" / Path(*pkg.split(".")) / "__init__.py"
        if init.exists():
            continue
        top = pkg.split(".")[0]
        doc = PACKAGE_DOCS.get(pkg) or (
            f"{FEATURES[top][0][0].upper()}{FEATURES[top][0][1:]}. Other features import only "
            f"torchbuild.{top}.{FEATURES[top][1]} (pyproject's import-linter contracts)."
        )
        init.write_text(f'"""{doc}"""\n')
        git(repo, "add", "-f", str(init.relative_to(repo)))
    for pkg in ("launch/backends", "inputs", "delivery", "launch", "steps"):
        d = src / "torchbuild" / pkg
        if not d.is_dir():
            continue
        left = [p for p in d.iterdir() if p.name not in ("__pycache__", "__init__.py")]
        if left:
            continue
        init = d / "__init__.py"
        if init.exists():
            git(repo, "rm", "-q", str(init.relative_to(repo)))
        shutil.rmtree(d, ignore_errors=True)


def _is_text(p: Path) -> bool:
    """A file without a suffix (.ci/run, tb): text when it decodes as UTF-8 and has no NUL."""
    data = p.read_bytes()[:65536]
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return b"\0" not in data


def tracked(repo: Path) -> list[Path]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files"], check=True, capture_output=True, text=True).stdout
    files = []
    for rel in out.splitlines():
        p = repo / rel
        if rel.startswith(SKIP) or not p.is_file():
            continue
        if p.suffix in TEXT_SUFFIXES or p.name.endswith("Dockerfile") or (not p.suffix and _is_text(p)):
            files.append(p)
    return files


def rewrite_import_froms(text: str, moves: dict[str, str]) -> str:
    """`from torchbuild.PKG import MOD [as A], NAME` where PKG.MOD moved: one statement per target."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchbuild")):
            continue
        pkg = node.module[len("torchbuild.") :] if node.module != "torchbuild" else ""
        if not any(f"{pkg}.{a.name}".lstrip(".") in moves for a in node.names):
            continue
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        stmts, rest = [], []
        for a in node.names:
            sub = f"{pkg}.{a.name}".lstrip(".")
            if sub in moves:
                parent, _, name = f"torchbuild.{moves[sub]}".rpartition(".")
                alias = a.asname or a.name
                stmts.append(f"from {parent} import {name}" + ("" if alias == name else f" as {alias}"))
            else:
                rest.append(a.name if a.asname is None else f"{a.name} as {a.asname}")
        if rest:
            stmts.insert(0, f"from {node.module} import {', '.join(rest)}")
        tail = lines[node.end_lineno - 1][node.end_col_offset :].rstrip("\n")  # a trailing comment (E402 waiver) stays
        edits.append(
            (
                node.lineno,
                node.end_lineno,
                "".join(f"{indent}{s}{tail}\n" for s in stmts),
            )
        )
    for start, end, new in sorted(edits, reverse=True):
        lines[start - 1 : end] = [new]
    return "".join(lines)


def rewrite_text(text: str, moves: dict[str, str], paths: dict[str, str], is_py: bool) -> str:
    if is_py:
        text = rewrite_import_froms(text, moves)

    # the same form in text the AST does not see: `python -c "from torchbuild.builder import runs"`
    def from_text(m: re.Match[str]) -> str:
        sub = f"{m.group(1)}.{m.group(2)}"
        if sub not in moves:
            return m.group(0)
        parent, _, name = f"torchbuild.{moves[sub]}".rpartition(".")
        return f"from {parent} import {name}" + ("" if name == m.group(2) else f" as {m.group(2)}")

    text = re.sub(
        r"from torchbuild\.([a-z_.]+) import ([a-z_]+)(?![\w,.(])(?! as )",
        from_text,
        text,
    )
    olds = sorted(moves, key=len, reverse=True)
    dotted = re.compile(r"(?<![\w.])torchbuild\.(" + "|".join(re.escape(o) for o in olds) + r")(?![\w])")
    text = dotted.sub(lambda m: f"torchbuild.{moves[m.group(1)]}", text)
    olds_p = sorted(paths, key=len, reverse=True)
    path_re = re.compile(r"(?<![\w.-])((?:src/)?torchbuild/)?(" + "|".join(re.escape(o) for o in olds_p) + r")(?![\w])")
    text = path_re.sub(lambda m: f"{m.group(1) or ''}{paths[m.group(2)]}", text)
    # pathlib joins in tests: REPO / "src" / "torchbuild" / "profile" / "comms_table.py"
    joined = re.compile(r'"torchbuild"((?:\s*/\s*"[a-z_]+")*\s*/\s*"[a-z_]+\.py")')

    def join(m: re.Match[str]) -> str:
        rel = "/".join(re.findall(r'"([a-z_.]+)"', m.group(1)))
        if rel not in paths:
            return m.group(0)
        return '"torchbuild"' + "".join(f' / "{part}"' for part in paths[rel].split("/"))

    return joined.sub(join, text)


def path_table(moves: dict[str, str]) -> dict[str, str]:
    out = {}
    for old, new in moves.items():
        o = old.replace(".", "/") + ("/__init__.py" if old in ("steps", "launch.backends") else ".py")
        n = new.replace(".", "/") + ("/__init__.py" if old == "launch.backends" else ".py")
        out[o] = n
    return out


def toml_list(items: list[str], indent: str = "  ") -> str:
    return "[\n" + "".join(f'{indent}"{i}",\n' for i in items) + "]"


def contracts() -> str:
    feats = sorted(FEATURES)
    by_feature: dict[str, list[tuple[str, str]]] = {f: [] for f in feats}
    for new, role in MOVES.values():
        top = new.split(".")[0]
        if top in by_feature:
            by_feature[top].append((new, role))
    exc = read_exceptions()
    out = [
        "[tool.importlinter]",
        'root_package = "torchbuild"',
        "# imports inside functions count (grimp reads every import statement), TYPE_CHECKING ones too",
        "# generated by /work/restructure/move.py from its MOVES and FEATURES tables",
        "",
        "[[tool.importlinter.contracts]]",
        'name = "layers: the CLI and the Collection, the features, runtime, profile, core"',
        'type = "layers"',
        'containers = ["torchbuild"]',
        "layers = " + toml_list(["cli", "tasks", " : ".join(feats), "runtime", "profile", "core"]),
        "exhaustive = true",
        'exhaustive_ignores = ["__main__"]',
        'unmatched_ignore_imports_alerting = "warn"',
        "ignore_imports = " + toml_list([f"{a} -> {b}" for a, b, why in exc if why.startswith("layers")]),
    ]
    for f in feats:
        public = f"torchbuild.{f}.{FEATURES[f][1]}"
        private = [f"torchbuild.{n}" for n, _ in sorted(by_feature[f]) if f"torchbuild.{n}" != public]
        ign = [f"{a} -> {b}" for a, b, _ in exc if b.startswith(f"torchbuild.{f}.") and b != public]
        out += [
            "",
            "[[tool.importlinter.contracts]]",
            f'name = "{f}: other features import only {public}"',
            'type = "protected"',
            "protected_modules = " + toml_list(private),
            f'allowed_importers = ["torchbuild.{f}", "torchbuild.tasks"]',
            'unmatched_ignore_imports_alerting = "warn"',
        ]
        if ign:
            out.append("ignore_imports = " + toml_list(ign))
    for f in feats:
        roles = {r: [f"torchbuild.{n}" for n, rr in by_feature[f] if rr == r] for r in ("task", "host", "step")}
        for low, high in (("step", ["host", "task"]), ("host", ["task"])):
            forbidden = [m for h in high for m in roles[h]]
            if roles[low] and forbidden:
                out += [
                    "",
                    "[[tool.importlinter.contracts]]",
                    f'name = "{f}: the {low} side does not import its {" or ".join(high)} side"',
                    'type = "forbidden"',
                    "source_modules = " + toml_list(roles[low]),
                    "forbidden_modules = " + toml_list(forbidden),
                    "allow_indirect_imports = true",
                ]
    out += [
        "",
        "[[tool.importlinter.contracts]]",
        'name = "no import cycle among the modules of any package (imports inside functions counted)"',
        'type = "acyclic_siblings"',
        'ancestors = ["torchbuild"]',
        "depth = 4",
        'unmatched_ignore_imports_alerting = "warn"',
        "ignore_imports = " + toml_list([f"{a} -> {b}" for a, b, _ in exc]),
    ]
    return "\n".join(out) + "\n"


def read_exceptions() -> list[tuple[str, str, str]]:
    """exceptions.txt: `IMPORTER -> IMPORTED  # layers|public FEATURE: the split that mends it`."""
    rows = []
    if EXCEPTIONS_FILE.exists():
        for line in EXCEPTIONS_FILE.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            edge, _, why = line.partition("#")
            a, _, b = edge.partition("->")
            rows.append((a.strip(), b.strip(), why.split(":")[0].strip()))
    return rows


def replace_contracts(pyproject: Path) -> None:
    text = pyproject.read_text()
    start = text.index("[tool.importlinter]")
    nxt = re.search(r"^\[(?!\[?tool\.importlinter)", text[start + 1 :], re.MULTILINE)
    end = start + 1 + nxt.start() if nxt else len(text)
    pyproject.write_text(text[:start] + contracts() + ("\n" + text[end:] if nxt else ""))


def main() -> None:
    repo = Path(sys.argv[1]).resolve()
    src = repo / "src"
    check_table(src)
    moved = move_files(repo, src)
    write_inits(repo, src)
    # references are rewritten from the whole table, so a second run (or a tree where someone
    # moved the files already) still mends the text
    moves = {old: new for old, (new, _) in MOVES.items()}
    paths = path_table(moves)
    touched = []
    for f in tracked(repo):
        text = f.read_text()
        new = rewrite_text(text, moves, paths, f.suffix == ".py")
        if new != text:
            f.write_text(new)
            touched.append(f)
    for rel, old, new in EXTRA_EDITS:
        f = repo / rel
        text = f.read_text() if f.exists() else ""
        if old in text:
            f.write_text(text.replace(old, new))
            touched.append(f)
        elif new not in text:
            print(f"warning: {rel}: {old!r} not found (edit it by hand)")
    replace_contracts(repo / "pyproject.toml")
    py = [str(f) for f in touched if f.suffix == ".py"] + [str(p) for p in (src / "torchbuild").rglob("__init__.py")]
    if shutil.which("ruff") and py:
        subprocess.run(
            ["ruff", "check", "-q", "--select", "I", "--fix", *py],
            cwd=repo,
            check=False,
        )
        subprocess.run(["ruff", "format", "-q", *py], cwd=repo, check=False)
    print(f"moved {len(moved)} modules, rewrote {len(touched)} files")


if __name__ == "__main__":
    main()
