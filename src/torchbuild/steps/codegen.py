"""ATen's code generation, done once per set of inputs and reused by the next fresh build tree.

PyTorch's configure runs `python -m torchgen.gen ... --generate T --output-dependencies
<build>/aten/src/ATen/generated_T.cmake --dry-run` for T in headers, sources and
declarations_yaml (cmake/Codegen.cmake: the dry run writes the lists of what the real run will
write, which CMake includes), and ninja runs the same commands without --dry-run before the
first compile that needs them. In a fresh tree (`--clean`, CI, a new checkout) every one of
them runs again: most of a warm preflight's configure and of its c10 target.

torchbuild runs them through a wrapper (the interpreter CMake runs torchgen with, see
`wrapper_script`) that looks each one up in <cache_root>/codegen/<key>: on a hit it writes the
saved outputs (only those whose content differs, as torchgen itself does) and exits; on a miss
it runs the real command and saves what it wrote, atomically (a new directory renamed into
place: a reader sees a whole entry or none). Every other command the interpreter runs goes
straight to the real one.

The key is what the outputs depend on: the command line (its switches: --per-operator-headers,
--rocm, a selective build's op lists, --dry-run, the build tree's paths), the interpreter (its
path, version and PyYAML's, which reads the yaml files), torchgen's own source (every file under <source>/torchgen), the templates
(<source-path>/templates), native_functions.yaml and tags.yaml, and every other file the
command line names that exists (an op selection yaml) by content. A change to any of them is
another key: the next build regenerates and saves that one.

The outputs are what torchgen declares: the <prefix>generated_T.cmake files beside the
--output-dependencies path, and (for a real run) every file they list. A command without
--output-dependencies is never reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from torchbuild.core.atomic import atomic_write_bytes

FORMAT = 1  # of a saved entry; bumped whenever what is kept changes
DIRNAME = "codegen"
GENERATORS = ("torchgen.gen",)  # the modules whose runs are reused (python -m MODULE ...)
WRAPPER = "python-codegen"  # the wrapper's name under <cache_root>/codegen/bin
_LISTED = re.compile(r'"([^"]+)"')  # the paths a generated_T.cmake lists
# what the key records of the interpreter: its Python's version and PyYAML's (torchgen's parser)
PROBE = "import sys\ntry:\n import yaml; y = yaml.__version__\nexcept ImportError:\n y = None\nprint(sys.version, y)"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of `--name VALUE` (or `--name=VALUE`) in args; None without one."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def _tree(root: Path) -> Iterable[Path]:
    if root.is_dir():
        yield from sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def inputs_of(args: Sequence[str], cwd: Path) -> dict[str, str]:
    """{path: sha256} of everything the generator reads (see the module's docstring)."""
    files: list[Path] = list(_tree(cwd / "torchgen"))
    source = _option(args, "--source-path")
    if source is not None:
        src = cwd / source
        files += [*_tree(src / "templates"), src / "native" / "native_functions.yaml", src / "native" / "tags.yaml"]
    written = [str(cwd / v) for v in (_option(args, "--install_dir"), _option(args, "--output-dependencies")) if v]
    for arg in args:  # other files the command names (an op selection yaml), never its outputs
        value = arg.partition("=")[2] if arg.startswith("--") else arg
        path = cwd / value
        if value and not any(str(path).startswith(w) for w in written) and path.is_file():
            files.append(path)
    found = {}
    for path in files:
        try:
            found[str(path.resolve())] = _sha256(path)
        except OSError:
            found[str(path)] = "missing"
    return dict(sorted(found.items()))


def key_of(python: str, args: Sequence[str], cwd: Path) -> str:
    """The entry's name for one generator run (see the module's docstring)."""
    version = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=False).stdout.strip()
    blob = json.dumps(
        {
            "format": FORMAT,
            "python": [python, version],
            "args": list(args),
            "cwd": str(cwd),
            "inputs": inputs_of(args, cwd),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def outputs_of(args: Sequence[str], cwd: Path) -> list[Path] | None:
    """The files the run wrote: the <prefix>generated_T.cmake lists beside --output-dependencies
    and, unless it was a dry run, the files they list; None without --output-dependencies."""
    deps = _option(args, "--output-dependencies")
    if deps is None:
        return None
    dep = cwd / deps
    lists = sorted(dep.parent.glob(f"*{dep.name}"))
    out = list(lists)
    if "--dry-run" not in args:
        for listing in lists:
            out += [Path(p) for p in _LISTED.findall(listing.read_text(encoding="utf-8"))]
    return sorted(set(out))


class Store:
    """The saved outputs of one generator run: <root>/<key>/outputs.json and files/N."""

    def __init__(self, root: Path, key: str) -> None:
        self.root, self.key = root, key
        self.path = root / key

    def restore(self) -> int | None:
        """Write the saved outputs where the run wrote them (only the changed ones): how many
        were written, None when nothing is saved for the key or the entry is not whole."""
        try:
            data = json.loads((self.path / "outputs.json").read_text(encoding="utf-8"))
            if data["format"] != FORMAT:
                return None
            saved = [(Path(p), self.path / "files" / str(i)) for i, p in enumerate(data["outputs"])]
            blobs = [(p, f.read_bytes()) for p, f in saved]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        written = 0
        for path, blob in blobs:
            try:
                if path.read_bytes() == blob:
                    continue
            except OSError:
                path.parent.mkdir(parents=True, exist_ok=True)
            _replace(path, blob)
            written += 1
        return written

    def save(self, outputs: Sequence[Path]) -> bool:
        """Keep the outputs for the key, atomically; False when another run saved them first."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.key}.", dir=self.root))
        try:
            (tmp / "files").mkdir()
            for i, path in enumerate(outputs):
                shutil.copyfile(path, tmp / "files" / str(i))
            doc = {"format": FORMAT, "outputs": [str(p) for p in outputs]}
            (tmp / "outputs.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.chmod(tmp, 0o777 & ~_umask())
            os.rename(tmp, self.path)
            return True
        except OSError:
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _replace(path: Path, blob: bytes) -> None:
    """path holds blob or what it held before (a temporary file renamed onto it); not fsync'd: a
    build tree's file, thousands of them, and a lost one is generated again."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def run(root: Path, python: str, args: Sequence[str], cwd: Path, say: bool = True) -> int:
    """One interpreter command through the cache: a generator's run is restored or run and
    saved; anything else runs as it is. The command's exit code."""
    if len(args) < 2 or args[0] != "-m" or args[1] not in GENERATORS or _option(args, "--output-dependencies") is None:
        return subprocess.run([python, *args], cwd=cwd, check=False).returncode
    store = Store(root, key_of(python, args, cwd))
    what = f"{args[1]} --generate {_option(args, '--generate')}{' --dry-run' if '--dry-run' in args else ''}"
    try:
        written = store.restore()
    except OSError as exc:  # the tree refused a file: the generator writes them itself
        print(f"torchbuild: code generation not reused ({what}): {exc}")
        written = None
    if written is not None:
        if say:
            print(f"torchbuild: code generation reused ({what}): {written} files written from {store.path}")
        return 0
    code = subprocess.run([python, *args], cwd=cwd, check=False).returncode
    if code == 0:
        outputs = outputs_of(args, cwd) or []
        if all(p.is_file() for p in outputs) and store.save(outputs) and say:
            print(f"torchbuild: code generation saved ({what}): {len(outputs)} files in {store.path}")
    return code


def wrapper_script(root: Path, python: str, step_python: str = sys.executable) -> str:
    """The interpreter CMake runs the generator with: the generator's runs through `run`
    (step_python runs this module), every other command straight to python."""
    gens = "|".join(f'"-m {g}"' for g in GENERATORS)
    return (
        "#!/bin/sh\n"
        "# torchbuild: ATen's code generation through its cache (torchbuild.steps.codegen)\n"
        f'case "$1 $2" in\n'
        f"  {gens}) exec {shlex.quote(step_python)} -m torchbuild.steps.codegen"
        f' --cache {shlex.quote(str(root))} --python {shlex.quote(python)} -- "$@" ;;\n'
        f'  *) exec {shlex.quote(python)} "$@" ;;\n'
        "esac\n"
    )


def hook(cache_root: str | Path, python: str, source: str | Path, write: bool = True) -> dict[str, str]:
    """The environment that makes setup.py's configure of source (a tree with a setup.py and
    cmake/Codegen.cmake) run torchgen through the cache: CMAKE_PROJECT_INCLUDE (setup.py passes
    CMAKE_* variables on to CMake as -D) names
    a file that sets Python_EXECUTABLE to the wrapper, after project(); {} for another tree. The
    wrapper and the file are written atomically under <cache_root>/codegen/bin, named by the
    interpreters (builds with other ones write beside them); not written when write is False."""
    if not all((Path(source) / f).is_file() for f in ("setup.py", "cmake/Codegen.cmake")):
        return {}
    root = Path(cache_root) / DIRNAME
    name = hashlib.sha256(json.dumps([python, sys.executable]).encode()).hexdigest()[:12]
    wrapper, include = root / "bin" / f"{WRAPPER}-{name}", root / "bin" / f"{WRAPPER}-{name}.cmake"
    if not write:
        return {"CMAKE_PROJECT_INCLUDE": str(include)}
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(wrapper, wrapper_script(root, python).encode(), mode=0o755 & ~_umask())
    text = (
        "# torchbuild: ATen's code generation through its cache (torchbuild.steps.codegen)\n"
        f'set(Python_EXECUTABLE "{wrapper}")\n'
    )
    atomic_write_bytes(include, text.encode())
    return {"CMAKE_PROJECT_INCLUDE": str(include)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchbuild.steps.codegen", description=__doc__)
    ap.add_argument("--cache", type=Path, required=True, help="the entries' directory (<cache_root>/codegen)")
    ap.add_argument("--python", required=True, help="the interpreter that runs the generator")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the interpreter's arguments")
    ns = ap.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    return run(ns.cache, ns.python, args, Path.cwd())


if __name__ == "__main__":
    sys.exit(main())
