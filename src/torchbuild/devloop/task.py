"""invoke develop: the tree installed in a venv in development mode (edit, rerun, only the
changed objects recompile)."""

from __future__ import annotations

import dataclasses

from invoke.context import Context

from torchbuild.core.errors import UsageError, writable_dir
from torchbuild.core.options import option
from torchbuild.core.problems import Problems
from torchbuild.core.safeio import user_path
from torchbuild.devloop.host import develop_with
from torchbuild.profile.config import cache_dir
from torchbuild.runtime.options import NOT_COMPILE_OPTIONS, BuildOptions
from torchbuild.runtime.tasks import Launch, launch_task


@dataclasses.dataclass(frozen=True)
class DevelopTree:
    """`invoke develop`'s own options: the tree and the venv it goes into (--jobs and --no-retry are BuildOptions')."""

    source: str = option("", "the tree to install in development mode (a PyTorch checkout, or any setup.py project)")
    venv: str = option(
        "", "the venv to install into (made if missing; default <cache_dir>/venvs/develop-<profile>-<tree>-<hash>)"
    )


@launch_task(models={"given": DevelopTree, "options": BuildOptions}, exclude=NOT_COMPILE_OPTIONS)
def develop(c: Context, launch: Launch, given: DevelopTree, *, options: BuildOptions, problems: Problems) -> None:
    """Install a tree in a venv in development mode (pip install -e, setup.py develop before 2.8); prints the venv's path."""
    if not given.source:
        raise UsageError(
            "--source is required", hint="invoke develop --source ~/dev/pytorch (`invoke source --dest` fetches one)"
        )
    # every local check (--jobs, the profile, the engine, the cache, then develop_with's: the
    # tree and the venv), all failures named at once
    spec = problems.check(launch.spec)
    backend = problems.check(lambda: launch.backend(spec)) if spec else None
    cache = problems.check(lambda: writable_dir(cache_dir(spec), "cache_dir")) if spec else None
    if not (spec and backend and cache):
        problems.raise_any()
    assert spec and backend and cache
    develop_with(
        spec,
        backend,
        user_path(given.source).absolute(),
        user_path(given.venv) if given.venv else None,
        cache,
        jobs=options.jobs,
        oom_retry=options.oom_retry,
        problems=problems,
    )
