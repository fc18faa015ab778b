"""invoke bench: torchbench installed against the built torch (which stays), then run."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from invoke.context import Context

from torchbuild.bench.step import DEFAULT_REPO, Request, check_venv
from torchbuild.core import records
from torchbuild.core.errors import SourceError, UsageError, writable_dir
from torchbuild.core.options import option
from torchbuild.core.problems import Problems
from torchbuild.core.safeio import user_path
from torchbuild.profile.config import cache_dir
from torchbuild.runtime.backends import Backend, Binds
from torchbuild.runtime.tasks import Launch, launch_task
from torchbuild.source.fetch import describe_dir, fetch_git, looks_like_url


@dataclass(frozen=True)
class BenchFlags:
    """`invoke bench`'s own flags (the launch options' come with @launch_task): the venv, the benchmark tree,
    the install and what to run."""

    venv: str = option(
        "", "the venv with the built torch (the prefix of `invoke install`, or the venv `invoke develop` printed)"
    )
    benchmark: str = option("", f"torchbench: a local tree or a git URL (default {DEFAULT_REPO})")
    ref: str = option("main", "git ref of a --benchmark URL (default main)")
    model: tuple[str, ...] = option(
        (), "a model for torchbench's install.py (repeatable; default: what install.py installs by default)"
    )
    no_install: bool = option(False, "skip the install (it is there already)")
    script: str = option("run.py", "the script --args are given to (default run.py)")
    args: str = option(
        "", "arguments for the script, one shell-quoted string (e.g. 'resnet50 -d cpu -t eval'); empty: install only"
    )


@launch_task(models={"given": BenchFlags})
def bench(c: Context, launch: Launch, given: BenchFlags) -> None:
    """Install torchbench against the built torch without letting pip replace it, and run it with --args."""
    if not given.venv:
        raise UsageError("--venv is required", hint="invoke bench --venv ~/envs/torch-2.6 --args 'resnet50 -d cpu'")
    origin = given.benchmark or DEFAULT_REPO
    checked = _check_local(launch, given.venv, given.args, origin, given.script)
    tree = _benchmark_tree(origin, given.ref, checked)
    cache, prefix = checked.cache, checked.prefix
    # the venv and the tree at their own paths (a venv is not relocatable)
    binds = Binds(cache=cache, out=writable_dir(cache / "bench", "cache_dir"), extra=(tree, prefix))
    req = _request(checked, tree, install=not given.no_install, model=given.model, script=given.script)
    checked.backend.run("bench", records.to_dict(req), binds)


def _request(checked: _Checked, tree: Path, *, install: bool, model: tuple[str, ...], script: str) -> Request:
    """The bench step's request: the venv, the tree, whether to install (with which models), and what to run."""
    return Request(
        venv=str(checked.prefix),
        benchmark=str(tree),
        install=install,
        install_args=model,
        script=script,
        args=checked.words,
    )


@dataclass(frozen=True)
class _Checked:
    """What bench checked before the clone: the venv, --args' words, the tree and where it comes from, the backend
    and the cache."""

    prefix: Path
    words: tuple[str, ...]
    local: Path
    remote: bool
    backend: Backend
    cache: Path


def _check_local(launch: Launch, venv: str, args: str, origin: str, script: str) -> _Checked:
    """Check everything local (the venv, --args, a local tree, the profile, the engine, the cache), all of it
    named at once."""
    problems = Problems()
    prefix = user_path(venv).absolute()
    problems.check(lambda: check_venv(prefix))
    words = problems.check(lambda: _words(args))
    local = user_path(origin).absolute()
    remote = looks_like_url(origin) and not local.is_dir()
    tree_ok = not remote and problems.check(lambda: describe_dir(local)) is not None
    if tree_ok and words and not (local / script).is_file():
        problems.add(SourceError(f"{local} has no {script}: is it a torchbench checkout?"))
    spec = problems.check(launch.spec)
    backend = problems.check(lambda: launch.backend(spec)) if spec else None
    if backend:
        problems.check(backend.check)
    cache = problems.check(lambda: writable_dir(cache_dir(spec), "cache_dir")) if spec else None
    problems.raise_any()
    assert backend is not None and cache is not None and words is not None
    return _Checked(prefix, words, local, remote, backend, cache)


def _benchmark_tree(origin: str, ref: str, checked: _Checked) -> Path:
    """The local tree, or a URL's clone in the cache (cloned once per ref)."""
    if not checked.remote:
        return checked.local
    tree = checked.cache / "src" / f"benchmark-{ref.replace('/', '_')}"
    if not tree.is_dir():
        fetch_git(origin, ref, tree, checked.cache)
    return tree


def _words(args: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(args))
    except ValueError as exc:
        raise UsageError(f"--args {args!r} is not shell-quoted text ({exc})", hint="quote it as one string") from None
