"""MkDocs hook: the parts of the documentation that the code already says, generated at build time.

A page asks for a generated part with a comment on a line of its own:

    <!-- generated: profile-keys -->          the key reference, from torchbuild.profile.keys
    <!-- generated: errors -->                the error table, from torchbuild.core.errors.ERRORS
    <!-- generated: help TASK -->             `invoke --help TASK`, from the task collection
    <!-- generated: spread-model twice -->    the on-paper spread tables of benchmarks/spread_nodes.py
    <!-- generated: spread-model once -->     (ccache's run_second_cpp on, as built today / off)
    <!-- generated: official-wheels -->       the official wheels `invoke doctor --profile` compares with

and CHANGELOG.md at the repository's root becomes the page changelog.md. An unknown name fails
the build. Nothing here is hand-maintained text: a new profile key, error class or task option
reaches the site on the next `mkdocs build` (tests/unit/test_docs.py and
tests/integration/test_docs_site.py check that it does).

Kept as a hook rather than a plugin package (mkdocs-gen-files, mkdocs-macros): four small
substitutions need no templating language, and the hook imports torchbuild directly.
The functions below need no MkDocs, so unit tests call them without building the site.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"^<!-- generated: (?P<name>[a-z-]+)(?: (?P<arg>[a-z0-9.-]+))? -->$", re.M)


def profile_keys(_: str | None = None) -> str:
    """Every profile key with its type, default and doc (what `invoke config --keys` prints)."""
    from torchbuild.profile.config import describe_keys

    return describe_keys()


def _doc(cls: type) -> str:
    """A class docstring as one Markdown table cell (reST ``code`` to Markdown `code`)."""
    text = " ".join((cls.__doc__ or "").split())
    return text.replace("``", "`").replace("|", "\\|")


def errors(_: str | None = None) -> str:
    """The named errors by exit code: what each means and the hint printed with it by default."""
    from torchbuild.core.errors import ERRORS, TorchbuildError

    rows = ["| error | exit | meaning | default hint |", "|---|---|---|---|"]
    order = sorted(ERRORS, key=lambda c: (c.exit_code, ERRORS.index(c)))
    for cls in order:
        meaning = _doc(cls)
        parent = cls.__mro__[1]
        if parent is not TorchbuildError:
            meaning += f" A kind of `{parent.__name__}`, with its exit code."
        hint = " ".join(cls.default_hint.split()).replace("|", "\\|")
        rows.append(f"| `{cls.__name__}` | {cls.exit_code} | {meaning} | {hint} |")
    return "\n".join(rows)


def task_help(task: str | None) -> str:
    """`invoke --help TASK` as the command prints it (80 columns: no terminal here)."""
    from invoke.program import Program

    from torchbuild.tasks import ns

    if task not in ns.task_names:
        raise ValueError(f"generated: help {task}: no such task (invoke --list)")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        Program(namespace=ns, name="invoke", binary="invoke").run(["invoke", "--help", task], exit=False)
    return "```text\n$ invoke --help " + task + "\n" + out.getvalue().rstrip() + "\n```"


def _spread_bench() -> Any:
    name = "torchbuild_docs_spread_nodes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "spread_nodes.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def spread_model(passes: str | None) -> str:
    """The model's table for PyTorch 2.6 on N nodes of M cores: `twice` as the build runs today
    (ccache preprocesses, then distcc again), `once` with ccache's run_second_cpp off."""
    import dataclasses

    bench = _spread_bench()
    if passes not in ("twice", "once"):
        raise ValueError(f"generated: spread-model {passes}: say twice or once")
    model = bench.PYTORCH_26 if passes == "twice" else dataclasses.replace(bench.PYTORCH_26, preprocess_passes=1)
    return str(bench.format_table(bench.paper_table(model, overhead_s=bench.MEASURED_OVERHEAD_S)))


def official_wheels(_: str | None = None) -> str:
    """torchbuild's table of PyTorch's official Linux wheels per line (torchbuild.profile.official_wheels),
    then each CUDA wheel's arch list."""
    from torchbuild.profile import official_wheels as ow

    def cudas(wheels: Any) -> str:
        return ", ".join(w.cuda for w in wheels if w.cuda) or "none"

    rows = ["| torch | Python | glibc | x86_64 CUDA | aarch64 CUDA |", "|---|---|---|---|---|"]
    for line in ow.LINES:
        span = f"{line.python_min} to {line.python_max}"
        rows.append(f"| {line.torch} | {span} | {line.glibc} | {cudas(line.x86_64)} | {cudas(line.aarch64)} |")
    first: dict[tuple[str, str, str], str] = {}  # (arch, CUDA, arch list) -> the first line with it
    for line in ow.LINES:
        for arch, wheels in (("x86_64", line.x86_64), ("aarch64", line.aarch64)):
            for w in wheels:
                if w.cuda:
                    first.setdefault((arch, w.cuda, ";".join(w.archs)), line.torch)
    archs = ["| arch | CUDA | TORCH_CUDA_ARCH_LIST | from torch |", "|---|---|---|---|"]
    archs += [f"| {arch} | {cuda} | {listed} | {torch} |" for (arch, cuda, listed), torch in first.items()]
    return "\n".join(rows) + "\n\nEvery CPU wheel exists on both arches. Arch lists:\n\n" + "\n".join(archs)


GENERATORS: dict[str, Callable[[str | None], str]] = {
    "profile-keys": profile_keys,
    "errors": errors,
    "help": task_help,
    "spread-model": spread_model,
    "official-wheels": official_wheels,
}


def render(markdown: str) -> str:
    """The page with every placeholder replaced by what it names."""

    def one(match: re.Match[str]) -> str:
        generator = GENERATORS.get(match["name"])
        if generator is None:
            raise ValueError(f"unknown generated part {match['name']!r}: one of {', '.join(GENERATORS)}")
        return generator(match["arg"])

    return PLACEHOLDER.sub(one, markdown)


def changelog() -> str:
    """CHANGELOG.md as a page of the site."""
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


# --- MkDocs event handlers ---------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, "changelog.md", content=changelog()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)
